"""Policy sweeps: many configs over traces decoded once, run in parallel, stored by key, resumable.

``run_sweep(traces, grid, output="r.parquet")`` decodes each trace once, prices it per (hw, quant),
expands the grid (sweeps/grid.py), skips every (trace, config, cost) already in ``output``, and
replays the rest: in this process (jobs=1), in forked worker processes that share the decoded arrays
copy-on-write (jobs>1, the default: one per core), or as Ray tasks (executor="ray"). Finished rows are
flushed to the store every ``flush_seconds``, on Ctrl-C and at the end; an interrupted sweep rerun
with the same output computes only what is missing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moesim.costmodel.pricing import price_trace
from moesim.errors import MoesimError
from moesim.policies import registry
from moesim.simulator.bootstrap import CI
from moesim.simulator.config import SimConfig
from moesim.simulator.rotation import method_for
from moesim.sweeps import holdout
from moesim.sweeps.executors import EXECUTORS, Task, execute
from moesim.sweeps.grid import PRESET_ENGINES, PRESETS, Grid, expand, never_cached, replay_twin
from moesim.sweeps.inputs import TraceEntry, load_traces
from moesim.sweeps.ranking import annotate
from moesim.sweeps.store import ResultStore, layers_path


@dataclass
class SweepOutcome:
    rows: Any                    # polars DataFrame: this sweep's rows, ranked within groups
    layers: Any                  # polars DataFrame: their per-layer rows
    computed: int
    reused: int
    notes: list[str] = field(default_factory=list)
    output: Path | None = None
    executor_stats: dict = field(default_factory=dict)  # Ray: what was shipped, where tasks ran


def cost_key(cost) -> str:
    if cost is None:
        return "unpriced"
    doc = json.dumps(dataclasses.asdict(cost), sort_keys=True, default=str)
    return hashlib.blake2b(doc.encode(), digest_size=8).hexdigest()


def preset_names(config: SimConfig) -> str:
    """The named presets this config is (its eviction, miss and admission match; presets admit every fetch)."""
    names = [n for n, p in PRESETS.items() if config.prefetch == "none" and config.reroute is None
             and config.admission == "always"
             and (config.eviction, config.miss, config.admit) == (p["eviction"], p["miss"], p["admit"])]
    return ",".join(names)


def policy_label(config: SimConfig) -> str:
    if config.miss == "cpu" and never_cached(config):
        return "no cache / cpu"  # every expert on the CPU: the eviction policy never acts
    parts = [config.eviction, config.miss] + ([f"admit {config.admit:g}"] if config.admit is not None else [])
    if config.admission != "always":
        parts.append(config.admission)
    if config.prefetch != "none":
        parts.append(config.prefetch_label())
    if config.reroute is not None:
        parts.append(config.reroute_label())
    return " / ".join(parts)


def machine_key(cost) -> str:
    """What a group of rows is priced for: model, quantization and machine. The engine profile is not
    part of it: the llama.cpp preset (priced as llama.cpp runs) competes with the other policies."""
    return "unpriced" if cost is None else f"{cost.model}/{cost.quant}/{cost.hw}"


def group_key(digest: str, ck: str, config: SimConfig) -> str:
    size = f"b{config.budget:g}" if config.budget is not None else f"s{config.slots}"
    engine_steps = ((["pin"] if config.step_pin else []) + ([f"u{config.max_uploads}"] if config.max_uploads else [])
                    + ([f"lb{config.lowbit_share:g}"] if config.lowbit_share is not None else []))
    return "|".join([digest, ck, size, config.allocation, f"warm{int(config.warm)}", f"w{config.warmup_tokens}",
                     f"r{int(config.reset_per_sequence)}", f"B{config.batch}", *engine_steps])


def check_config(config: SimConfig, routing) -> None:
    """Fail before any replay starts on a config this trace cannot replay."""
    config.slots_per_layer(routing.n_experts)
    if config.reroute is not None and not routing.meta.has_scores:
        raise MoesimError(f"--reroute {config.reroute} needs the candidates' scores, which this trace does not keep")
    # a depth past the last layer predicts nothing (docs/replay-semantics.md): asked for, it is a mistake; the
    # default depth 1 stays valid on a one-layer trace (the default grid's prefetch rows)
    if config.prefetch != "none" and 1 < config.prefetch_depth >= routing.n_layers:
        raise MoesimError(f"prefetch depth {config.prefetch_depth} reaches past the trace's {routing.n_layers} MoE "
                          f"layers (at most {routing.n_layers - 1})")
    if config.warmup_tokens >= routing.n_tokens:
        raise MoesimError(f"warmup_tokens={config.warmup_tokens} leaves none of the trace's "
                          f"{routing.n_tokens} tokens to count")


def check_stream(config: SimConfig, entry: TraceEntry, executor: str, ci=None) -> None:
    """Fail before any replay starts on what a streamed trace cannot do."""
    if config.speculative and ci is not None:
        raise MoesimError("confidence intervals (--ci) of speculative replays are not modelled: their resampling "
                          "units are tokens, a speculative step verifies several")
    if not entry.streamed:
        return
    if config.speculative:
        raise MoesimError(f"{entry.name}: --speculative replays in memory only; this trace is streamed (too large "
                          "to decode whole, or --stream): use --no-stream, or a shorter trace")
    if ci is not None:
        raise MoesimError(f"{entry.name}: confidence intervals (--ci) need the per-token series of an in-memory "
                          "replay; this trace is streamed (too large to decode whole, or --stream): use --no-stream")
    if registry.get(config.eviction_name).schedules:
        raise MoesimError(f"{entry.name}: {config.eviction_name} reads the whole routing ahead and replays in memory "
                          "only; this trace is streamed (too large to decode whole, or --stream): use --no-stream")
    if config.batch > 1:
        raise MoesimError(f"{entry.name}: --batch replays in memory only; this trace is streamed (too large to "
                          "decode whole, or --stream): use --no-stream, or a shorter trace")
    if executor == "ray":
        raise MoesimError(f"{entry.name}: a streamed trace replays with the local executor only (its decoded "
                          "chunks are on this machine's disk); use --no-stream or --executor local")


def make_rows(task: Task, payload: dict, entry: TraceEntry, cost, note: str, hw, model, quant,
              quant_choice: str = "", *, ci: CI | None = None) -> tuple[dict, list]:
    cfg = task.config
    ck = task.row_key.rsplit(":", 1)[1]
    t = payload["totals"]
    tm = payload["timing"]
    row = {
        "row_key": task.row_key, "trace_digest": entry.digest, "config_key": cfg.key(),
        "grid_key": task.grid_key or cfg.key(), "cost_key": ck,
        "group_key": group_key(entry.digest, machine_key(cost), cfg),
        "trace": entry.name, "model_id": entry.meta.model_id, "synthetic": bool(entry.meta.synthetic),
        "label": cfg.label(), "policy": policy_label(cfg), "preset": preset_names(cfg),
        "eviction": cfg.eviction, "miss": cfg.miss, "admit": cfg.admit, "admission": cfg.admission,
        "budget": cfg.budget, "slots": cfg.slots,
        "slots_per_layer": payload["slots_per_layer"], "allocation": cfg.allocation, "warm": cfg.warm,
        "warmup_tokens": cfg.warmup_tokens, "holdout_tokens": task.holdout,
        "reset_per_sequence": cfg.reset_per_sequence, "batch": cfg.batch,
        "prefetch": cfg.prefetch, "prefetch_depth": cfg.prefetch_depth,
        "overlap": cfg.overlap or (cost.overlap if cost is not None else "none"),
        "step_pin": cfg.step_pin, "max_uploads": cfg.max_uploads, "lowbit_share": cfg.lowbit_share,
        "lowbit_quant": cfg.lowbit_quant, "reroute": cfg.reroute or "none", "reroute_pool": cfg.reroute_pool,
        "reroute_resident": cfg.reroute_resident if cfg.reroute else None,
        "reroute_weights": cfg.reroute_weights if cfg.reroute else None,
        "priced": cost is not None, "priced_as": note,
        "hw": cost.hw if cost is not None else (hw or ""),
        "model": cost.model if cost is not None else (model or ""),
        "quant": cost.quant if cost is not None else (quant or ""),
        "engine": cost.engine if cost is not None else "",
        "quant_choice": quant_choice,
        "counted_tokens": payload["counted_tokens"],
        **t,
    }
    if tm is not None:
        by = tm["bytes_per_token"]
        row.update(
            s_per_token=tm["s_per_token"], ms_per_token=1e3 * tm["s_per_token"], tok_per_s=tm["tok_per_s"],
            stall_per_token=tm["stall_per_token"], gb_per_token_sync=by["link_sync"] / 1e9,
            gb_per_token_background=by["link_background"] / 1e9, gb_per_token_nvme=by["nvme"] / 1e9,
            gb_per_token_cpu=by["cpu"] / 1e9, gb_per_token_vram_experts=by["experts_vram"] / 1e9,
            gb_per_token_prefetch=by["link_prefetch"] / 1e9,
            vram_gib_for_cache=tm["vram_bytes_for_cache"] / 2**30,
            vram_gib_free=tm["vram_bytes_free_for_experts"] / 2**30, fits_in_vram=tm["fits_in_vram"],
            timed_steps=tm["timed_steps"],
        )
    units = payload.get("units")
    if ci is not None and units is not None:
        # the intervals themselves are derived when rows are ranked (sweeps/intervals.py)
        row.update(ci_level=ci.level, ci_resamples=ci.resamples, ci_rule=units["rule"], ci_method=units["method"],
                   ci_unit=units["kind"], ci_units=units["n"], ci_block_steps=units["block_steps"],
                   ci_unit_sums=[float(x) for x in units["sums"].reshape(-1)],
                   ci_offset_sums=[float(x) for x in units["offset"]])
    keys = {"row_key": task.row_key, "trace_digest": entry.digest, "config_key": cfg.key(), "cost_key": ck,
            "label": cfg.label()}
    layers = [{**keys, **lr} for lr in payload["layers"]]
    return row, layers


# ---------------------------------------------------------------------------------------------- the sweep


class _Shield:
    """Ctrl-C while results are being written would land inside polars/pyarrow (and come out as an
    unrelated error): SIGINT is deferred during ``with shield:`` and raised as KeyboardInterrupt
    right after. Elsewhere it interrupts at once. Installed in the main thread only."""

    def __init__(self):
        self.depth = 0
        self.pending = False
        self.previous = None

    def __enter__(self):
        self.depth += 1
        return self

    def __exit__(self, *exc):
        self.depth -= 1
        if self.depth == 0 and self.pending and exc[0] is None:
            self.pending = False
            raise KeyboardInterrupt
        return False

    def _handler(self, signum, frame):
        if self.depth:
            self.pending = True
        else:
            raise KeyboardInterrupt

    def install(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def uninstall(self):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            self.previous = None


def plan(entries: list[TraceEntry], grid: Grid):
    """(tasks, costs, cost_info, notes): every (trace, config, cost) of the sweep, deduplicated.

    Without a quantization, each (trace, machine) is priced at the one chosen for the largest cache the
    grid replays there (costmodel/pricing.py): one model file per machine, whatever the cache size. The default
    grid's rerouting rows are left out unless every trace keeps candidate scores."""
    planned = expand(dataclasses.replace(grid, scored=all(e.meta.has_scores for e in entries)))
    held_out = holdout.fraction(grid.holdout, [p.config for p in planned])
    E = {ti: e.meta.n_experts for ti, e in enumerate(entries)}
    largest: dict[tuple, int] = {}
    for ti, entry in enumerate(entries):
        for p in planned:
            cached = p.config.slots_per_layer(E[ti]) * entry.meta.n_layers
            largest[(ti, p.hw)] = max(largest.get((ti, p.hw), 0), cached)
    costs: list[Any] = []
    cost_info: list[tuple] = []
    notes: list[str] = []
    cost_index: dict[tuple, int] = {}
    tasks: dict[str, Task] = {}
    for ti, entry in enumerate(entries):
        held = holdout.tokens(held_out, entry.n_tokens) if held_out else 0
        for p in planned:
            config = holdout.apply(p.config, held)
            engine = PRESET_ENGINES.get(preset_names(p.config), grid.engine)
            batch = p.config.batch if grid.context else 1  # the batch sizes the KV cache only
            pair = (ti, p.hw, p.quant, engine, batch)
            if pair not in cost_index:
                cost, note, why = price_trace(entry.meta, p.hw, grid.model, p.quant, engine=engine,
                                              cache_experts=largest[(ti, p.hw)], context=grid.context, batch=batch)
                cost_index[pair] = len(costs)
                costs.append(cost)
                cost_info.append((note, p.hw, grid.model, p.quant, why))
                if note not in notes:
                    notes.append(note)
            ci = cost_index[pair]
            ck = cost_key(costs[ci])
            key = f"{entry.digest}:{config.key()}:{ck}"
            twin = replay_twin(config)
            tasks.setdefault(key, Task(key, ti, ci, config, f"{entry.digest}:{twin.key()}:{ck}", held,
                                       p.config.key()))
    return list(tasks.values()), costs, cost_info, notes


def run_sweep(traces, grid: Grid, *, output: str | os.PathLike | None = None, jobs: int | None = None,
              executor: str = "local", progress=None, flush_seconds: float = 2.0,
              rank_by: str = "class", ci: CI | None = None, stream: bool | None = None) -> SweepOutcome:
    """Run (or finish) a sweep; return this sweep's rows ranked within their groups (speed-up over
    ``grid.baseline``; ``rank_by`` as in sweeps/ranking.py). With ``ci``, every row gets confidence
    intervals (docs/uncertainty.md): rows of ``output`` kept without unit sums for ``ci.unit`` are
    replayed again; rows with them are only given ``ci``'s level and resamples.

    ``stream``: replay the traces streamed, a chunk of tokens at a time (None: the traces whose decoded
    arrays would exceed MOESIM_STREAM_MB; see simulator.simulate). A streamed trace is decoded once into
    a temporary folder that every worker reads by itself, and deleted at the end.

    ``progress(done, total)`` is called as configs finish. On KeyboardInterrupt the finished rows are
    flushed to ``output`` before the interrupt propagates."""
    if executor not in EXECUTORS:
        raise MoesimError(f"unknown executor {executor!r} (use {' or '.join(EXECUTORS)})")
    if jobs is not None and jobs < 1:
        raise MoesimError(f"--jobs must be at least 1, got {jobs}")
    entries = load_traces(traces, stream)
    try:
        return _run(entries, grid, output, jobs, executor, progress, flush_seconds, rank_by, ci)
    finally:
        for e in entries:
            e.close()


def _run(entries: list[TraceEntry], grid: Grid, output, jobs, executor: str, progress,
         flush_seconds: float, rank_by: str, ci: CI | None) -> SweepOutcome:
    import polars as pl

    tasks, costs, cost_info, notes = plan(entries, grid)
    inputs = [e.path for e in entries if e.path is not None] + [grid.prefetch_train]
    resuming = output is not None and os.path.exists(output)  # stored rows checked against the traces' token counts
    facts = {e.digest: (e.meta.model_id, e.meta.n_experts, e.n_tokens if resuming else None) for e in entries}
    store = ResultStore(output, inputs=inputs, baseline=grid.baseline, rank_by=rank_by, traces=facts)
    todo = [t for t in tasks if t.row_key not in store or (
        ci is not None and not store.has_units(t.row_key, ci.unit, method_for(replay_twin(t.config), ci.method)))]
    if ci is not None:
        store.relevel({t.row_key for t in tasks}, ci.level, ci.resamples)
    reused = len(tasks) - len(todo)
    waiting: dict[str, list[Task]] = {}
    for t in todo:
        waiting.setdefault(t.replay_key, []).append(t)
    # one replay per distinct replay key, run with the twin config
    work = [dataclasses.replace(ts[0], config=replay_twin(ts[0].config)) for ts in waiting.values()]
    for t in work:
        check_stream(t.config, entries[t.trace], executor, ci)
    routings = [e.source_for(logits=any(t.trace == i and t.config.reroute for t in work))
                if any(t.trace == i for t in work) else None for i, e in enumerate(entries)]
    for t in work:
        check_config(t.config, routings[t.trace])
    executor_stats: dict = {}
    results = execute(work, routings, costs, jobs=jobs, executor=executor, ci=ci, stats=executor_stats)
    done = 0
    last_flush = time.monotonic()
    interrupted = False
    shield = _Shield().install()
    try:
        if progress:
            progress(0, len(todo))
        for rkey, payload in results:
            with shield:
                for task in waiting.pop(rkey):
                    row, layer_rows = make_rows(task, payload, entries[task.trace], costs[task.cost],
                                                *cost_info[task.cost], ci=ci)
                    store.add(row, layer_rows)
                    done += 1
                if time.monotonic() - last_flush >= flush_seconds:
                    store.flush()
                    last_flush = time.monotonic()
            if progress:
                progress(done, len(todo))
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        shield.depth += 1  # a Ctrl-C now cannot cut the last write short (it is dropped: we are stopping)
        try:
            results.close()  # terminates worker pools / shuts Ray down
            store.flush()
        finally:
            shield.uninstall()
        if interrupted and output is not None:
            print(f"moesim: sweep interrupted: {done} of {len(todo)} configs finished and saved in {output}; "
                  "run the same command again to compute only the rest", file=sys.stderr)
    keys = [t.row_key for t in tasks]
    all_rows = store.rows()
    mine = annotate(all_rows.filter(pl.col("row_key").is_in(keys)), grid.baseline, rank_by)
    layers = store.layers().filter(pl.col("row_key").is_in(keys))
    return SweepOutcome(mine, layers, computed=done, reused=reused, notes=notes,
                        output=Path(output) if output is not None else None, executor_stats=executor_stats)


__all__ = ["run_sweep", "SweepOutcome", "Grid", "layers_path"]
