"""The cache's state in four packed arrays, and the list and heap operations on it.

Experts are objects ``o = layer * E + expert``; pools are per-layer caches or one
global cache. Packing the per-object fields into one row (a cache line) keeps
memory traffic low, and lets the hot-loop helpers take four arrays instead of
twenty: numba passes every array as ~7-9 machine words per call.

- ``ob`` int64 [objects, 12]: list links, heap position, LFU count, last-use tick,
  next-request tick, step mark, resident flag, copy-queued flag, and the host-RAM
  tier's list links and resident flag;
- ``fo`` float64 [objects, 3]: heap priority, decayed request score, admission accumulator;
- ``po`` int64 [pools + 1, 6]: list head/tail, heap size/base, occupancy, capacity;
  the last row is the host-RAM tier (an LRU list over all layers);
- ``heap`` int64 [sum of capacities]: each pool's min-heap on (priority, last-use tick).

The list keeps the most recent object at the head and evicts at the tail; the
heap's root is the next victim. These helpers are inlined into the kernel's
NRT-free functions (simulator/kernel.py).
"""

import numpy as np
from numba import njit

# ob columns
PRV, NXT, HPOS, CNT, KEY2, NREQ, MARK, RES, QUEUED, RPRV, RNXT, RRES = range(12)
N_OB = 12
# fo columns
KEY1, SCORE, ACC = range(3)
N_FO = 3
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
    heap = np.zeros(max(1, int(pool_cap.sum())), np.int64)
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
def _less(ob, fo, a, b):
    ka = fo[a, KEY1]
    kb = fo[b, KEY1]
    return ka < kb or (ka == kb and ob[a, KEY2] < ob[b, KEY2])


@njit(inline="always")
def heap_fix(ob, fo, po, heap, pool, i):
    """Restore heap order around position i after its object's key changed or it was placed there."""
    base = po[pool, HBASE]
    size = po[pool, HSIZE]
    o = heap[base + i]
    moved = False
    while i > 0:
        p = (i - 1) >> 1
        po_ = heap[base + p]
        if _less(ob, fo, o, po_):
            heap[base + i] = po_
            ob[po_, HPOS] = i
            i = p
            moved = True
        else:
            break
    if not moved:
        while True:
            c = 2 * i + 1
            if c >= size:
                break
            co = heap[base + c]
            if c + 1 < size:
                c2 = heap[base + c + 1]
                if _less(ob, fo, c2, co):
                    c += 1
                    co = c2
            if _less(ob, fo, co, o):
                heap[base + i] = co
                ob[co, HPOS] = i
                i = c
            else:
                break
    heap[base + i] = o
    ob[o, HPOS] = i
