"""Frequency eviction of the substitution study: evict the resident expert the
router has requested least so far. Counts persist across evictions (they count
router requests, resident or not); an optional half-life in tokens decays old
requests exponentially. Ties go to the least recently used."""

from numba import njit

NAME = "freq"
STRUCTURE = "heap"
USES_SCORE = True  # the kernel keeps the decayed request score up to date
DOC = "fewest router requests so far, counts persist across evictions; freq:H decays with half-life H tokens"


@njit(inline="always")
def priority(count, score, next_req):
    return score
