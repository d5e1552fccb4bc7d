"""SIEVE exactly as libCacheSim's Sieve.

One list per pool (list 0), newest at the head, and a hand. A use (a request hit
or a run as a substitute) sets the object's visited bit (``CNT``); a new object
goes to the head unvisited. To evict, the hand starts where the last eviction
left it (at the tail the first time) and walks towards the head, clearing visited
bits and wrapping from the head back to the tail; the first unvisited object is
the victim, and the hand stays at the next newer object (back at the tail when
the victim was the head). Objects are never moved: new ones enter at the head,
survivors stay in place. The hand is kept in the pool's X0 as object id + 1
(0: start at the tail), so a reset pool (X0 = 0) starts like a new libCacheSim
cache. A miss that is not fetched changes nothing."""

from numba import njit

from moesim.jitcache import cached_njit
from moesim.policies.structures import CAP, CNT, PRV, RES, SIZE, TAIL, X0, list_push_front, list_unlink

NAME = "sieve"
LIBCACHESIM = "Sieve"  # the libCacheSim 0.3.5 class with the same semantics under fetch-all (the tests' oracle)
DOC = ("SIEVE (libCacheSim Sieve): a use marks the expert; a hand moving from oldest to newest clears "
       "marks and evicts the first unmarked expert")
HAND = X0  # pool scalar: the hand's object id + 1, 0 = at the tail


@njit(inline="always")
def hit(ob, fo, po, heap, prm, pool, o, tick, requested):
    ob[o, CNT] = 1


# out of line: inlining this body into the kernel doubled its cold compile time
@cached_njit(_nrt=False)
def _insert(ob, po, prm, pool, o):
    v = -1
    if po[pool, SIZE] >= po[pool, CAP]:
        v = po[pool, HAND] - 1 if po[pool, HAND] > 0 else po[pool, TAIL]
        while ob[v, CNT] > 0:
            ob[v, CNT] = 0
            v = ob[v, PRV] if ob[v, PRV] != -1 else po[pool, TAIL]
        po[pool, HAND] = ob[v, PRV] + 1
        list_unlink(ob, po, pool, v, 0)
        ob[v, RES] = 0
    else:
        po[pool, SIZE] += 1
    list_push_front(ob, po, pool, o, 0)
    ob[o, CNT] = 0
    ob[o, RES] = 1
    return v


@njit(inline="always")
def insert(ob, fo, po, heap, prm, pool, o, tick):
    return _insert(ob, po, prm, pool, o)
