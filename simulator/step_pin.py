"""--step-pin in the ext replay kernel: a step's selected experts cannot be evicted by the step's own misses.

The kernel handles a pinned step in two passes (hits, then misses, each in rank order) and calls these
helpers with the step's selection (its row of experts). Which victim an insertion takes instead depends on
how the eviction keeps its order (its pin mode, policies/registry.py ``Eviction.pin_mode``):

- list policies (lru, fifo: the victim is the list's tail): the unpinned expert nearest the tail;
- heap policies (lfu, freq: the victim is the heap's root): the step's resident experts are given
  an infinite priority for the rest of the step and get their own back at its end, so the root is the
  least-preferred unpinned expert; keyed heap policies (belady, policies/keyheap.py) alike, with a key
  above every unpinned one;
- either way, when every resident expert of the pool is pinned the expert is fetched for this use only
  (PIN_FULL: not admitted).

State: ``spin[o, 0]`` the step o is pinned at, ``spin[o, 1]`` its saved heap priority (a keyed heap's
int64 key, stored as its bits) (State.spin).
"""

import numpy as np
from numba import njit

from moesim.jitcache import cached_njit
from moesim.policies import keyheap
from moesim.policies.hooks import NOT_ADMITTED
from moesim.policies.structures import CAP, HBASE, HK1, HK2, HPOS, PRV, RES, SIZE, TAIL, heap_rekey_called, list_unlink

MODE_NONE, MODE_LIST, MODE_HEAP, MODE_FIXED, MODE_KEYHEAP = range(5)
PIN_FULL = -3  # an insertion's answer when every resident expert of the pool is pinned by the step


@cached_njit(_nrt=False)
def mark(row, base, step, spin):
    """Pin the step's selected experts (resident or not) for this step."""
    for r in range(row.shape[0]):
        if row[r] >= 0:
            spin[base + row[r], 0] = step


@njit(inline="always")
def _pinned_in_heap(row, r, base, ob):
    """The step's r-th expert when it is resident in a heap, else -1."""
    e = row[r]
    return base + e if e >= 0 and ob[base + e, RES] != 0 and ob[base + e, HPOS] >= 0 else -1


@cached_njit(_nrt=False)
def _raise(mode, ob, po, heap, pool, o, spin):
    """Resident o outranks every unpinned expert of its heap until _lower; its priority is saved."""
    if mode == MODE_KEYHEAP:
        keyheap.pin(ob, po, heap, pool, o, spin)
        return
    j = po[pool, HBASE] + ob[o, HPOS]
    spin[o, 1] = heap[j, HK1]
    heap_rekey_called(ob, po, heap, pool, ob[o, HPOS], np.inf, heap[j, HK2])


@cached_njit(_nrt=False)
def _lower(mode, ob, po, heap, pool, o, spin):
    """o gets its saved priority back (unless a use re-keyed it since it was pinned)."""
    if mode == MODE_KEYHEAP:
        keyheap.unpin(ob, po, heap, pool, o, spin)
        return
    j = po[pool, HBASE] + ob[o, HPOS]
    if heap[j, HK1] == np.inf:
        heap_rekey_called(ob, po, heap, pool, ob[o, HPOS], spin[o, 1], heap[j, HK2])


@cached_njit(_nrt=False)
def raise_hits(mode, row, base, pool, ob, po, heap, spin):
    """Heap policies: after the step's hits, its resident experts take an infinite priority."""
    if mode != MODE_HEAP and mode != MODE_KEYHEAP:
        return
    for r in range(row.shape[0]):
        o = _pinned_in_heap(row, r, base, ob)
        if o >= 0:
            _raise(mode, ob, po, heap, pool, o, spin)


@cached_njit(_nrt=False)
def restore(mode, row, base, pool, ob, po, heap, spin):
    """Heap policies: at the step's end its pinned resident experts get their priority back."""
    if mode != MODE_HEAP and mode != MODE_KEYHEAP:
        return
    for r in range(row.shape[0]):
        o = _pinned_in_heap(row, r, base, ob)
        if o >= 0:
            _lower(mode, ob, po, heap, pool, o, spin)


@cached_njit(_nrt=False)
def insert(ins, mode, prm, pool, o, tick, step, ob, fo, po, heap, spin):
    """Admit o through the policy's insert hook ``ins`` without evicting an expert pinned at this step: the
    victim, -1 (none), NOT_ADMITTED (the policy refused o) or PIN_FULL (every resident expert is pinned)."""
    if po[pool, SIZE] >= po[pool, CAP] and po[pool, CAP] > 0:
        if mode == MODE_LIST:
            v = po[pool, TAIL]
            while v != -1 and spin[v, 0] == step:
                v = ob[v, PRV]
            if v == -1:
                return PIN_FULL
            if v != po[pool, TAIL]:  # make room by hand, then the policy inserts into a pool with room
                list_unlink(ob, po, pool, v, 0)
                ob[v, RES] = 0
                po[pool, SIZE] -= 1
                ins(ob, fo, po, heap, prm, pool, o, tick)
                return v
        elif mode == MODE_HEAP:
            if heap[po[pool, HBASE], HK1] == np.inf:
                return PIN_FULL
        elif mode == MODE_KEYHEAP:
            if keyheap.root_pinned(po, heap, pool):
                return PIN_FULL
    v = ins(ob, fo, po, heap, prm, pool, o, tick)
    if (mode == MODE_HEAP or mode == MODE_KEYHEAP) and v != NOT_ADMITTED:
        _raise(mode, ob, po, heap, pool, o, spin)
    return v
