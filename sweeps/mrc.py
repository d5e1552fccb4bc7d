"""Hit-rate curves: hit rate at every cache size.

LRU has the inclusion property, so one pass computing each request's stack distance (the number
of distinct experts used since its previous request) gives the hit rate at every size at once: a
request hits a cache of C slots iff its distance is < C. Replay semantics make this exact for the
replay engine's fetch-all LRU: within a step the k requests are a stream in rank order, so a
layer's cache is LRU on its flattened (token, rank) stream, and a global pool is LRU on the
(token, layer, rank) stream of (layer, expert) objects with capacity slots x L. Distances come from
a Fenwick tree over stream positions holding a 1 at each expert's latest request (O(n log n)).

Other evictions have no inclusion property: they are replayed on a grid of sizes, in parallel.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from moesim.errors import MoesimError
from moesim.files import SUFFIXES, atomic_files, check_output, write_table_to
from moesim.policies import registry
from moesim.simulator.config import ALLOCATIONS, SimConfig, slots_for_budget
from moesim.simulator.stack_distance import stack_histograms  # decorated under the hashed cache dir (package init)
from moesim.sweeps.executors import Task, execute
from moesim.sweeps.inputs import load_traces

DEFAULT_BUDGETS = (1 / 64, 1 / 32, 1 / 16, 1 / 8, 3 / 16, 1 / 4, 3 / 8, 1 / 2)


def lru_hits(routing, warmup_tokens: int = 0, reset_per_sequence: bool = False) -> dict:
    """LRU fetch-all hits at every size, from one pass: ``per_layer[l, N-1]`` = hits of layer l with
    N slots per layer (N = 1..E); ``pooled[l, N-1]`` = hits of layer l's requests with one shared pool
    of N x L slots; ``requests[l]`` = counted requests of layer l."""
    if warmup_tokens >= routing.n_tokens:
        raise MoesimError(f"warmup_tokens={warmup_tokens} leaves none of the trace's {routing.n_tokens} tokens")
    sel = np.ascontiguousarray(routing.sel, dtype=np.int16)
    seq = np.ascontiguousarray(routing.seq, dtype=np.int32)
    per_layer, pooled = stack_histograms(sel, routing.n_experts, seq, int(warmup_tokens), bool(reset_per_sequence))
    E, L = routing.n_experts, routing.n_layers
    cum_layer = np.cumsum(per_layer[:, :E], axis=1)  # [L, E]: distance < N  <=>  hit with N slots
    cum_pool = np.cumsum(pooled[:, : L * E], axis=1)
    return {
        "per_layer": cum_layer,
        "pooled": cum_pool[:, np.arange(1, E + 1) * L - 1],  # capacity N x L
        "pooled_any": cum_pool,  # capacity C = 1 .. L*E (index C-1)
        "requests": per_layer.sum(axis=1),
    }


def size_grid(n_experts: int, slots: list[int] | None = None, budgets: list[float] | None = None) -> list[int]:
    """Slots per layer to replay: the given slots and budgets (floor(b x E)), else the default budgets."""
    out = set()
    for s in slots or []:
        if not 1 <= s <= n_experts:
            raise MoesimError(f"slots per layer must be between 1 and E={n_experts}, got {s}")
        out.add(int(s))
    for b in budgets or []:
        if not (0 < b <= 1):
            raise MoesimError(f"budget must be a fraction in (0, 1], got {b:g}")
        out.add(slots_for_budget(b, n_experts))
    if not slots and not budgets:
        out = {slots_for_budget(b, n_experts) for b in DEFAULT_BUDGETS}
    return sorted(s for s in out if s >= 1)


def mrc(trace, *, evictions=None, allocations=None, slots: list[int] | None = None,
        budgets: list[float] | None = None, warmup_tokens: int = 0, reset_per_sequence: bool = False,
        jobs: int | None = None, executor: str = "local", progress=None):
    """Hit-rate curves of a trace (a path or a Routing). Returns (curve, layers) polars frames:
    one row per (eviction, allocation, slots per layer), and per layer. LRU rows cover every size
    1..E (method "stack-distance"); the other evictions the size grid (method "replay")."""
    import polars as pl

    entry = load_traces([trace])[0]
    routing = entry.routing
    E, L = routing.n_experts, routing.n_layers
    evictions = list(dict.fromkeys(evictions or registry.default_evictions()))
    for ev in evictions:
        registry.parse_eviction(ev)
    allocations = list(dict.fromkeys(allocations or ALLOCATIONS))
    for a in allocations:
        if a not in ALLOCATIONS:
            raise MoesimError(f"allocation must be per-layer or global, got {a!r}")
    grid = size_grid(E, slots, budgets)
    base = {"trace": entry.name, "trace_digest": entry.digest, "model_id": routing.meta.model_id,
            "synthetic": routing.synthetic, "miss": "fetch-all", "warmup_tokens": int(warmup_tokens),
            "reset_per_sequence": bool(reset_per_sequence)}
    layer_ids = np.asarray(routing.meta.moe_layers, np.int64)
    curves, layer_frames = [], []

    def add(eviction, allocation, sizes, hits, requests, method):
        """hits: [L, len(sizes)] per layer and size; requests: [L]."""
        sizes = np.asarray(sizes, np.int64)
        hits = np.asarray(hits, np.int64).reshape(L, len(sizes))
        req = np.asarray(requests, np.int64)
        common = {"eviction": eviction, "allocation": allocation, "method": method}

        def cols(n):
            return {**{k: [v] * n for k, v in {**base, **common}.items()}}

        tot_h, tot_r = hits.sum(axis=0), int(req.sum())
        curves.append(pl.DataFrame({
            **cols(len(sizes)), "slots_per_layer": sizes, "budget": sizes / E,
            "capacity": sizes * (L if allocation == "global" else 1), "requests": np.full(len(sizes), tot_r),
            "hits": tot_h, "hit_rate": tot_h / tot_r if tot_r else np.full(len(sizes), np.nan)}))
        n = L * len(sizes)
        lreq = np.repeat(req, len(sizes))
        with np.errstate(invalid="ignore", divide="ignore"):
            rate = np.where(lreq > 0, hits.reshape(-1) / np.maximum(lreq, 1), np.nan)
        layer_frames.append(pl.DataFrame({
            **cols(n), "slots_per_layer": np.tile(sizes, L), "budget": np.tile(sizes, L) / E,
            "capacity": np.tile(sizes, L) * (L if allocation == "global" else 1),
            "layer": np.repeat(layer_ids, len(sizes)), "requests": lreq, "hits": hits.reshape(-1),
            "hit_rate": rate}))

    if "lru" in evictions:
        lru = lru_hits(routing, warmup_tokens, reset_per_sequence)
        for allocation in allocations:
            table = lru["per_layer"] if allocation == "per-layer" else lru["pooled"]
            add("lru", allocation, np.arange(1, E + 1), table, lru["requests"], "stack-distance")
    configs = [SimConfig(eviction=ev, miss="fetch-all", slots=n, allocation=a, warmup_tokens=warmup_tokens,
                         reset_per_sequence=reset_per_sequence)
               for ev in evictions if ev != "lru" for a in allocations for n in grid]
    work = [Task(str(i), 0, 0, c, str(i)) for i, c in enumerate(configs)]
    if progress:
        progress(0, len(work))
    done = 0
    for key, payload in execute(work, [routing], [None], jobs=jobs, executor=executor):
        c = configs[int(key)]
        lr = payload["layers"]
        add(c.eviction, c.allocation, [c.slots], [x["hits"] for x in lr], [x["requests"] for x in lr], "replay")
        done += 1
        if progress:
            progress(done, len(work))
    order = {e: i for i, e in enumerate(evictions)}
    aorder = {a: i for i, a in enumerate(allocations)}

    def ordered(frames, by):
        df = pl.concat(frames, how="vertical_relaxed")
        rank = df.select(pl.col("allocation").replace_strict(aorder, return_dtype=pl.Int64).alias("_a"),
                         pl.col("eviction").replace_strict(order, return_dtype=pl.Int64).alias("_e"))
        return pl.concat([df, rank], how="horizontal").sort(["_a", "_e", *by]).drop(["_a", "_e"])

    return ordered(curves, ["slots_per_layer"]), ordered(layer_frames, ["slots_per_layer", "layer"])


def curve_paths(path: str | os.PathLike) -> list[Path]:
    """NAME.<suffix> and NAME.layers.<suffix>; the suffix must be a table format."""
    p = Path(path)
    if p.suffix not in SUFFIXES:
        raise MoesimError(f"{p}: unknown table format (use one of {', '.join(SUFFIXES)})")
    return [p, p.with_name(p.stem + ".layers" + p.suffix)]


def check_curve_paths(path: str | os.PathLike, inputs=()) -> None:
    """Refuse -o (or its .layers sibling) when it is an input: before any replay runs."""
    for p in curve_paths(path):
        check_output(p, inputs)


def write_curves(curve, layers, path: str | os.PathLike, *, inputs=()):
    """NAME.parquet (or .csv/.json) and NAME.layers.<same suffix>: both written before either is
    renamed into place, so a failed write (a full disk) publishes neither."""
    main, lp = curve_paths(path)
    with atomic_files([lp, main], inputs=inputs) as (tmp_layers, tmp_main):
        write_table_to(layers, tmp_layers, lp.suffix)
        write_table_to(curve, tmp_main, main.suffix)
    return main
