"""Hit-rate curves: hit rate at every cache size.

LRU has the inclusion property, so one pass computing each request's stack distance (the number
of distinct experts used since its previous request) gives the hit rate at every size at once: a
request hits a cache of C slots iff its distance is < C. Replay semantics make this exact for the
replay engine's fetch-all LRU: within a step the k requests are a stream in rank order, so a
layer's cache is LRU on its flattened (token, rank) stream, and a global pool is LRU on the
(token, layer, rank) stream of (layer, expert) objects with capacity slots x L. Distances come from
a Fenwick tree over stream positions holding a 1 at each expert's latest request (O(n log n)).

Other evictions have no inclusion property: they are replayed on a grid of sizes, in parallel.

With ``ci`` (docs/uncertainty.md) every curve row gets a percentile-bootstrap interval of its hit rate
over the trace's sequences (or blocks of tokens): for LRU from the same stack distances counted per
unit (``unit_histograms``: the hits of every unit at every size, in two more passes: the trace and the trace
rotated by half, simulator/rotation.py), for the replayed evictions from each replay's hits and requests
per unit (simulator/units.py). Per-layer rows have none.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from moesim.errors import MoesimError
from moesim.files import SUFFIXES, atomic_files, check_output, write_table_to
from moesim.policies import registry
from moesim.simulator.bootstrap import CI, percentile_intervals, ratio, resampled_sums
from moesim.simulator.config import ALLOCATIONS, SimConfig, slots_for_budget
from moesim.simulator.rotation import rotation
from moesim.simulator.stack_distance import (  # decorated under the hashed cache dir (package init)
    stack_histograms,
    unit_histograms,
)
from moesim.simulator.units import SUM_NAMES, Units, assign
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


def _unit_hits(sel, seq, ids, n_units, n_experts, warmup_tokens, reset_per_sequence):
    L, E = sel.shape[1], n_experts
    per_layer, pooled = unit_histograms(np.ascontiguousarray(sel, dtype=np.int16), E,
                                        np.ascontiguousarray(seq, dtype=np.int32), int(warmup_tokens),
                                        bool(reset_per_sequence), np.ascontiguousarray(ids, dtype=np.int64),
                                        int(n_units))
    return {"per_layer": np.cumsum(per_layer[:, :E], axis=1),
            "pooled": np.cumsum(pooled[:, : L * E], axis=1)[:, np.arange(1, E + 1) * L - 1],
            "requests": per_layer.sum(axis=1)}


def lru_unit_hits(routing, units: Units, warmup_tokens: int = 0, reset_per_sequence: bool = False,
                  method: str = "single") -> dict:
    """LRU fetch-all hits of every resampling unit at every size, summed over layers: ``per_layer[u, N-1]``
    (N slots per layer), ``pooled[u, N-1]`` (one pool of N x L slots), ``requests[u]``, and the cold-start
    offsets ``per_layer_offset`` and ``pooled_offset`` [E]. With ``method="rotated"`` the units before
    U // 2 are counted from a second pass over the trace rotated by half (simulator/rotation.py), so every
    unit is counted warm and the offsets hold the cold start; with "single" the offsets are zero."""
    E = routing.n_experts
    cold = _unit_hits(routing.sel, routing.seq, units.ids, units.n, E, warmup_tokens, reset_per_sequence)
    out = dict(cold, per_layer_offset=np.zeros(E, np.int64), pooled_offset=np.zeros(E, np.int64))
    if method != "rotated" or units.n < 2:
        return out
    order, h = rotation(units)
    again = _unit_hits(routing.sel[order], routing.seq[order], units.ids[order], units.n, E, 0, reset_per_sequence)
    for key in ("per_layer", "pooled"):
        warm = cold[key].copy()
        warm[:h] = again[key][:h]
        out[key], out[f"{key}_offset"] = warm, cold[key].sum(axis=0) - warm.sum(axis=0)
    return out


def hit_rate_intervals(hits: np.ndarray, requests: np.ndarray, ci: CI, offset=None) -> np.ndarray:
    """[sizes, 2]: the interval of the hit rate at each size from the per-unit hits [U, sizes] and
    requests [U], ``offset`` [sizes] hits added to every resample (NaN with a single unit)."""
    U, n = hits.shape
    if U < 2:
        return np.full((n, 2), np.nan)
    sums = resampled_sums(np.concatenate([hits, requests[:, None]], axis=1).astype(np.float64), ci.resamples)
    if offset is not None:
        sums[:, :n] += np.asarray(offset, np.float64)
    return percentile_intervals(ratio(sums[:, :n], sums[:, n:]), ci.level)


_HITS, _REQUESTS = SUM_NAMES.index("hits"), SUM_NAMES.index("requests")


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
        if slots_for_budget(b, n_experts) < 1:  # an empty table, not a silent one
            raise MoesimError(f"budget {b:g} of E={n_experts} experts gives 0 slots per layer; the smallest budget "
                              f"is {1 / n_experts:.4g}")
        out.add(slots_for_budget(b, n_experts))
    if not slots and not budgets:
        out = {slots_for_budget(b, n_experts) for b in DEFAULT_BUDGETS}
    return sorted(s for s in out if s >= 1)


def mrc(trace, *, evictions=None, allocations=None, slots: list[int] | None = None,
        budgets: list[float] | None = None, warmup_tokens: int = 0, reset_per_sequence: bool = False,
        jobs: int | None = None, executor: str = "local", progress=None, ci: CI | None = None):
    """Hit-rate curves of a trace (a path or a Routing). Returns (curve, layers) polars frames:
    one row per (eviction, allocation, slots per layer), and per layer. LRU rows cover every size
    1..E (method "stack-distance"); the other evictions the size grid (method "replay"). With ``ci``,
    the curve rows have hit_rate_low/high and the interval settings (ci_level, ci_resamples, ci_unit,
    ci_units, ci_block_steps)."""
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
    units = None
    if ci is not None:
        if warmup_tokens >= routing.n_tokens:
            raise MoesimError(f"warmup_tokens={warmup_tokens} leaves none of the trace's {routing.n_tokens} tokens")
        units = assign(routing.seq, int(warmup_tokens), ci.unit)  # a batch-1 replay's units (simulator/units.py)
        base.update(ci_level=ci.level, ci_resamples=ci.resamples, ci_method=ci.method, ci_unit=units.kind,
                    ci_units=units.n, ci_block_steps=units.block_steps)

    def add(eviction, allocation, sizes, hits, requests, method, interval=None):
        """hits: [L, len(sizes)] per layer and size; requests: [L]; interval: [len(sizes), 2] (--ci)."""
        sizes = np.asarray(sizes, np.int64)
        hits = np.asarray(hits, np.int64).reshape(L, len(sizes))
        req = np.asarray(requests, np.int64)
        common = {"eviction": eviction, "allocation": allocation, "method": method}

        def cols(n):
            return {**{k: [v] * n for k, v in {**base, **common}.items()}}

        tot_h, tot_r = hits.sum(axis=0), int(req.sum())
        extra = {}
        if units is not None:
            iv = np.full((len(sizes), 2), np.nan) if interval is None else np.asarray(interval, np.float64)
            # NaN (a single unit) is stored as null: no interval, not an unknown one
            extra = {"hit_rate_low": pl.Series(iv[:, 0], nan_to_null=True),
                     "hit_rate_high": pl.Series(iv[:, 1], nan_to_null=True)}
        curves.append(pl.DataFrame({
            **cols(len(sizes)), "slots_per_layer": sizes, "budget": sizes / E,
            "capacity": sizes * (L if allocation == "global" else 1), "requests": np.full(len(sizes), tot_r),
            "hits": tot_h, "hit_rate": tot_h / tot_r if tot_r else np.full(len(sizes), np.nan), **extra}))
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
        per_unit = lru_unit_hits(routing, units, warmup_tokens, reset_per_sequence, ci.method) \
            if units is not None and ci is not None else None
        for allocation in allocations:
            key = "per_layer" if allocation == "per-layer" else "pooled"
            iv = hit_rate_intervals(per_unit[key], per_unit["requests"], ci, per_unit[f"{key}_offset"]) \
                if per_unit is not None and ci else None
            add("lru", allocation, np.arange(1, E + 1), lru[key], lru["requests"], "stack-distance", iv)
    configs = [SimConfig(eviction=ev, miss="fetch-all", slots=n, allocation=a, warmup_tokens=warmup_tokens,
                         reset_per_sequence=reset_per_sequence)
               for ev in evictions if ev != "lru" for a in allocations for n in grid]
    work = [Task(str(i), 0, 0, c, str(i)) for i, c in enumerate(configs)]
    if progress:
        progress(0, len(work))
    done = 0
    for key, payload in execute(work, [routing], [None], jobs=jobs, executor=executor, ci=ci):
        c = configs[int(key)]
        lr = payload["layers"]
        iv = None
        if ci is not None:
            sums, offset = payload["units"]["sums"], payload["units"]["offset"]
            iv = hit_rate_intervals(sums[:, [_HITS]], sums[:, _REQUESTS], ci, offset[[_HITS]])
        add(c.eviction, c.allocation, [c.slots], [x["hits"] for x in lr], [x["requests"] for x in lr], "replay", iv)
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


_LAYER_COLUMNS = ("eviction", "allocation", "slots_per_layer", "layer", "hit_rate")


def check_curve_paths(path: str | os.PathLike, inputs=()) -> None:
    """Refuse -o (or its .layers sibling) when it is an input, and a .layers sibling that exists but is no
    curve file's (the user named -o, not it): before any replay runs."""
    for p in curve_paths(path):
        check_output(p, inputs)
    lp = curve_paths(path)[1]
    if lp.exists() and not set(_LAYER_COLUMNS) <= set(_columns(lp)):
        raise MoesimError(f"{lp}: exists and is not the per-layer file of moesim mrc curves; refusing to replace "
                          "it: move it away or pick another -o")


def _columns(path: Path) -> list[str]:
    """The column names of a table file (Parquet schema, CSV header, the keys of JSON rows); [] if it is none.
    pyarrow and the standard library only: polars may panic on a damaged file."""
    import csv
    import json

    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return list(pq.read_schema(path).names)
        with open(path, encoding="utf-8") as f:
            if path.suffix == ".csv":
                return next(csv.reader([f.readline()]), [])
            rows = json.loads(f.read(1 << 28))
        return list(rows[0]) if isinstance(rows, list) and rows and isinstance(rows[0], dict) else []
    except Exception:  # noqa: BLE001 - not readable as that format: not a file mrc wrote
        return []


def write_curves(curve, layers, path: str | os.PathLike, *, inputs=()):
    """NAME.parquet (or .csv/.json) and NAME.layers.<same suffix>: both written before either is
    renamed into place, so a failed write (a full disk) publishes neither."""
    main, lp = curve_paths(path)
    with atomic_files([lp, main], inputs=inputs) as (tmp_layers, tmp_main):
        write_table_to(layers, tmp_layers, lp.suffix)
        write_table_to(curve, tmp_main, main.suffix)
    return main
