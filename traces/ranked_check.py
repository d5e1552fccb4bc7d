"""The checks of ranked candidate rows, jitted: one pass over ids and scores, where numpy's row sort and
comparisons cost ~1.5 s of CPU per 20,000 Qwen3-235B tokens (1.9M rows) on the writer's and the reader's
path. Cached by numba per component (moesim/jitcache.py)."""

import numpy as np

from moesim.jitcache import cached_njit


@cached_njit(nogil=True)
def first_bad_rows(ids, scores, n_experts, ties_by_id):
    """(the first row of ids [n, M] with an id outside 0..n_experts-1 or one repeated, the first row whose
    selection scores [n, M] are not in rank order: a score above the one before it, or with ``ties_by_id``
    an equal score with a lower id), each n when there is none. ``scores`` may be empty (no order check)."""
    n, m = ids.shape
    stamp = np.zeros(n_experts, np.int64)  # row + 1 that last held each expert: no clearing between rows
    bad_id = n
    for i in range(n):
        for r in range(m):
            e = ids[i, r]
            if e < 0 or e >= n_experts or stamp[e] == i + 1:
                bad_id = i
                break
            stamp[e] = i + 1
        if bad_id < n:
            break
    bad_order = n
    if scores.shape[0] == n:
        for i in range(n):
            for r in range(1, m):
                a, b = scores[i, r - 1], scores[i, r]
                if b > a or (ties_by_id and b == a and ids[i, r] < ids[i, r - 1]):
                    bad_order = i
                    break
            if bad_order < n:
                break
    return bad_id, bad_order
