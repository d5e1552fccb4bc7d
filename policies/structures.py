"""The cache's state in four packed arrays, and the list and heap operations on it.

Experts are objects ``o = layer * E + expert``; pools are per-layer caches or one
global cache. Packing the per-object fields into one row (a cache line) keeps
memory traffic low, and lets the hot-loop helpers take four arrays instead of
twenty: numba passes every array as ~7-9 machine words per call.

- ``objs`` int32 [objects, N_OB]: list links, heap position, per-policy counter,
  resident flag, copy-queued flag, the host-RAM tier's list links and resident
  flag, which of its pool's lists the object is linked in, and a second pair of
  list links (a policy whose object may sit in two of its lists at once: LIRS);
- ``objf`` float64 [objects, N_FO]: decayed request score, admission accumulator,
  next-request tick, step mark, two values of the policy's own (LRU-K's last
  uses, MQ's expiry) and the index of its last request in its pool (second-touch
  admission);
- ``pools`` int64 [pools + 1, N_PO]: capacity, occupancy, heap size/base, up to
  nine linked lists (head, tail, length), four per-pool policy scalars and the
  pool's request count (second-touch admission); the last row is the host-RAM
  tier (an LRU list over all layers, list 0);
- ``heap`` float64 [sum of capacities, 3]: each pool's min-heap of (priority,
  last-use tick, object) rows, keys stored in the heap itself so that sifting reads
  contiguous memory (ticks and ids are exact in a float64 below 2^53); a keyed heap
  policy's rows are read as int64 (policies/keyheap.py).

A list keeps its most recent object at the head; the heap (4-ary) has the next
victim at its root. Policies (policies/) use these helpers from their hooks, which
are inlined into the replay kernels' NRT-free functions (simulator/kernels.py).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from moesim.jitcache import cached_njit

# objs columns (int32: a row is 40 bytes, so the objects of a few layers stay in the L1 cache): list
# links, heap position, policy counter (LFU count, S3-FIFO frequency, visited/reference bits), resident,
# copy queued, host-RAM tier links and resident flag, and the id (0..3) of the pool list the object is
# linked in (-1: none); PRV2/NXT2: the links of a second list the object may be in at the same time (the list
# helpers take them as ``prv``/``nxt``; LST tracks the first pair only)
PRV, NXT, HPOS, CNT, RES, QUEUED, RPRV, RNXT, RRES, LST, PRV2, NXT2 = range(12)
N_OB = 12
# objf columns (float64): decayed request score, admission accumulator, next-request tick and the step
# that last marked the object (selected or run as a substitute); ticks and steps are exact below 2^53; P0, P1:
# the policy's own (never touched by the kernels; a policy sets them before it reads them)
SCORE, ACC, NREQ, MARK, P0, P1 = range(6)
# LASTREQ (the kernels', --admission second-touch): the index, among its pool's requests, of the object's last
# request (-1: none since the reset)
LASTREQ = 6
N_FO = 7
# heap columns
HK1, HK2, HOBJ = range(3)
# pools columns: capacity, resident count, heap size and base row; list q has HEAD + 3q, TAIL + 3q,
# LEN + 3q; X0..X3 are per-pool policy scalars (zero after a reset), X3 by convention the number of objects
# the policy evicted beyond the victims its insert hook returned (SLRU's and LIRS's evictions on a hit)
CAP, SIZE, HSIZE, HBASE = range(4)
HEAD, TAIL, LEN = 4, 5, 6
N_LISTS = 9  # MQ: eight queues and a ghost list
X0 = HEAD + 3 * N_LISTS
X1, X2, X3 = X0 + 1, X0 + 2, X0 + 3
EXTRA_EVICTIONS = X3
REQS = X0 + 4  # the kernels' (--admission second-touch): the pool's requests since the reset
N_PO = X0 + 5


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


ARITY = 4  # a 4-ary heap: half the levels of a binary one, and the common sift-up reads one parent a level


@njit(inline="always")
def heap_sift(ob, heap, base, end, j, k1, k2, o):
    """Put keys (k1, k2) and object o into the hole at row j of the heap rows [base, end): the hole
    moves up while the keys come before its parent's, else down while a child's come before them.
    Written as one function (no nested inlined helpers): numba copies an inlined function's IR at each
    call site, and the nested version made a heap policy's hooks ~2 s of every kernel's compile."""
    up = False
    while j > base:
        p = base + (j - base - 1) // ARITY
        pk1 = heap[p, HK1]
        if k1 < pk1 or (k1 == pk1 and k2 < heap[p, HK2]):
            heap[j, HK1] = pk1
            heap[j, HK2] = heap[p, HK2]
            x = heap[p, HOBJ]
            heap[j, HOBJ] = x
            ob[np.int64(x), HPOS] = j - base
            j = p
            up = True
        else:
            break
    while not up:
        first = base + ARITY * (j - base) + 1
        if first >= end:
            break
        c = first
        ck1 = heap[c, HK1]
        ck2 = heap[c, HK2]
        for x in range(first + 1, min(first + ARITY, end)):
            xk1 = heap[x, HK1]
            if xk1 < ck1 or (xk1 == ck1 and heap[x, HK2] < ck2):
                c = x
                ck1 = xk1
                ck2 = heap[x, HK2]
        if ck1 < k1 or (ck1 == k1 and ck2 < k2):
            heap[j, HK1] = ck1
            heap[j, HK2] = ck2
            y = heap[c, HOBJ]
            heap[j, HOBJ] = y
            ob[np.int64(y), HPOS] = j - base
            j = c
        else:
            break
    heap[j, HK1] = k1
    heap[j, HK2] = k2
    heap[j, HOBJ] = o
    ob[np.int64(o), HPOS] = j - base


@njit(inline="always")
def heap_rekey(ob, po, heap, pool, i, k1, k2):
    """Give row base + i the keys (k1, k2) and restore heap order (keys are unique: (priority, tick))."""
    base = po[pool, HBASE]
    heap_sift(ob, heap, base, base + po[pool, HSIZE], base + i, k1, k2, heap[base + i, HOBJ])


@cached_njit(_nrt=False)
def heap_rekey_called(ob, po, heap, pool, i, k1, k2):
    """heap_rekey called, not inlined, where it is rare (--step-pin's priority changes): one compiled sift
    instead of one per call site."""
    heap_rekey(ob, po, heap, pool, i, k1, k2)
