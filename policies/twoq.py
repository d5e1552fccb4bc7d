"""2Q exactly as libCacheSim 0.3.5's TwoQ (its TwoQ.c, Johnson & Shasha's full 2Q).

Three lists per pool, newest at each head: a FIFO Ain (list 0) of
int(capacity * a_in_size_ratio) slots, an LRU Am (list 1) of the rest, and a
ghost FIFO Aout (list 2) of the ids of up to int(capacity * a_out_size_ratio)
objects evicted from Ain (non-resident; ``LST`` says which list).

- A use (a request hit or a run as a substitute) in Am moves the object to Am's
  head; one in Ain changes nothing.
- Inserting an id found in Aout drops the ghost; the object goes to Am's head,
  Am first evicting its own tail when it holds its share (so a pool that is not
  full can evict). Any other insertion goes to Ain's head (Ain may exceed its
  share).
- A full pool first evicts Am's tail when Am is non-empty and Ain holds at most
  its share, else Ain's tail, whose id enters Aout's head (Aout dropping its tail
  when full).

With no Ain slot (capacity < 4 at the defaults) libCacheSim admits nothing, and
``insert`` returns NOT_ADMITTED. libCacheSim drops the Aout ghost when the
lookup misses; here that happens in ``insert``, which fetch-all calls right after
the miss, so a miss that is not fetched leaves the ghost in place."""

from numba import njit

from moesim.jitcache import cached_njit
from moesim.policies.hooks import NOT_ADMITTED
from moesim.policies.structures import (
    CAP,
    HEAD,
    LEN,
    LST,
    RES,
    SIZE,
    TAIL,
    list_move_front,
    list_push_front,
    list_unlink,
)

NAME = "twoq"
LIBCACHESIM = "TwoQ"  # the libCacheSim 0.3.5 class with the same semantics under fetch-all (the tests' oracle)
DOC = ("2Q (libCacheSim TwoQ): a FIFO probation queue of a quarter, an LRU main queue, and ghosts of the FIFO's "
       "evictions that admit straight to the main queue; admits nothing below 4 slots")
# prm slots, libCacheSim's defaults
PARAMS = (("a_in_size_ratio", 0.25), ("a_out_size_ratio", 0.5))
AIN_RATIO, AOUT_RATIO = 0, 1
AIN, AM, AOUT = 0, 1, 2


@njit(inline="always")
def hit(ob, fo, po, heap, prm, pool, o, tick, requested):
    if ob[o, LST] == AM and po[pool, HEAD + 3 * AM] != o:
        list_move_front(ob, po, pool, o, AM)


@njit(inline="always")
def _evict(ob, po, prm, pool, ain_cap):
    if po[pool, LEN + 3 * AM] > 0 and po[pool, LEN + 3 * AIN] <= ain_cap:
        v = po[pool, TAIL + 3 * AM]
        list_unlink(ob, po, pool, v, AM)
    else:
        v = po[pool, TAIL + 3 * AIN]
        list_unlink(ob, po, pool, v, AIN)
        aout_cap = int(po[pool, CAP] * prm[AOUT_RATIO])
        if aout_cap >= 1:
            while po[pool, LEN + 3 * AOUT] + 1 > aout_cap:
                list_unlink(ob, po, pool, po[pool, TAIL + 3 * AOUT], AOUT)
            list_push_front(ob, po, pool, v, AOUT)
    ob[v, RES] = 0
    po[pool, SIZE] -= 1
    return v


# out of line: inlining this body into the kernel doubled its cold compile time
@cached_njit(_nrt=False)
def _insert(ob, po, prm, pool, o):
    c = po[pool, CAP]
    ain_cap = int(c * prm[AIN_RATIO])
    ghost = ob[o, LST] == AOUT
    if ghost:
        list_unlink(ob, po, pool, o, AOUT)
    if ain_cap < 1:
        return NOT_ADMITTED
    v = -1
    if po[pool, SIZE] >= c:
        v = _evict(ob, po, prm, pool, ain_cap)
    if ghost:
        if po[pool, LEN + 3 * AM] >= c - ain_cap:  # Am at its share evicts its own tail
            v = po[pool, TAIL + 3 * AM]
            list_unlink(ob, po, pool, v, AM)
            ob[v, RES] = 0
            po[pool, SIZE] -= 1
        list_push_front(ob, po, pool, o, AM)
    else:
        list_push_front(ob, po, pool, o, AIN)
    ob[o, RES] = 1
    po[pool, SIZE] += 1
    return v


@njit(inline="always")
def insert(ob, fo, po, heap, prm, pool, o, tick):
    return _insert(ob, po, prm, pool, o)
