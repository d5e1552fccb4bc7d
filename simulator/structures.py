"""The cache's state in four packed arrays, and the list and heap operations on it.

Experts are objects ``o = layer * E + expert``; pools are per-layer caches or one
global cache. Packing the per-object fields into one row (a cache line) keeps
memory traffic low, and lets the hot-loop helpers take four arrays instead of
twenty: numba passes every array as ~7-9 machine words per call.

- ``ob`` int64 [objects, 11]: list links, heap position, LFU count, next-request
  tick, step mark, resident flag, copy-queued flag, and the host-RAM tier's list
  links and resident flag;
- ``fo`` float64 [objects, 2]: decayed request score, admission accumulator;
- ``po`` int64 [pools + 1, 6]: list head/tail, heap size/base, occupancy, capacity;
  the last row is the host-RAM tier (an LRU list over all layers);
- ``heap`` float64 [sum of capacities, 3]: each pool's min-heap of (priority, last-use
  tick, object) rows, keys stored in the heap itself so that sifting reads
  contiguous memory (ticks and ids are exact in a float64 below 2^53).

The list keeps the most recent object at the head and evicts at the tail; the
heap (4-ary) has the next victim at its root. These helpers are inlined into the kernel's
NRT-free functions (simulator/kernel.py).
"""

import numpy as np
from numba import njit

# ob columns
PRV, NXT, HPOS, CNT, NREQ, MARK, RES, QUEUED, RPRV, RNXT, RRES = range(11)
N_OB = 11
# fo columns
SCORE, ACC = range(2)
N_FO = 2
# heap columns
HK1, HK2, HOBJ = range(3)
# po columns
HEAD, TAIL, HSIZE, HBASE, SIZE, CAP = range(6)
N_PO = 6
N_COUNTERS = 14  # simulator.kernel.COUNTER_NAMES


def new_state(pool_cap: np.ndarray, L: int, E: int, k: int, ram_cap: int = -1):
    """Fresh state for L layers of E experts, top-k, VRAM pools of the given capacities and
    a host-RAM tier of ram_cap experts (-1: every expert is in host RAM); with the kernel's
    scratch: per-layer FIFO queues of background copies (object, completion time), their
    head and length, and one step's counters."""
    n_obj = L * E
    n_pools = len(pool_cap)
    ob = np.zeros((n_obj, N_OB), np.int64)
    fo = np.zeros((n_obj, N_FO), np.float64)
    po = np.zeros((n_pools + 1, N_PO), np.int64)
    po[:n_pools, CAP] = pool_cap
    po[1:n_pools, HBASE] = np.cumsum(pool_cap)[:-1]
    po[n_pools, CAP] = ram_cap
    heap = np.zeros((max(1, int(pool_cap.sum())), 3), np.float64)
    queue = np.zeros((L, E), np.int64)
    queue_t = np.zeros((L, E), np.float64)
    qhl = np.zeros((L, 2), np.int64)
    return ob, fo, po, heap, queue, queue_t, qhl, np.zeros(N_COUNTERS, np.int64)


@njit(inline="always")
def list_push_front(ob, po, pool, o, prv=PRV, nxt=NXT):
    h = po[pool, HEAD]
    ob[o, prv] = -1
    ob[o, nxt] = h
    if h != -1:
        ob[h, prv] = o
    else:
        po[pool, TAIL] = o
    po[pool, HEAD] = o


@njit(inline="always")
def list_unlink(ob, po, pool, o, prv=PRV, nxt=NXT):
    p = ob[o, prv]
    n = ob[o, nxt]
    if p != -1:
        ob[p, nxt] = n
    else:
        po[pool, HEAD] = n
    if n != -1:
        ob[n, prv] = p
    else:
        po[pool, TAIL] = p


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
def heap_fix(ob, po, heap, pool, i):
    """Restore heap order around row base + i after its keys changed or it was placed
    there: the row is lifted out and its hole moves up or down until it fits."""
    base = po[pool, HBASE]
    end = base + po[pool, HSIZE]
    j = base + i
    k1 = heap[j, HK1]
    k2 = heap[j, HK2]
    o = heap[j, HOBJ]
    start = j
    while j > base:
        p = base + (j - base - 1) // ARITY
        if _before(k1, k2, heap[p, HK1], heap[p, HK2]):
            _move(heap, ob, p, j, base)
            j = p
        else:
            break
    if j == start:
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
    heap[j, HK1] = k1
    heap[j, HK2] = k2
    heap[j, HOBJ] = o
    ob[np.int64(o), HPOS] = j - base
