"""S3-FIFO exactly as libCacheSim 0.3.5's S3FIFO (its current S3FIFO.c, not S3FIFOv0).

Three lists per pool, newest at each head: a small FIFO S (list 0) of
int(capacity * small_size_ratio) slots, a main FIFO M (list 1) of the rest run
as a 2-bit clock, and a ghost FIFO G (list 2) of the ids of up to
int(capacity * ghost_size_ratio) objects evicted from S (non-resident). Each
object's frequency is ``CNT``; the pool's X0 records that the pool has evicted.

- A use (a request hit or a run as a substitute) adds 1 to the frequency.
- Inserting an id found in G drops it from G and puts the object at M's head.
  Any other insertion goes to S's head, or to M's head while S is full and the
  pool has never evicted. A new entry starts at frequency 0.
- A full pool evicts one object first. When M holds more than its share or S is
  empty, M's tail objects with frequency >= 1 go back to M's head with
  min(frequency, 3) - 1 until a tail object with frequency 0 is the victim.
  Otherwise S's tail objects with frequency >= move_to_main_threshold move to
  M's head (frequency 0) until one below it is the victim, whose id enters G's
  head (G drops its tail when full); if S empties first, M evicts as above.

Tiny pools: libCacheSim refuses to put into S an object as large as S, so when
int(capacity * small_size_ratio) <= 1 (capacity < 20 with the defaults) nothing
is ever admitted: ``insert`` returns NOT_ADMITTED and every request misses.
libCacheSim 0.3.5 matches that for a one-slot S and aborts when S has no slot.

libCacheSim drops a ghost id when the lookup misses; here that happens in
``insert``, which fetch-all calls right after the miss, so a miss that is not
fetched (substituted, dropped, on the CPU) leaves the ghost in place."""

from numba import njit

from moesim.jitcache import cached_njit
from moesim.policies.hooks import NOT_ADMITTED
from moesim.policies.structures import CAP, CNT, LEN, LST, RES, SIZE, TAIL, X0, list_push_front, list_unlink

NAME = "s3fifo"
LIBCACHESIM = "S3FIFO"  # the libCacheSim 0.3.5 class with the same semantics under fetch-all (the tests' oracle)
DOC = ("S3-FIFO (libCacheSim S3FIFO): a small probation FIFO, a main 2-bit clock and a ghost FIFO; "
       "admits nothing below 20 slots")
# prm slots, libCacheSim's defaults
PARAMS = (("small_size_ratio", 0.1), ("ghost_size_ratio", 0.9), ("move_to_main_threshold", 2.0))
SMALL_RATIO, GHOST_RATIO, THRESHOLD = 0, 1, 2
S, M, G = 0, 1, 2
HAS_EVICTED = X0


@njit(inline="always")
def hit(ob, fo, po, heap, prm, pool, o, tick, requested):
    ob[o, CNT] += 1


@njit(inline="always")
def _evict_main(ob, po, pool):
    while True:
        v = po[pool, TAIL + 3 * M]
        list_unlink(ob, po, pool, v, M)
        if ob[v, CNT] >= 1:
            list_push_front(ob, po, pool, v, M)
            ob[v, CNT] = min(ob[v, CNT], 3) - 1
        else:
            ob[v, RES] = 0
            return v


@njit(inline="always")
def _evict(ob, po, prm, pool, small_cap):
    po[pool, HAS_EVICTED] = 1
    if po[pool, LEN + 3 * M] <= po[pool, CAP] - small_cap:
        while po[pool, LEN + 3 * S] > 0:
            v = po[pool, TAIL + 3 * S]
            list_unlink(ob, po, pool, v, S)
            if ob[v, CNT] >= prm[THRESHOLD]:
                list_push_front(ob, po, pool, v, M)
                ob[v, CNT] = 0
            else:
                ob[v, RES] = 0
                ghost_cap = int(po[pool, CAP] * prm[GHOST_RATIO])
                if ghost_cap > 0:
                    if po[pool, LEN + 3 * G] >= ghost_cap:
                        list_unlink(ob, po, pool, po[pool, TAIL + 3 * G], G)
                    list_push_front(ob, po, pool, v, G)
                return v
    return _evict_main(ob, po, pool)


# out of line: inlining this body into the kernel doubled its cold compile time
@cached_njit(_nrt=False)
def _insert(ob, po, prm, pool, o):
    small_cap = int(po[pool, CAP] * prm[SMALL_RATIO])
    ghost_hit = ob[o, LST] == G
    if ghost_hit:
        list_unlink(ob, po, pool, o, G)
    elif small_cap <= 1:
        return NOT_ADMITTED
    v = -1
    if po[pool, SIZE] >= po[pool, CAP]:
        v = _evict(ob, po, prm, pool, small_cap)
    else:
        po[pool, SIZE] += 1
    if ghost_hit or (po[pool, HAS_EVICTED] == 0 and po[pool, LEN + 3 * S] >= small_cap):
        list_push_front(ob, po, pool, o, M)
    else:
        list_push_front(ob, po, pool, o, S)
    ob[o, CNT] = 0
    ob[o, RES] = 1
    return v


@njit(inline="always")
def insert(ob, fo, po, heap, prm, pool, o, tick):
    return _insert(ob, po, prm, pool, o)
