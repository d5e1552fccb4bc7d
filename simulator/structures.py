"""The cache's state in four packed arrays, and the list and heap operations on it.

Experts are objects ``o = layer * E + expert``; pools are per-layer caches or one
global cache. Packing the per-object fields into one row (a cache line) keeps
memory traffic low, and lets the hot-loop helpers take four arrays instead of
twenty: numba passes every array as ~7-9 machine words per call.

- ``ob`` int64 [objects, 8]: list links, heap position, LFU count, last-use tick,
  next-request tick, step mark, resident flag;
- ``fo`` float64 [objects, 3]: heap priority, decayed request score, admission accumulator;
- ``po`` int64 [pools, 6]: list head/tail, heap size/base, occupancy, capacity;
- ``heap`` int64 [sum of capacities]: each pool's min-heap on (priority, last-use tick).

The list keeps the most recent object at the head and evicts at the tail; the
heap's root is the next victim. These helpers are inlined into the kernel's
NRT-free functions (simulator/kernel.py).
"""

import numpy as np
from numba import njit

# ob columns
PRV, NXT, HPOS, CNT, KEY2, NREQ, MARK, RES = range(8)
N_OB = 8
# fo columns
KEY1, SCORE, ACC = range(3)
N_FO = 3
# po columns
HEAD, TAIL, HSIZE, HBASE, SIZE, CAP = range(6)
N_PO = 6
N_COUNTERS = 10  # simulator.kernel.COUNTER_NAMES


def new_state(pool_cap: np.ndarray, L: int, E: int, k: int):
    """Fresh state for L layers of E experts, top-k, pools of the given capacities; with the
    kernel's scratch arrays (queued admissions [L, k] and their counts [L], one step's counters)."""
    n_obj = L * E
    ob = np.zeros((n_obj, N_OB), np.int64)
    fo = np.zeros((n_obj, N_FO), np.float64)
    po = np.zeros((len(pool_cap), N_PO), np.int64)
    po[:, CAP] = pool_cap
    po[1:, HBASE] = np.cumsum(pool_cap)[:-1]
    heap = np.zeros(max(1, int(pool_cap.sum())), np.int64)
    return ob, fo, po, heap, np.zeros((L, k), np.int64), np.zeros(L, np.int64), np.zeros(N_COUNTERS, np.int64)


@njit(inline="always")
def list_push_front(ob, po, pool, o):
    h = po[pool, HEAD]
    ob[o, PRV] = -1
    ob[o, NXT] = h
    if h != -1:
        ob[h, PRV] = o
    else:
        po[pool, TAIL] = o
    po[pool, HEAD] = o


@njit(inline="always")
def list_unlink(ob, po, pool, o):
    p = ob[o, PRV]
    n = ob[o, NXT]
    if p != -1:
        ob[p, NXT] = n
    else:
        po[pool, HEAD] = n
    if n != -1:
        ob[n, PRV] = p
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
