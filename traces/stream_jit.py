"""The jitted passes of a streamed trace (traces/stream.py): next requests as compact distances,
written by a reverse pass over the chunks, and turned back into ticks (traces/derived.py) chunk by chunk."""

import numpy as np

from moesim.jitcache import cached_njit
from moesim.ticks import NEVER

NO_NEXT = np.uint32(0xFFFFFFFF)


@cached_njit()
def next_distances(sel, n_experts, t0, last_t, last_r, out):
    """For each request of ``sel`` (tokens t0 .. t0 + T - 1), the distance to the same (layer, expert)'s
    next request: (tokens ahead) * k + its rank, NO_NEXT for none. ``last_t``/``last_r`` [L * E] hold
    each object's first request after this block (token, rank; token -1: none) and are left holding
    its first request from t0 on: call it on the blocks from the last to the first."""
    T, L, k = sel.shape
    for t in range(T - 1, -1, -1):
        tg = t0 + t
        for l in range(L - 1, -1, -1):
            for r in range(k - 1, -1, -1):
                e = sel[t, l, r]
                if e < 0:
                    out[t, l, r] = NO_NEXT
                    continue
                o = l * n_experts + e
                if last_t[o] < 0:
                    out[t, l, r] = NO_NEXT
                else:
                    out[t, l, r] = (last_t[o] - tg) * k + last_r[o]
                last_t[o] = tg
                last_r[o] = r


@cached_njit()
def ticks_from_distances(dist, t0, n_experts, out):
    """The next-request ticks of a chunk (tokens t0 ..) from its distances."""
    T, L, k = dist.shape
    span = n_experts + k
    for t in range(T):
        for l in range(L):
            for r in range(k):
                d = dist[t, l, r]
                if d == NO_NEXT:
                    out[t, l, r] = NEVER
                else:
                    dt = np.int64(d) // k
                    out[t, l, r] = ((t0 + t + dt) * L + l) * span + n_experts + (np.int64(d) - dt * k)


@cached_njit()
def first_ticks(last_t, last_r, L, n_experts, k):
    """Each object's first request tick from the reverse pass's final (token, rank)."""
    out = np.empty(last_t.shape[0], np.int64)
    for o in range(last_t.shape[0]):
        if last_t[o] < 0:
            out[o] = NEVER
        else:
            out[o] = (last_t[o] * L + o // n_experts) * (n_experts + k) + n_experts + last_r[o]
    return out
