"""ARC exactly as libCacheSim's ARC (Megiddo & Modha's adaptive replacement cache).

Four lists per pool, newest at each head: T1 (list 0: resident, seen once since
admission), T2 (list 1: resident, used again), and the ghost lists B1 (list 2)
and B2 (list 3) of ids recently evicted from T1 and T2 (non-resident; ``LST``
says which). p, the target size of T1, is a float kept in the pool's X0 (its
bits; 0 = 0.0 after a reset).

- A use (a request hit or a run as a substitute) moves the object to T2's head.
- Inserting an id found in B1 raises p by max(|B2| / |B1|, 1), at most the
  capacity; one found in B2 lowers it by max(|B1| / |B2|, 1), at least 0. The
  ghost is dropped, a full pool evicts by REPLACE, and the object enters T2's head.
- Any other insertion enters T1's head; a full pool first makes room: when
  |T1| + |B1| = capacity, B1 drops its tail and REPLACE evicts (when B1 is
  empty, T1's tail is evicted without leaving a ghost); otherwise B2 drops its
  tail when the four lists hold 2 x capacity ids, and REPLACE evicts.
- REPLACE moves T1's tail to B1's head when T2 is empty, or when T1 is non-empty
  and |T1| > p (or |T1| = p on a B2 ghost hit); else T2's tail to B2's head.

So the ghosts are bounded as in libCacheSim: |T1| + |B1| <= capacity and all
four lists <= 2 x capacity. libCacheSim adapts p when the lookup misses on a
ghost; here that happens in ``insert``, which fetch-all calls right after the
miss, so a miss that is not fetched (substituted, dropped, on the CPU) leaves the
ghost and p unchanged."""

import numpy as np
from numba import njit

from moesim.jitcache import cached_njit
from moesim.policies.structures import CAP, HEAD, LEN, LST, RES, SIZE, TAIL, X0, list_push_front, list_unlink

NAME = "arc"
LIBCACHESIM = "ARC"  # the libCacheSim 0.3.5 class with the same semantics under fetch-all (the tests' oracle)
DOC = ("adaptive replacement (libCacheSim ARC): LRU lists of experts used once (T1) and again (T2); "
       "hits on ghosts of evicted ones steer T1's target size")
T1, T2, B1, B2 = 0, 1, 2, 3
P = X0  # pool scalar: the float64 bits of p


@njit(inline="always")
def _get_p(po, pool):
    return po[pool, P:P + 1].view(np.float64)[0]


@njit(inline="always")
def _set_p(po, pool, x):
    po[pool, P:P + 1].view(np.float64)[0] = x


@njit(inline="always")
def _replace(ob, po, pool, b2_hit):
    """Move T1's or T2's tail to its ghost list; returns it."""
    t1 = po[pool, LEN + 3 * T1]
    p = _get_p(po, pool)
    if (t1 > 0 and (t1 > p or (t1 == p and b2_hit))) or po[pool, LEN + 3 * T2] == 0:
        v = po[pool, TAIL + 3 * T1]
        list_unlink(ob, po, pool, v, T1)
        list_push_front(ob, po, pool, v, B1)
    else:
        v = po[pool, TAIL + 3 * T2]
        list_unlink(ob, po, pool, v, T2)
        list_push_front(ob, po, pool, v, B2)
    ob[v, RES] = 0
    return v


@cached_njit(_nrt=False)
def _hit(ob, po, pool, o):
    if ob[o, LST] == T1:
        list_unlink(ob, po, pool, o, T1)
        list_push_front(ob, po, pool, o, T2)
    elif po[pool, HEAD + 3 * T2] != o:
        list_unlink(ob, po, pool, o, T2)
        list_push_front(ob, po, pool, o, T2)


# out of line: inlining this body into the kernel doubled its cold compile time
@cached_njit(_nrt=False)
def _insert(ob, po, prm, pool, o):
    c = po[pool, CAP]
    full = po[pool, SIZE] >= c
    n_b1 = po[pool, LEN + 3 * B1]
    n_b2 = po[pool, LEN + 3 * B2]
    v = -1
    lst = ob[o, LST]
    if lst == B1 or lst == B2:  # a ghost hit: adapt p, then the object joins T2
        if lst == B1:
            _set_p(po, pool, min(_get_p(po, pool) + max(n_b2 / n_b1, 1.0), float(c)))
        else:
            _set_p(po, pool, max(_get_p(po, pool) - max(n_b1 / n_b2, 1.0), 0.0))
        list_unlink(ob, po, pool, o, lst)
        if full:
            v = _replace(ob, po, pool, lst == B2)
        else:
            po[pool, SIZE] += 1
        list_push_front(ob, po, pool, o, T2)
    else:
        if full:
            n_t1 = po[pool, LEN + 3 * T1]
            if n_t1 + n_b1 >= c:
                if n_b1 > 0:
                    list_unlink(ob, po, pool, po[pool, TAIL + 3 * B1], B1)
                    v = _replace(ob, po, pool, False)
                else:
                    v = po[pool, TAIL + 3 * T1]
                    list_unlink(ob, po, pool, v, T1)
                    ob[v, RES] = 0
            else:
                if n_t1 + n_b1 + po[pool, LEN + 3 * T2] + n_b2 >= 2 * c and n_b2 > 0:
                    list_unlink(ob, po, pool, po[pool, TAIL + 3 * B2], B2)
                v = _replace(ob, po, pool, False)
        else:
            po[pool, SIZE] += 1
        list_push_front(ob, po, pool, o, T1)
    ob[o, RES] = 1
    return v


@njit(inline="always")
def insert(ob, fo, po, heap, prm, pool, o, tick):
    return _insert(ob, po, prm, pool, o)


@njit(inline="always")
def hit(ob, fo, po, heap, prm, pool, o, tick, requested):
    _hit(ob, po, pool, o)
