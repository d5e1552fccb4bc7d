"""LFRU as colibri scores experts (github.com/JustVugg/colibri ``c/tier.h`` at commit 003a0b9b, ``tier_lfru_score``:
"frequency is the primary signal; recency breaks close calls"), used as an eviction: evict the resident expert
of the lowest

    heat x 256 + (255 - age if age < 255 else 0)

where heat counts the expert's requests (colibri's ``eheat``, bumped on every demand routing, resident or not,
kept across evictions) and age the requests since its last one. One heat is worth more than any recency, so
the order is: lowest heat, then least recently requested; colibri breaks the remaining ties (both older than
255 requests) by its slot order, moesim by recency, so among equal heat the least recently requested goes
first. ``lfru:D`` halves every heat of the pool every D tokens (colibri's ``tier_decay``, a right shift run at
the end of each re-pin pass, every REPIN=N emitted tokens); without D heat never decays (colibri's default
REPIN=0), and the order is then ``freq``'s except that a run as a substitute does not refresh recency.

The policy counts the requests it sees: hits and fetched misses (every request under fetch-all; a miss that is
not fetched leaves it unchanged, as for every policy). The halvings fall on the tokens that are multiples of
D, from the pool's first request after a reset on. Heat is ``CNT`` (zero after a reset); the pool's X0 holds
the period of its last request + 1; the keys (heat, last request tick) live in the pool's float heap, rebuilt
after a halving."""

from numba import njit

from moesim.jitcache import cached_njit
from moesim.policies import heapops
from moesim.policies.params import Param
from moesim.policies.structures import CNT, HBASE, HK2, HOBJ, HSIZE, X0, heap_sift

NAME = "lfru"
DOC = ("colibri's LFRU: evict the lowest heat x 256 + recency (requests seen, then least recently requested); "
       "lfru:D halves heat every D tokens")
PARAM = Param("decay_tokens", "D", "a positive whole number of tokens between halvings", integer=True, default=0.0)
PERIOD = 0
USES_TOKEN = True  # its decay period is in tokens (the replay gives the ticks of one token)
HALVINGS = X0  # pool scalar: the decay period of the last request + 1 (0: none since the reset)


@njit(inline="always")
def _decay(ob, po, heap, prm, pool, tick):
    """Halve the pool's heats once per period boundary passed since the last call, and rebuild its heap."""
    d = int(prm[PERIOD])
    if d <= 0 or tick < 0:  # no decay, or the warm set's insertions
        return
    epoch = heapops.token_of(prm, tick) // d + 1  # + 1: 0 stands for "no request since the reset yet"
    if po[pool, HALVINGS] == 0:
        po[pool, HALVINGS] = epoch
        return
    n = epoch - po[pool, HALVINGS]
    if n <= 0:
        return
    po[pool, HALVINGS] = epoch
    n_pools = po.shape[0] - 1
    per = ob.shape[0] // n_pools if n_pools > 1 else ob.shape[0]
    first = pool * per if n_pools > 1 else 0
    shift = min(n, 31)
    for o in range(first, first + per):
        ob[o, CNT] >>= shift
    base = po[pool, HBASE]
    size = po[pool, HSIZE]
    for i in range(size):  # push the rows back one by one: row i is read before any push writes it
        o = int(heap[base + i, HOBJ])
        heap_sift(ob, heap, base, base + i + 1, base + i, float(ob[o, CNT]), heap[base + i, HK2], o)


@cached_njit(_nrt=False)
def _hit(ob, fo, po, heap, prm, pool, o, tick, requested):
    if requested:
        _decay(ob, po, heap, prm, pool, tick)
        ob[o, CNT] += 1
        heapops.rekey(ob, po, heap, pool, o, float(ob[o, CNT]), tick)


# out of line: inlining this body into the kernel doubled its cold compile time
@cached_njit(_nrt=False)
def _insert(ob, fo, po, heap, prm, pool, o, tick):
    _decay(ob, po, heap, prm, pool, tick)
    ob[o, CNT] += 1
    return heapops.insert(ob, po, heap, pool, o, float(ob[o, CNT]), tick)


@njit(inline="always")
def insert(ob, fo, po, heap, prm, pool, o, tick):
    return _insert(ob, fo, po, heap, prm, pool, o, tick)


@njit(inline="always")
def hit(ob, fo, po, heap, prm, pool, o, tick, requested):
    _hit(ob, fo, po, heap, prm, pool, o, tick, requested)
