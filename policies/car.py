"""CAR exactly as libCacheSim 0.3.5's CAR.c (Bansal & Modha's clock with adaptive replacement).

Four lists per pool, newest at each head: the clocks T1 (list 0) and T2 (list 1)
of resident objects, the hand at each tail (the oldest), and the LRU ghost lists
B1 (list 2) and B2 (list 3) of ids recently evicted from T1 and T2. Each
resident object has a reference bit (``CNT``); p, T1's target size, is a float
kept in the pool's X0 (its bits; 0 = 0.0 after a reset).

- A use (a request hit or a run as a substitute) sets the reference bit.
- Inserting an id found in B1 raises p by max(1, |B2| // |B1|) (libCacheSim
  divides the list lengths as integers), at most the capacity; one found in B2
  lowers it by max(1, |B1| // |B2|), at least 0. The ghost is dropped and the
  object enters T2's head; any other object enters T1's head. Either starts
  unreferenced.
- A full pool first replaces: while |T1| >= max(1, p), T1's oldest is the victim
  (to B1's head) if unreferenced, else it loses its bit and becomes T2's newest;
  otherwise T2's oldest is the victim (to B2's head) if unreferenced, else it
  loses its bit and becomes T2's newest again. Then, when |T1| + |B1| >= capacity,
  B1 drops its oldest id.

B2 is never trimmed: libCacheSim's condition for dropping B2's oldest follows the
B1 test as an ``else if`` that cannot hold, so B2 keeps every id evicted from T2
until it is requested again (at most the pool's experts). libCacheSim adapts p
when the lookup misses on a ghost; here that happens in ``insert``, which fetch-all
calls right after the miss, so a miss that is not fetched leaves the ghost and p
unchanged. (libcachesim 0.3.5 has no Python class for CAR; the tests build it
from its C ``CAR_init``.)"""

import numpy as np
from numba import njit

from moesim.jitcache import cached_njit
from moesim.policies.structures import CAP, CNT, LEN, LST, RES, SIZE, TAIL, X0, list_push_front, list_unlink

NAME = "car"
LIBCACHESIM = "CAR"  # the libCacheSim 0.3.5 class with the same semantics under fetch-all (the tests' oracle)
DOC = ("clock with adaptive replacement (libCacheSim CAR): ARC's adaptation over two clocks; a use only sets "
       "a reference bit")
T1, T2, B1, B2 = 0, 1, 2, 3
P = X0  # pool scalar: the float64 bits of p


@njit(inline="always")
def _get_p(po, pool):
    return po[pool, P:P + 1].view(np.float64)[0]


@njit(inline="always")
def _set_p(po, pool, x):
    po[pool, P:P + 1].view(np.float64)[0] = x


@njit(inline="always")
def hit(ob, fo, po, heap, prm, pool, o, tick, requested):
    ob[o, CNT] = 1


@njit(inline="always")
def _replace(ob, po, pool):
    """Turn the clocks until an unreferenced object is found; it leaves for its ghost list."""
    while True:
        if po[pool, LEN + 3 * T1] >= max(1.0, _get_p(po, pool)):
            v = po[pool, TAIL + 3 * T1]
            list_unlink(ob, po, pool, v, T1)
            if ob[v, CNT] == 0:
                list_push_front(ob, po, pool, v, B1)
                break
            ob[v, CNT] = 0
            list_push_front(ob, po, pool, v, T2)
        else:
            v = po[pool, TAIL + 3 * T2]
            list_unlink(ob, po, pool, v, T2)
            if ob[v, CNT] == 0:
                list_push_front(ob, po, pool, v, B2)
                break
            ob[v, CNT] = 0
            list_push_front(ob, po, pool, v, T2)
    ob[v, RES] = 0
    return v


# out of line: inlining this body into the kernel doubled its cold compile time
@cached_njit(_nrt=False)
def _insert(ob, po, prm, pool, o):
    c = po[pool, CAP]
    lst = ob[o, LST]
    ghost = lst == B1 or lst == B2
    if lst == B1:
        _set_p(po, pool, min(_get_p(po, pool) + max(1, po[pool, LEN + 3 * B2] // po[pool, LEN + 3 * B1]), float(c)))
    elif lst == B2:
        _set_p(po, pool, max(_get_p(po, pool) - max(1, po[pool, LEN + 3 * B1] // po[pool, LEN + 3 * B2]), 0.0))
    if ghost:
        list_unlink(ob, po, pool, o, lst)
    v = -1
    if po[pool, SIZE] >= c:
        v = _replace(ob, po, pool)
        if po[pool, LEN + 3 * T1] + po[pool, LEN + 3 * B1] >= c:
            list_unlink(ob, po, pool, po[pool, TAIL + 3 * B1], B1)
    else:
        po[pool, SIZE] += 1
    list_push_front(ob, po, pool, o, T2 if ghost else T1)
    ob[o, CNT] = 0
    ob[o, RES] = 1
    return v


@njit(inline="always")
def insert(ob, fo, po, heap, prm, pool, o, tick):
    return _insert(ob, po, prm, pool, o)
