"""Frequency eviction of the substitution study: evict the resident expert the
router has requested least so far. Counts persist across evictions (they count
router requests, resident or not); an optional half-life in tokens decays old
requests exponentially. Ties go to the least recently used."""

from numba import njit

from moesim.policies import heap
from moesim.policies.params import Param

NAME = "freq"
DOC = "fewest router requests so far, counts persist across evictions; freq:H decays with half-life H tokens"
IN_DEFAULT_GRID = True
USES_SCORE = True  # the kernel keeps the decayed request score; its half-life is the parameter
PARAM = Param("half_life", "H", "a positive half-life in tokens", integer=False, default=0.0)


@njit(inline="always")
def priority(prm, count, score, next_req):
    return score


hit, insert, rekey = heap.hooks(priority)
