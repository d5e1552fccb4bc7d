"""Arrays derived from a decoded routing that replays read: each request's next request of the
same expert, as a tick of the replay's clock of events. Jitted (numba is imported only when a replay
asks for them; see Routing.next_requests).

Ticks order every event of a replay: step s = t * L + l (token t, MoE layer l) owns the ticks
[s (E + k), (s + 1)(E + k)); its background admissions take s (E + k) + i and its requests
s (E + k) + E + rank."""

import numpy as np

from moesim.jitcache import cached_njit
from moesim.ticks import NEVER


@cached_njit()
def next_ticks(sel, n_experts, t0, last, nxt):
    """Fill ``nxt`` [T, L, k] with the tick of the same (layer, expert)'s next request for each request
    of ``sel`` (tokens t0 .. t0 + T - 1 of the trace), NEVER if there is none, walking backwards.
    ``last`` [L * E] holds each object's (layer * E + expert) first request tick after this block (NEVER:
    none) and is left holding its first request tick from t0 on: called on the blocks of a trace from
    the last to the first, it carries the next requests across blocks. Negative ids are padding."""
    T, L, k = sel.shape
    span = n_experts + k
    for t in range(T - 1, -1, -1):
        for l in range(L - 1, -1, -1):
            tick0 = ((t0 + t) * L + l) * span + n_experts
            for r in range(k - 1, -1, -1):
                if sel[t, l, r] < 0:
                    nxt[t, l, r] = NEVER
                    continue
                o = l * n_experts + sel[t, l, r]
                nxt[t, l, r] = last[o]
                last[o] = tick0 + r


def next_requests(sel, n_experts):
    """(next [T, L, k], first [L * E]) ticks of a whole routing (see next_ticks)."""
    nxt = np.empty(sel.shape, np.int64)
    last = np.full(sel.shape[1] * n_experts, NEVER, np.int64)
    next_ticks(sel, n_experts, 0, last, nxt)
    return nxt, last
