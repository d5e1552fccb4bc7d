"""Float-heap operations the custom frequency-with-age policies share (lfuda, lcp, lfru): each keeps its
residents in the pool's 4-ary min-heap of (priority, tie key, object) rows (policies/structures.py), with
priorities of its own that need the pool's state or the token, so it cannot be a heap.py ``priority``."""

import numpy as np
from numba import njit

from moesim.policies.kinds import N_OWN
from moesim.policies.structures import CAP, HBASE, HK1, HK2, HOBJ, HPOS, HSIZE, RES, SIZE, heap_rekey, heap_sift

TOKEN_SLOT = N_OWN - 1  # policies/registry.py TOKEN_SLOT: the ticks of one token (USES_TOKEN policies)


@njit(inline="always")
def token_of(prm, tick):
    """The token of a use at ``tick`` (-1 for the warm set's negative ticks)."""
    return np.int64(tick) // np.int64(prm[TOKEN_SLOT]) if tick >= 0 else np.int64(-1)


@njit(inline="always")
def rekey(ob, po, heap, pool, o, k1, k2):
    heap_rekey(ob, po, heap, pool, ob[o, HPOS], k1, k2)


@njit(inline="always")
def key_of(ob, po, heap, pool, o):
    """Resident o's priority and tie key."""
    j = po[pool, HBASE] + ob[o, HPOS]
    return heap[j, HK1], heap[j, HK2]


@njit(inline="always")
def root_priority(po, heap, pool):
    return heap[po[pool, HBASE], HK1]


@njit(inline="always")
def insert(ob, po, heap, pool, o, k1, k2):
    """Make o resident with keys (k1, k2); a full pool's victim is the root, whose row o takes. Returns the
    victim or -1."""
    full = po[pool, SIZE] >= po[pool, CAP]
    base = po[pool, HBASE]
    v = -1
    if full:
        j = base
        v = np.int64(heap[j, HOBJ])
        ob[v, HPOS] = -1
        ob[v, RES] = 0
    else:
        j = base + po[pool, HSIZE]
        po[pool, HSIZE] += 1
        po[pool, SIZE] += 1
    heap_sift(ob, heap, base, base + po[pool, HSIZE], j, k1, k2, o)
    ob[o, RES] = 1
    return v
