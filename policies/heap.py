"""Hooks shared by the policies that evict the lowest priority: an indexed 4-ary min-heap per pool
on (priority, last-use tick), so ties always go to the least recently used. A heap policy's module
defines ``priority(prm, count, score, next_req)`` and takes its hooks from ``hooks(priority)``.

``count`` is the expert's requests while cached (1 on insertion, +1 per request hit, reset on
eviction), ``score`` its decayed router-request score (kept only for USES_SCORE policies) and
``next_req`` the tick of its next router request (kept only for USES_NEXT_REQUEST policies)."""

import numpy as np
from numba import njit

from moesim.policies.structures import (
    CAP,
    CNT,
    HBASE,
    HK1,
    HOBJ,
    HPOS,
    HSIZE,
    NREQ,
    RES,
    SCORE,
    SIZE,
    heap_rekey,
    heap_sift,
)


def hooks(priority):
    """(hit, insert, rekey) hooks for the heap policy with this priority function."""

    @njit(inline="always")
    def hit(ob, fo, po, heap, prm, pool, o, tick, requested):
        if requested:
            ob[o, CNT] += 1
        heap_rekey(ob, po, heap, pool, ob[o, HPOS], priority(prm, ob[o, CNT], fo[o, SCORE], fo[o, NREQ]), tick)

    @njit(inline="always")
    def insert(ob, fo, po, heap, prm, pool, o, tick):
        full = po[pool, SIZE] >= po[pool, CAP]
        ob[o, RES] = 1
        ob[o, CNT] = 1
        base = po[pool, HBASE]
        v = -1
        if full:  # o takes the root's place (the victim), then sinks
            j = base
            v = np.int64(heap[j, HOBJ])
            ob[v, HPOS] = -1
        else:
            j = base + po[pool, HSIZE]
            po[pool, HSIZE] += 1
        heap_sift(ob, heap, base, base + po[pool, HSIZE], j, priority(prm, 1, fo[o, SCORE], fo[o, NREQ]), tick, o)
        if full:
            ob[v, RES] = 0
            ob[v, CNT] = 0
        else:
            po[pool, SIZE] += 1
        return v

    @njit(inline="always")
    def rekey(ob, fo, po, heap, prm, pool, o):
        """Recompute a resident expert's priority in place (after all scores were rescaled by a
        common factor, which keeps the heap order)."""
        if ob[o, HPOS] >= 0:
            heap[po[pool, HBASE] + ob[o, HPOS], HK1] = priority(prm, ob[o, CNT], fo[o, SCORE], fo[o, NREQ])

    return hit, insert, rekey
