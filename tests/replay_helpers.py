"""Build in-memory Routings for replay tests, and run libCacheSim on their streams."""

from __future__ import annotations

import contextlib
import zlib

import numpy as np

from moesim.traces.meta import TraceMeta
from moesim.traces.routing import Routing


def make_routing(sel, w, cand, seq, n_experts) -> Routing:
    T, L, k = sel.shape
    meta = TraceMeta(model_id="random", family="test", n_experts=n_experts, top_k=k, moe_layers=tuple(range(L)),
                     layout="sparse", n_candidates=cand.shape[2], synthetic=True)
    pos = np.zeros(T, np.int32)
    for t in range(1, T):
        pos[t] = pos[t - 1] + 1 if seq[t] == seq[t - 1] else 0
    return Routing(meta=meta, seq=np.asarray(seq, np.int32), pos=pos, phase=np.ones(T, np.int8),
                   domain=np.full(T, -1, np.int16), domain_names=[], token=None, sel=sel, w=w, cand=cand,
                   digest="test")


def fast_random_routing(rng, T, L, E, k, M=None, n_seq=1, zipf=1.0) -> Routing:
    """Larger random routings (vectorized): Zipf-like popularity per layer plus a sticky state."""
    M = M or k
    pop = -zipf * np.log(np.arange(1, E + 1))
    base = np.stack([rng.permutation(pop) for _ in range(L)])
    state = rng.normal(size=(L, E))
    logits = np.empty((T, L, E))
    for t in range(T):
        state = 0.8 * state + 0.45 * rng.normal(size=(L, E))
        logits[t] = base + state
    ids = np.broadcast_to(np.arange(E), logits.shape)
    order = np.lexsort((ids, -logits), axis=-1)
    cand = order[..., :M].astype(np.int16)
    sel = order[..., :k].astype(np.int16)
    x = np.take_along_axis(logits, order[..., :k], axis=-1)
    ww = np.exp(x - x[..., :1])
    w = (ww / ww.sum(axis=-1, keepdims=True)).astype(np.float32)
    seq = np.sort(rng.integers(0, n_seq, size=T)).astype(np.int32)
    return make_routing(sel, w, cand, seq, E)


def oracle_trace(path, objs: np.ndarray) -> None:
    """Write libCacheSim's oracleGeneral binary trace: uint32 time, uint64 id, uint32 size,
    int64 next access (1-based index of the next request to the same id, -1 for never)."""
    n = len(objs)
    nxt = np.full(n, -1, np.int64)
    last: dict = {}
    for i in range(n - 1, -1, -1):
        o = int(objs[i])
        nxt[i] = last.get(o, -1)
        last[o] = i + 1
    rec = np.zeros(n, dtype=np.dtype([("t", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")]))
    rec["t"] = np.arange(1, n + 1)
    rec["id"] = objs.astype(np.uint64) + 1  # keep id 0 out of the trace
    rec["size"] = 1
    rec["next"] = nxt
    rec.tofile(path)


def libcachesim_misses(path, policy: str, capacity: int, n_requests: int, admissioner=None, **params) -> int:
    """libCacheSim's misses replaying the oracle trace at ``path`` (its C replay); ``params``: the
    policy's libCacheSim parameters (small_size_ratio=..., init_freq=...). S3FIFO with no slot for its
    small queue (capacity < 10 at the default ratio) aborts libCacheSim 0.3.5; its answer one step up
    (one small slot, capacity 10..19) is that nothing is admitted, so every request misses, which is
    what moesim's s3fifo does and what is returned there without running libCacheSim."""
    import libcachesim as lcs

    if policy == "s3fifo" and int(capacity * params.get("small_size_ratio", 0.1)) == 0:
        return n_requests

    reader = lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE)
    ratio, _ = libcachesim_cache(policy, capacity, admissioner=admissioner, **params).process_trace(reader)
    return int(round(ratio * n_requests))


def libcachesim_cache(policy: str, capacity: int, admissioner=None, hashpower: int = 16, **params):
    """A libCacheSim 0.3.5 cache of the class the eviction's module names (LIBCACHESIM), for objects of size 1;
    a class the Python package does not wrap (CAR) is built from its C init. ``params``: the class's
    parameters (keyword names of the Python class; key=value of the C init otherwise); ``admissioner``: a
    libcachesim admissioner (BloomFilterAdmissioner(), ...)."""
    import libcachesim as lcs

    from moesim.policies import registry

    name = registry.libcachesim_twins()[policy]
    # a small hash table by default: libCacheSim's (2^24 buckets per cache, three for S3FIFO) costs more than the
    # replay of a test's stream
    if hasattr(lcs, name):
        return getattr(lcs, name)(cache_size=capacity, hashpower=hashpower, admissioner=admissioner, **params)
    from libcachesim import libcachesim_python as c
    from libcachesim.cache import CacheBase, _create_common_params

    spec = ", ".join(f"{k}={v}" for k, v in params.items())
    return CacheBase(getattr(c, f"{name}_init")(_create_common_params(capacity, hashpower=hashpower), spec),
                     admissioner)


def stable_seed(*parts) -> int:
    """A seed that is the same in every process (unlike hash(), which Python randomizes per process)."""
    return zlib.crc32(repr(parts).encode())


@contextlib.contextmanager
def seeded_rng(*parts):
    """A numpy Generator seeded from ``parts``; a failure inside the block reports the seed."""
    seed = stable_seed(*parts)
    try:
        yield np.random.default_rng(seed)
    except BaseException as exc:
        exc.add_note(f"random test data: np.random.default_rng({seed}) from {parts!r}")
        raise
