"""MQ exactly as libCacheSim 0.3.5's MQ.c (Zhou, Philbin & Li's multi-queue).

n_queue LRU queues per pool (lists 0..n_queue-1, newest at each head; the queue
is the object's ``LST``) and a ghost FIFO Qout (list 8) of the ids of up to
int(capacity * qout_size_ratio) evicted objects. An object of frequency f (its
``CNT``, kept for a ghost too) lives in queue min(floor(log2 f), n_queue - 1);
its expiry is ``P0``; the pool's virtual clock is X0.

- A use (a request hit or a run as a substitute) adds 1 to the frequency and
  moves the object to the head of its queue, expiring lifetime ticks ahead; an
  insertion starts at frequency 1, or one more than the frequency Qout remembers
  for the id (the ghost is dropped).
- After either, the clock advances by one and each queue above the lowest whose
  tail has expired (expiry < clock) sends it to the head of the queue below with
  a fresh expiry (libCacheSim's Adjust, one object per queue, lowest queue first).
- A full pool first evicts the tail of the lowest non-empty queue; its id and
  frequency enter Qout's head (Qout dropping its tail when full).

Only uses and insertions move the clock, as in libCacheSim (whose clock counts
its hits and insertions). libCacheSim drops the Qout ghost when the lookup
misses; here that happens in ``insert``, which fetch-all calls right after the
miss, so a miss that is not fetched leaves the ghost in place."""

from numba import njit

from moesim.jitcache import cached_njit
from moesim.policies.structures import (
    CAP,
    CNT,
    HEAD,
    LEN,
    LST,
    P0,
    RES,
    SIZE,
    TAIL,
    X0,
    list_move_front,
    list_push_front,
    list_unlink,
)

NAME = "mq"
LIBCACHESIM = "MQ"  # the libCacheSim 0.3.5 class with the same semantics under fetch-all (the tests' oracle)
DOC = ("multi-queue (libCacheSim MQ): eight LRU queues by log2 of the frequency, idle experts demoted after "
       "10,000 uses, evicted experts' frequencies remembered")
# prm slots, libCacheSim's defaults (n_queue at most 8: the ninth list is Qout)
PARAMS = (("n_queue", 8.0), ("lifetime", 10000.0), ("qout_size_ratio", 4.0))
N_QUEUE, LIFETIME, QOUT_RATIO = 0, 1, 2
QOUT = 8
VTIME = X0  # pool scalar: the virtual clock
MAX_FREQ = 2**31 - 1


@njit(inline="always")
def _queue(f, n):
    q = 0
    while f > 1 and q < n - 1:
        f >>= 1
        q += 1
    return q


@njit(inline="always")
def _adjust(ob, fo, po, prm, pool):
    vt = po[pool, VTIME] + 1
    po[pool, VTIME] = vt
    for q in range(1, int(prm[N_QUEUE])):
        if po[pool, LEN + 3 * q] > 0:
            x = po[pool, TAIL + 3 * q]
            if fo[x, P0] < vt:
                list_unlink(ob, po, pool, x, q)
                list_push_front(ob, po, pool, x, q - 1)
                fo[x, P0] = vt + prm[LIFETIME]


@cached_njit(_nrt=False)
def _hit(ob, fo, po, prm, pool, o):
    if ob[o, CNT] < MAX_FREQ:
        ob[o, CNT] += 1
    q = _queue(ob[o, CNT], int(prm[N_QUEUE]))
    lst = ob[o, LST]
    if lst != q:
        list_unlink(ob, po, pool, o, lst)
        list_push_front(ob, po, pool, o, q)
    elif po[pool, HEAD + 3 * q] != o:
        list_move_front(ob, po, pool, o, q)
    fo[o, P0] = po[pool, VTIME] + prm[LIFETIME]
    _adjust(ob, fo, po, prm, pool)


# out of line: inlining this body into the kernel doubled its cold compile time
@cached_njit(_nrt=False)
def _insert(ob, fo, po, prm, pool, o):
    n = int(prm[N_QUEUE])
    f = 1
    if ob[o, LST] == QOUT:
        list_unlink(ob, po, pool, o, QOUT)
        f = ob[o, CNT] + 1 if ob[o, CNT] < MAX_FREQ else MAX_FREQ
    v = -1
    if po[pool, SIZE] >= po[pool, CAP]:
        for q in range(n):
            if po[pool, LEN + 3 * q] > 0:
                v = po[pool, TAIL + 3 * q]
                list_unlink(ob, po, pool, v, q)
                break
        ob[v, RES] = 0
        qout_cap = int(po[pool, CAP] * prm[QOUT_RATIO])
        if qout_cap >= 1:
            while po[pool, LEN + 3 * QOUT] + 1 > qout_cap:
                list_unlink(ob, po, pool, po[pool, TAIL + 3 * QOUT], QOUT)
            list_push_front(ob, po, pool, v, QOUT)  # its frequency stays in CNT
    else:
        po[pool, SIZE] += 1
    ob[o, CNT] = f
    list_push_front(ob, po, pool, o, _queue(f, n))
    ob[o, RES] = 1
    fo[o, P0] = po[pool, VTIME] + prm[LIFETIME]
    _adjust(ob, fo, po, prm, pool)
    return v


@njit(inline="always")
def insert(ob, fo, po, heap, prm, pool, o, tick):
    return _insert(ob, fo, po, prm, pool, o)


@njit(inline="always")
def hit(ob, fo, po, heap, prm, pool, o, tick, requested):
    _hit(ob, fo, po, prm, pool, o)
