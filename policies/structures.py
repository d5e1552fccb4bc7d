"""The cache's state in four packed arrays, and the list and heap operations on it.

Experts are objects ``o = layer * E + expert``; pools are per-layer caches or one
global cache. Packing the per-object fields into one row (a cache line) keeps
memory traffic low, and lets the hot-loop helpers take four arrays instead of
twenty: numba passes every array as ~7-9 machine words per call.

- ``objs`` int32 [objects, N_OB]: list links, heap position, per-policy counter,
  resident flag, copy-queued flag, the host-RAM tier's list links and resident
  flag, and which of its pool's lists the object is linked in;
- ``objf`` float64 [objects, N_FO]: decayed request score, admission accumulator,
  next-request tick, step mark;
- ``pools`` int64 [pools + 1, N_PO]: capacity, occupancy, heap size/base, up to
  four linked lists (head, tail, length) and four per-pool policy scalars; the
  last row is the host-RAM tier (an LRU list over all layers, list 0);
- ``heap`` float64 [sum of capacities, 3]: each pool's min-heap of (priority,
  last-use tick, object) rows, keys stored in the heap itself so that sifting reads
  contiguous memory (ticks and ids are exact in a float64 below 2^53); a keyed heap
  policy's rows are read as int64 (policies/keyheap.py).

A list keeps its most recent object at the head; the heap (4-ary) has the next
victim at its root. Policies (policies/) use these helpers from their hooks, which
are inlined into the replay kernel's NRT-free functions (simulator/kernel.py).
"""

from __future__ import annotations

import numpy as np
from numba import njit

# objs columns (int32: a row is 40 bytes, so the objects of a few layers stay in the L1 cache): list
# links, heap position, policy counter (LFU count, S3-FIFO frequency, visited/reference bits), resident,
# copy queued, host-RAM tier links and resident flag, and the id (0..3) of the pool list the object is
# linked in (-1: none)
PRV, NXT, HPOS, CNT, RES, QUEUED, RPRV, RNXT, RRES, LST = range(10)
N_OB = 10
# objf columns (float64): decayed request score, admission accumulator, next-request tick and the step
# that last marked the object (selected or run as a substitute); ticks and steps are exact below 2^53
SCORE, ACC, NREQ, MARK = range(4)
N_FO = 4
# heap columns
HK1, HK2, HOBJ = range(3)
# pools columns: capacity, resident count, heap size and base row; list q has HEAD + 3q, TAIL + 3q,
# LEN + 3q; X0..X3 are per-pool policy scalars
CAP, SIZE, HSIZE, HBASE = range(4)
HEAD, TAIL, LEN = 4, 5, 6
N_LISTS = 4
X0 = HEAD + 3 * N_LISTS
N_PO = X0 + 4


def new_pools(pool_cap: np.ndarray, ram_cap: int = -1) -> np.ndarray:
    """The pools table for VRAM pools of the given capacities and a host-RAM tier of ram_cap
    experts (-1: every expert is in host RAM)."""
    n = len(pool_cap)
    pools = np.zeros((n + 1, N_PO), np.int64)
    pools[:n, CAP] = pool_cap
    if n > 1:
        pools[1:n, HBASE] = np.cumsum(pool_cap)[:-1]
    pools[n, CAP] = ram_cap
    return pools


@njit(inline="always")
def list_push_front(ob, po, pool, o, q=0, prv=PRV, nxt=NXT):
    """Link o at the head (most recent end) of list q of the pool."""
    h = po[pool, HEAD + 3 * q]
    ob[o, prv] = -1
    ob[o, nxt] = h
    if h != -1:
        ob[h, prv] = o
    else:
        po[pool, TAIL + 3 * q] = o
    po[pool, HEAD + 3 * q] = o
    po[pool, LEN + 3 * q] += 1
    if prv == PRV:
        ob[o, LST] = q


@njit(inline="always")
def list_unlink(ob, po, pool, o, q=0, prv=PRV, nxt=NXT):
    """Unlink o from list q of the pool."""
    p = ob[o, prv]
    n = ob[o, nxt]
    if p != -1:
        ob[p, nxt] = n
    else:
        po[pool, HEAD + 3 * q] = n
    if n != -1:
        ob[n, prv] = p
    else:
        po[pool, TAIL + 3 * q] = p
    po[pool, LEN + 3 * q] -= 1
    if prv == PRV:
        ob[o, LST] = -1


@njit(inline="always")
def list_move_front(ob, po, pool, o, q=0):
    """Move o, linked in list q of the pool and not at its head, to the head (its length and list id
    are unchanged: the hot path of an LRU hit)."""
    p = ob[o, PRV]
    n = ob[o, NXT]
    ob[p, NXT] = n  # o is not the head, so it has a predecessor
    if n != -1:
        ob[n, PRV] = p
    else:
        po[pool, TAIL + 3 * q] = p
    h = po[pool, HEAD + 3 * q]
    ob[o, PRV] = -1
    ob[o, NXT] = h
    ob[h, PRV] = o
    po[pool, HEAD + 3 * q] = o


@njit(inline="always")
def list_clear(po, pool, q):
    po[pool, HEAD + 3 * q] = -1
    po[pool, TAIL + 3 * q] = -1
    po[pool, LEN + 3 * q] = 0


@njit(inline="always")
def _before(a1, a2, b1, b2):
    """Is key (a1, a2) ordered before key (b1, b2)?"""
    return a1 < b1 or (a1 == b1 and a2 < b2)


@njit(inline="always")
def _move(heap, ob, src, dst, base):
    heap[dst, HK1] = heap[src, HK1]
    heap[dst, HK2] = heap[src, HK2]
    heap[dst, HOBJ] = heap[src, HOBJ]
    ob[np.int64(heap[dst, HOBJ]), HPOS] = dst - base


ARITY = 4  # a 4-ary heap: half the levels of a binary one, and the common sift-up reads one parent a level


@njit(inline="always")
def heap_up(ob, heap, base, j, k1, k2, o):
    """Move the hole at row j up until keys (k1, k2) fit; returns the row where they go."""
    while j > base:
        p = base + (j - base - 1) // ARITY
        if _before(k1, k2, heap[p, HK1], heap[p, HK2]):
            _move(heap, ob, p, j, base)
            j = p
        else:
            break
    return j


@njit(inline="always")
def heap_down(ob, heap, base, end, j, k1, k2):
    """Move the hole at row j down until keys (k1, k2) fit; returns the row where they go."""
    while True:
        first = base + ARITY * (j - base) + 1
        if first >= end:
            break
        c = first
        for x in range(first + 1, min(first + ARITY, end)):
            if _before(heap[x, HK1], heap[x, HK2], heap[c, HK1], heap[c, HK2]):
                c = x
        if _before(heap[c, HK1], heap[c, HK2], k1, k2):
            _move(heap, ob, c, j, base)
            j = c
        else:
            break
    return j


@njit(inline="always")
def heap_place(ob, heap, j, base, k1, k2, o):
    heap[j, HK1] = k1
    heap[j, HK2] = k2
    heap[j, HOBJ] = o
    ob[np.int64(o), HPOS] = j - base


@njit(inline="always")
def heap_fix(ob, po, heap, pool, i):
    """Restore heap order around row base + i after its keys changed or it was placed
    there: the row is lifted out and its hole moves up or down until it fits."""
    base = po[pool, HBASE]
    end = base + po[pool, HSIZE]
    j = base + i
    k1 = heap[j, HK1]
    k2 = heap[j, HK2]
    o = heap[j, HOBJ]
    up = heap_up(ob, heap, base, j, k1, k2, o)
    if up == j:
        up = heap_down(ob, heap, base, end, j, k1, k2)
    heap_place(ob, heap, up, base, k1, k2, o)


@njit(inline="always")
def heap_rekey(ob, po, heap, pool, i, k1, k2):
    """Give row base + i the keys (k1, k2) and restore heap order, moving only the way the keys moved."""
    base = po[pool, HBASE]
    j = base + i
    o = heap[j, HOBJ]
    if _before(k1, k2, heap[j, HK1], heap[j, HK2]):
        j = heap_up(ob, heap, base, j, k1, k2, o)
    else:
        j = heap_down(ob, heap, base, base + po[pool, HSIZE], j, k1, k2)
    heap_place(ob, heap, j, base, k1, k2, o)
