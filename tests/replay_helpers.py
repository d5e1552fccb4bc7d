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


def libcachesim_misses(path, policy: str, capacity: int, n_requests: int) -> int:
    import libcachesim as lcs

    cls = {"lru": lcs.LRU, "lfu": lcs.LFU, "fifo": lcs.FIFO, "belady": lcs.Belady}[policy]
    reader = lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE)
    ratio, _ = cls(cache_size=capacity).process_trace(reader)
    return int(round(ratio * n_requests))


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
