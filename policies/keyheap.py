"""Hooks shared by the policies that evict the lowest of one int64 key per resident expert, a key no
other resident expert of the pool shares (Belady: minus the next request tick, unique since a tick is
one request; an expert never requested again ranks below every other, the least recently used first).

The same indexed 4-ary min-heap per pool as policies/heap.py, in the same rows of the heap array, but
each row viewed as int64 (key, last-use tick, object): a sift compares one integer a level instead of
a (priority, tick) pair of floats, and moves no float-to-int conversions. A keyed policy writes
``key(prm, next_req, tick)`` and takes ``hit, insert = keyheap.hooks(key)``; a use moves the expert only the
way its key moved.

--step-pin (simulator/step_pin.py) gives a pinned expert the key PINNED + its last-use tick, above every
unpinned key, so the pinned keep least-recently-used order among themselves as the float heap's
(inf, tick) rows do, and gives it its own back at the step's end.
"""

import numpy as np
from numba import njit

from moesim.jitcache import cached_njit
from moesim.policies.structures import CAP, HBASE, HK1, HK2, HOBJ, HPOS, HSIZE, NREQ, RES, SIZE

KEY, TICK, OBJ = HK1, HK2, HOBJ  # a row's columns, read as int64
PINNED = np.int64(1) << np.int64(61)  # a pinned expert's key: PINNED + its last-use tick (ticks < 2^53)
PINNED_MIN = np.int64(1) << np.int64(60)  # keys at or above are pinned; a policy's keys stay below


@njit(inline="always")
def _place(h, ob, base, j, key, tick, o):
    h[j, KEY] = key
    h[j, TICK] = tick
    h[j, OBJ] = o
    ob[o, HPOS] = j - base


@njit(inline="always")
def _up(h, ob, base, j, key):
    """Move the hole at row j up until key fits; returns the row where it goes. (Moves written out, not
    inlined helpers: numba copies an inlined function's IR at every call site, which is compile time.)"""
    while j > base:
        p = base + (j - base - 1) // 4
        if key < h[p, KEY]:
            h[j, KEY] = h[p, KEY]
            h[j, TICK] = h[p, TICK]
            x = h[p, OBJ]
            h[j, OBJ] = x
            ob[x, HPOS] = j - base
            j = p
        else:
            break
    return j


@njit(inline="always")
def _down(h, ob, base, end, j, key):
    """Move the hole at row j down until key fits; returns the row where it goes. A node with four
    children picks the least by selects, not branches (which child wins is a coin toss)."""
    while True:
        first = base + 4 * (j - base) + 1
        if first + 3 < end:
            k0 = h[first, KEY]
            k1 = h[first + 1, KEY]
            k2 = h[first + 2, KEY]
            k3 = h[first + 3, KEY]
            a = first + 1 if k1 < k0 else first
            ka = min(k0, k1)
            b = first + 3 if k3 < k2 else first + 2
            kb = min(k2, k3)
            c = b if kb < ka else a
            kc = min(ka, kb)
        elif first < end:
            c = first
            kc = h[first, KEY]
            for x in range(first + 1, end):
                if h[x, KEY] < kc:
                    c = x
                    kc = h[x, KEY]
        else:
            break
        if kc < key:
            h[j, KEY] = kc
            h[j, TICK] = h[c, TICK]
            x = h[c, OBJ]
            h[j, OBJ] = x
            ob[x, HPOS] = j - base
            j = c
        else:
            break
    return j


@cached_njit(_nrt=False)
def _set_key_called(ob, po, heap, pool, o, key, tick):
    """set_key called, not inlined: a use that keeps or raises a key is rare (Belady: a substitute run of
    an expert never requested again), and the sift-down it needs, inlined in the kernel's hit path,
    made the common hit slower."""
    set_key(ob, po, heap, pool, o, key, tick)


@njit(inline="always")
def set_key(ob, po, heap, pool, o, key, tick):
    """Give resident o the key and last-use tick and restore heap order, moving only the way the key moved."""
    h = heap.view(np.int64)
    base = po[pool, HBASE]
    j = base + ob[o, HPOS]
    old = h[j, KEY]
    if key < old:
        j = _up(h, ob, base, j, key)
    elif key > old:
        j = _down(h, ob, base, base + po[pool, HSIZE], j, key)
    _place(h, ob, base, j, key, tick, o)


def rekey_hook(key):
    """The rekey hook of the keyed heap policy with this key function: a resident expert's key recomputed from its
    next request (rerouting moved it: the router's request of it at this step passed), its last-use tick kept."""

    @njit(inline="always")
    def rekey(ob, fo, po, heap, prm, pool, o):
        h = heap.view(np.int64)
        tick = h[po[pool, HBASE] + ob[o, HPOS], TICK]
        _set_key_called(ob, po, heap, pool, o, key(prm, np.int64(fo[o, NREQ]), tick), tick)

    return rekey


def hooks(key):
    """(hit, insert) hooks for the keyed heap policy with this key function."""

    @njit(inline="always")
    def hit(ob, fo, po, heap, prm, pool, o, tick, requested):
        k = key(prm, np.int64(fo[o, NREQ]), tick)
        h = heap.view(np.int64)
        base = po[pool, HBASE]
        j = base + ob[o, HPOS]
        if k < h[j, KEY]:  # the common case (Belady: a request moves the next one later)
            _place(h, ob, base, _up(h, ob, base, j, k), k, tick, o)
        else:
            _set_key_called(ob, po, heap, pool, o, k, tick)

    @njit(inline="always")
    def insert(ob, fo, po, heap, prm, pool, o, tick):
        h = heap.view(np.int64)
        base = po[pool, HBASE]
        k = key(prm, np.int64(fo[o, NREQ]), tick)
        ob[o, RES] = 1
        v = -1
        if po[pool, SIZE] >= po[pool, CAP]:  # o takes the root's place (the victim), then sinks
            v = h[base, OBJ]
            ob[v, HPOS] = -1
            ob[v, RES] = 0
            j = _down(h, ob, base, base + po[pool, HSIZE], base, k)
        else:
            j = _up(h, ob, base, base + po[pool, HSIZE], k)
            po[pool, HSIZE] += 1
            po[pool, SIZE] += 1
        _place(h, ob, base, j, k, tick, o)
        return v

    return hit, insert


# --step-pin (simulator/step_pin.py); ``spin[o, 1]`` (float64) holds the saved key's bits


@njit(inline="always")
def pin(ob, po, heap, pool, o, spin):
    """Raise resident o above every unpinned expert, saving its key."""
    h = heap.view(np.int64)
    j = po[pool, HBASE] + ob[o, HPOS]
    spin.view(np.int64)[o, 1] = h[j, KEY]
    _set_key_called(ob, po, heap, pool, o, PINNED + h[j, TICK], h[j, TICK])


@njit(inline="always")
def unpin(ob, po, heap, pool, o, spin):
    """Give resident o its saved key back unless a use re-keyed it since it was pinned."""
    h = heap.view(np.int64)
    j = po[pool, HBASE] + ob[o, HPOS]
    if h[j, KEY] >= PINNED_MIN:
        _set_key_called(ob, po, heap, pool, o, spin.view(np.int64)[o, 1], h[j, TICK])


@njit(inline="always")
def root_pinned(po, heap, pool):
    """Is every resident expert of the (full) pool pinned?"""
    return heap.view(np.int64)[po[pool, HBASE], KEY] >= PINNED_MIN
