"""CLOCK exactly as libCacheSim's Clock (FIFO with reinsertion, an n-bit counter per object).

One list per pool (list 0), newest at the head. A use (a request hit or a run as
a substitute) raises the object's counter by one while it is below
2^n_bit_counter - 1 (an ``init_freq`` above that cap is kept until evictions
lower it). A new object goes to the head with counter ``init_freq``. To evict,
the tail object is examined: with a counter >= 1 it loses one and moves to the
head; the first tail object with counter 0 is the victim. With the defaults
(init_freq 0, one bit) this is the classic second-chance CLOCK. The counter
lives in ``CNT``; nothing happens on a miss that is not fetched, which
libCacheSim never sees either (there every miss is inserted)."""

from numba import njit

from moesim.jitcache import cached_njit
from moesim.policies.structures import CAP, CNT, RES, SIZE, TAIL, list_push_front, list_unlink

NAME = "clock"
LIBCACHESIM = "Clock"  # the libCacheSim 0.3.5 class with the same semantics under fetch-all (the tests' oracle)
DOC = ("second chance (libCacheSim Clock): a use sets the expert's reference bit; eviction requeues and "
       "clears referenced experts from the oldest on and takes the first unreferenced")
# prm slots, libCacheSim's defaults
PARAMS = (("init_freq", 0.0), ("n_bit_counter", 1.0))
INIT_FREQ, N_BIT_COUNTER = 0, 1


@njit(inline="always")
def hit(ob, fo, po, heap, prm, pool, o, tick, requested):
    if ob[o, CNT] < (1 << int(prm[N_BIT_COUNTER])) - 1:
        ob[o, CNT] += 1


# out of line: inlining this body into the kernel doubled its cold compile time
@cached_njit(_nrt=False)
def _insert(ob, po, prm, pool, o):
    v = -1
    if po[pool, SIZE] >= po[pool, CAP]:
        v = po[pool, TAIL]
        while ob[v, CNT] >= 1:  # a second chance: one count less, back to the head
            ob[v, CNT] -= 1
            list_unlink(ob, po, pool, v, 0)
            list_push_front(ob, po, pool, v, 0)
            v = po[pool, TAIL]
        list_unlink(ob, po, pool, v, 0)
        ob[v, RES] = 0
    else:
        po[pool, SIZE] += 1
    list_push_front(ob, po, pool, o, 0)
    ob[o, CNT] = int(prm[INIT_FREQ])
    ob[o, RES] = 1
    return v


@njit(inline="always")
def insert(ob, fo, po, heap, prm, pool, o, tick):
    return _insert(ob, po, prm, pool, o)
