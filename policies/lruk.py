"""LRU-K exactly as libCacheSim 0.3.5's LRUK (its cpp/LRU_K.cpp; O'Neil, O'Neil & Weikum 1993).

Each cached expert's last K uses are kept while it is cached (forgotten when it
is evicted). An expert used fewer than K times since its insertion waits in a
FIFO (list 0, newest insertion at the head) and is evicted first, the oldest
insertion first; the others are kept in the pool's keyed heap by the tick of
their K-th most recent use, and the oldest of those is evicted when the FIFO is
empty. K = 1 is LRU. A use is a request hit, an insertion or a run as a
substitute; the tick orders uses as libCacheSim's request counter does (each use
its own tick, so no two keys tie).

``CNT`` counts the uses kept (at most K), ``P0`` and ``P1`` hold the last two
use ticks (so K is at most 3), and the heap row holds the key (policies/keyheap.py
layout). A miss that is not fetched changes nothing, as libCacheSim only learns
of uses of cached objects."""

import numpy as np
from numba import njit

from moesim.jitcache import cached_njit
from moesim.policies.keyheap import KEY, OBJ, TICK, _down, _place, _up, set_key
from moesim.policies.params import Param
from moesim.policies.structures import (
    CAP,
    CNT,
    HBASE,
    HPOS,
    HSIZE,
    LEN,
    P0,
    P1,
    RES,
    SIZE,
    TAIL,
    list_push_front,
    list_unlink,
)

NAME = "lruk"
LIBCACHESIM = "LRUK"  # the libCacheSim 0.3.5 class with the same semantics under fetch-all (the tests' oracle)
DOC = ("LRU-K (libCacheSim LRUK): evict experts used fewer than K times first (FIFO), then the oldest K-th "
       "most recent use; lruk:K, K = 1..3, default 2")
PARAM = Param("k", "K", "a whole number of uses from 1 to 3", integer=True, default=2.0, maximum=3.0)
K_SLOT = 0
FIFO = 0


@njit(inline="always")
def _push(ob, po, heap, pool, o, key, tick):
    h = heap.view(np.int64)
    base = po[pool, HBASE]
    j = _up(h, ob, base, base + po[pool, HSIZE], key)
    po[pool, HSIZE] += 1
    _place(h, ob, base, j, key, tick, o)


@njit(inline="always")
def _pop_root(ob, po, heap, pool):
    h = heap.view(np.int64)
    base = po[pool, HBASE]
    v = h[base, OBJ]
    ob[v, HPOS] = -1
    n = po[pool, HSIZE] - 1
    po[pool, HSIZE] = n
    if n > 0:  # the last row fills the root's hole, then sinks
        lk, lt, lo = h[base + n, KEY], h[base + n, TICK], h[base + n, OBJ]
        _place(h, ob, base, _down(h, ob, base, base + n, base, lk), lk, lt, lo)
    return v


@cached_njit(_nrt=False)
def _hit(ob, fo, po, heap, prm, pool, o, tick):
    k = int(prm[K_SLOT])
    if k == 1:
        set_key(ob, po, heap, pool, o, tick, tick)
        return
    n = ob[o, CNT]
    if n + 1 >= k:  # the window is full: its oldest use (the K-th most recent) is the key
        key = np.int64(fo[o, P0] if k == 2 else fo[o, P1])
        if n < k:  # its K-th use: from the FIFO into the heap
            list_unlink(ob, po, pool, o, FIFO)
            _push(ob, po, heap, pool, o, key, tick)
        else:
            set_key(ob, po, heap, pool, o, key, tick)
    fo[o, P1] = fo[o, P0]
    fo[o, P0] = tick
    ob[o, CNT] = min(n + 1, k)


# out of line: inlining this body into the kernel doubled its cold compile time
@cached_njit(_nrt=False)
def _insert(ob, fo, po, heap, prm, pool, o, tick):
    v = -1
    if po[pool, SIZE] >= po[pool, CAP]:
        if po[pool, LEN + 3 * FIFO] > 0:
            v = po[pool, TAIL + 3 * FIFO]
            list_unlink(ob, po, pool, v, FIFO)
        else:
            v = _pop_root(ob, po, heap, pool)
        ob[v, RES] = 0
    else:
        po[pool, SIZE] += 1
    ob[o, CNT] = 1
    fo[o, P0] = tick
    if int(prm[K_SLOT]) == 1:
        _push(ob, po, heap, pool, o, np.int64(tick), tick)
    else:
        list_push_front(ob, po, pool, o, FIFO)
    ob[o, RES] = 1
    return v


@njit(inline="always")
def insert(ob, fo, po, heap, prm, pool, o, tick):
    return _insert(ob, fo, po, heap, prm, pool, o, tick)


@njit(inline="always")
def hit(ob, fo, po, heap, prm, pool, o, tick, requested):
    _hit(ob, fo, po, heap, prm, pool, o, tick)
