"""Segmented LRU exactly as libCacheSim 0.3.5's SLRU (its SLRU.c, four segments by default).

n_seg LRU lists per pool (lists 0..n_seg-1, segment 0 the lowest, newest at each
head) of capacity // n_seg slots each; the segment is the object's ``LST``.

- A use (a request hit or a run as a substitute) of an object in the top segment
  moves it to that segment's head; one below moves it to the head of the next
  segment up. A segment over its size then cools: its tail goes to the head of
  the segment below, cascading down, and a cooled segment 0 evicts its tail (an
  eviction on a hit, counted in the pool's EXTRA_EVICTIONS).
- An insertion goes to the head of the lowest segment with room, or to segment
  0 when none has room; a full pool first evicts the tail of the lowest
  non-empty segment.

So when the capacity is not a multiple of n_seg, segment 0 alone takes the
capacity % n_seg spare slots, and gives them back (evicting) at the next hit
that cools it. Below n_seg slots no segment has a slot and nothing is admitted
(``insert`` returns NOT_ADMITTED), as libCacheSim refuses an object larger than
a segment."""

from numba import njit

from moesim.jitcache import cached_njit
from moesim.policies.hooks import NOT_ADMITTED
from moesim.policies.structures import (
    CAP,
    EXTRA_EVICTIONS,
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

NAME = "slru"
EXTRA_EVICTIONS_USED = True  # evicts beyond its insertions' victims (counted in the pool's EXTRA_EVICTIONS)
LIBCACHESIM = "SLRU"  # the libCacheSim 0.3.5 class with the same semantics under fetch-all (the tests' oracle)
DOC = ("segmented LRU (libCacheSim SLRU): four LRU segments of a quarter each; a hit promotes one segment up, "
       "overflow cools down; admits nothing below 4 slots")
# prm slots, libCacheSim's defaults (at most policies/structures.py N_LISTS segments)
PARAMS = (("n_seg", 4.0),)
N_SEG = 0


@njit(inline="always")
def _evict(ob, po, pool, n_seg):
    """Evict the tail of the lowest non-empty segment; returns it."""
    for q in range(n_seg):
        if po[pool, LEN + 3 * q] > 0:
            v = po[pool, TAIL + 3 * q]
            list_unlink(ob, po, pool, v, q)
            ob[v, RES] = 0
            po[pool, SIZE] -= 1
            return v
    return -1


@cached_njit(_nrt=False)
def _hit(ob, po, prm, pool, o):
    n_seg = int(prm[N_SEG])
    q = ob[o, LST]
    if q == n_seg - 1:
        if po[pool, HEAD + 3 * q] != o:
            list_move_front(ob, po, pool, o, q)
        return
    seg_cap = po[pool, CAP] // n_seg
    list_unlink(ob, po, pool, o, q)
    list_push_front(ob, po, pool, o, q + 1)
    # cool from segment q + 1 down while a segment is over its size (libCacheSim's recursion, unrolled: a
    # cooled segment can only overflow the one below it)
    i = q + 1
    while i >= 0 and po[pool, LEN + 3 * i] > seg_cap:
        if i == 0:
            while po[pool, LEN] > seg_cap:
                _evict(ob, po, pool, n_seg)
                po[pool, EXTRA_EVICTIONS] += 1
            break
        x = po[pool, TAIL + 3 * i]
        list_unlink(ob, po, pool, x, i)
        list_push_front(ob, po, pool, x, i - 1)
        i -= 1


# out of line: inlining this body into the kernel doubled its cold compile time
@cached_njit(_nrt=False)
def _insert(ob, po, prm, pool, o):
    n_seg = int(prm[N_SEG])
    seg_cap = po[pool, CAP] // n_seg
    if seg_cap < 1:
        return NOT_ADMITTED
    v = -1
    if po[pool, SIZE] >= po[pool, CAP]:
        v = _evict(ob, po, pool, n_seg)
    q = 0
    for i in range(n_seg):
        if po[pool, LEN + 3 * i] + 1 <= seg_cap:
            q = i
            break
    list_push_front(ob, po, pool, o, q)
    ob[o, RES] = 1
    po[pool, SIZE] += 1
    return v


@njit(inline="always")
def insert(ob, fo, po, heap, prm, pool, o, tick):
    return _insert(ob, po, prm, pool, o)


@njit(inline="always")
def hit(ob, fo, po, heap, prm, pool, o, tick, requested):
    _hit(ob, po, prm, pool, o)
