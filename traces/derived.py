"""Arrays derived from a decoded routing that replays read: each request's next request of the
same expert. Jitted (numba is imported only when a replay asks for them; see Routing.next_requests)."""

import numpy as np
from numba import njit

NEVER = np.int64(1) << np.int64(62)  # an expert that is never requested again


@njit(cache=True)
def next_requests(sel, n_experts):
    """For each request (t, l, r), the position of the same (layer, expert)'s next request in the
    replay order (token, layer, rank), flattened as (t * L + l) * k + r; NEVER if there is none.
    Also each object's (layer * E + expert) first request position. Negative ids are padding."""
    T, L, k = sel.shape
    nxt = np.full((T, L, k), NEVER, np.int64)
    last = np.full(L * n_experts, NEVER, np.int64)
    for t in range(T - 1, -1, -1):
        for l in range(L - 1, -1, -1):
            for r in range(k - 1, -1, -1):
                if sel[t, l, r] < 0:
                    continue
                o = l * n_experts + sel[t, l, r]
                nxt[t, l, r] = last[o]
                last[o] = (t * L + l) * k + r
    return nxt, last
