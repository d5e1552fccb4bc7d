"""LCP, mlx-flash's expert-cache eviction (mlx-flash 0.9.2, ``mlx_flash_compress/lcp_cache.py``, class
``LCPCache``; its docstring credits mlx-moe): evict the resident expert of the lowest priority

    frequency x base ^ (tokens since its last use / decay),   base = 0.25, decay = 128 tokens

(``LCPCache.__init__`` defaults ``lcp_base=0.25, lcp_decay=128``; ``CacheConfig`` in ``config.py`` the same).
The frequency is 1 on insertion and +1 per request hit (mlx-flash's ``LCPEntry.frequency``: forgotten when the
expert is evicted); its last use is the token of its insertion or last request hit (``last_step``; mlx-flash
advances the step once per token). A run as a substitute changes nothing (mlx-flash has none).

With 0 < base < 1 the order of two experts does not change as time passes (both priorities shrink by the
same factor), so the kernel keys each resident expert once per use by

    token of its last use + decay / log2(1 / base) x log2(frequency)

(the log of its priority, shifted by the current token) in the pool's float heap, ties to the earliest
inserted (mlx-flash scans its dict in insertion order and keeps the first minimum). mlx-flash compares the
priorities themselves in floating point, so two priorities equal up to a rounding can order differently
there; otherwise this is its rule. The insertion tick is kept in ``P0``."""

import math

from numba import njit

from moesim.jitcache import cached_njit
from moesim.policies import heapops
from moesim.policies.structures import CNT, HPOS, P0

NAME = "lcp"
DOC = ("mlx-flash's LCP: evict the lowest frequency x 0.25^(tokens since last use / 128) (frequency while "
       "cached); ties to the earliest inserted")
# prm slots, mlx-flash 0.9.2's defaults (lcp_cache.py LCPCache, config.py CacheConfig: lcp_base, lcp_decay)
PARAMS = (("base", 0.25), ("decay_tokens", 128.0))
BASE, DECAY = 0, 1
USES_TOKEN = True  # its time is in tokens (the replay gives the ticks of one token)


@njit(inline="always")
def _key(prm, count, tick):
    """log2(priority) x decay / log2(1/base) + the current token: grows with the frequency and the last use."""
    return float(heapops.token_of(prm, tick)) + prm[DECAY] / math.log2(1.0 / prm[BASE]) * math.log2(float(count))


@cached_njit(_nrt=False)
def _hit(ob, fo, po, heap, prm, pool, o, tick, requested):
    if requested:
        ob[o, CNT] += 1
        heapops.rekey(ob, po, heap, pool, o, _key(prm, ob[o, CNT], tick), fo[o, P0])


# out of line: inlining this body into the kernel doubled its cold compile time
@cached_njit(_nrt=False)
def _insert(ob, fo, po, heap, prm, pool, o, tick):
    ob[o, CNT] = 1
    fo[o, P0] = tick
    v = heapops.insert(ob, po, heap, pool, o, _key(prm, 1, tick), float(tick))
    if v >= 0:
        ob[v, CNT] = 0
        ob[v, HPOS] = -1
    return v


@njit(inline="always")
def insert(ob, fo, po, heap, prm, pool, o, tick):
    return _insert(ob, fo, po, heap, prm, pool, o, tick)


@njit(inline="always")
def hit(ob, fo, po, heap, prm, pool, o, tick, requested):
    _hit(ob, fo, po, heap, prm, pool, o, tick, requested)
