"""LFU with dynamic aging (Arlitt, Cherkasova, Dilley, Friedrich & Jin, "Evaluating content management
techniques for Web proxy caches", 2000: the GDSF family with unit cost and size).

Each resident expert has a key K = its count + L, where the count is its router requests while cached (1 on
insertion, +1 per request hit, forgotten on eviction) and L, the pool's age, is the key of the last victim
(0 at a reset). A request hit recomputes K with the current L; an insertion gets 1 + L; the victim is the
lowest K, ties to the least recently used (a run as a substitute refreshes recency only). So an expert that
was popular long ago ages out as L climbs past its key. The keys live in the pool's float heap, L in X0.

libCacheSim 0.3.5 ships an LFUDA whose hit adds the pool's minimum frequency to the key instead of one,
and which had not finished a 2,000-request stream over 19 ids at capacity 8 after ten minutes here (its
Python per-request path); moesim does not follow it."""

from numba import njit

from moesim.jitcache import cached_njit
from moesim.policies import heapops
from moesim.policies.structures import CAP, CNT, HPOS, SIZE, X0

NAME = "lfuda"
DOC = ("LFU with dynamic aging (Arlitt et al. 2000): key = requests while cached + the last victim's key; "
       "the lowest key is evicted, ties to LRU")
AGE = X0  # pool scalar: L, the key of the last victim (keys are whole numbers)


@cached_njit(_nrt=False)
def _hit(ob, po, heap, pool, o, tick, requested):
    if requested:
        ob[o, CNT] += 1
        heapops.rekey(ob, po, heap, pool, o, float(ob[o, CNT] + po[pool, AGE]), tick)
    else:
        k1, _ = heapops.key_of(ob, po, heap, pool, o)
        heapops.rekey(ob, po, heap, pool, o, k1, tick)


# out of line: inlining this body into the kernel doubled its cold compile time
@cached_njit(_nrt=False)
def _insert(ob, po, heap, pool, o, tick):
    if po[pool, SIZE] >= po[pool, CAP]:  # full: the victim's key becomes the age
        po[pool, AGE] = int(heapops.root_priority(po, heap, pool))
    ob[o, CNT] = 1
    v = heapops.insert(ob, po, heap, pool, o, float(1 + po[pool, AGE]), tick)
    if v >= 0:
        ob[v, CNT] = 0
        ob[v, HPOS] = -1
    return v


@njit(inline="always")
def insert(ob, fo, po, heap, prm, pool, o, tick):
    return _insert(ob, po, heap, pool, o, tick)


@njit(inline="always")
def hit(ob, fo, po, heap, prm, pool, o, tick, requested):
    _hit(ob, po, heap, pool, o, tick, requested)
