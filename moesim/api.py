"""The Python API: the CLI's commands as functions returning polars DataFrames.

    import moesim
    routing = moesim.load_trace("traces/qwen3next.parquet")      # decode once
    df = moesim.sweep(routing, budgets=[0.125, 0.25])             # ranked, one row per config
    one = moesim.simulate(routing, eviction="freq", miss="threshold:0.15", admit=0.5, budget=0.25)
    curve = moesim.mrc(routing, evictions=["lru", "belady"])

Every function takes a trace path or a decoded Routing (decode once, reuse). The rows have the
same columns as the sweep's results.parquet (docs/sweep.md lists them). For the raw replay
(counters per layer and per token) use ``moesim.simulator.simulate``, which returns a SimResult.
"""

from __future__ import annotations

import os

from moesim.errors import MoesimError


def _ci(ci, resamples: int | None, unit: str, method: str = "rotated"):
    """A CI from the functions' ``ci=`` (a level in percent, or a CI) and ``ci_resamples``/``ci_unit``/
    ``ci_method``."""
    if ci is None:
        return None
    from moesim.simulator.bootstrap import CI, DEFAULT_RESAMPLES

    if isinstance(ci, CI):
        return ci
    if isinstance(ci, bool) or not isinstance(ci, (int, float)):
        raise MoesimError(f"ci must be a confidence level in percent (e.g. 95), got {ci!r}")
    return CI(level=float(ci), resamples=DEFAULT_RESAMPLES if resamples is None else resamples, unit=unit,
              method=method)


def load_trace(path: str | os.PathLike, *, candidates: int | None = None):
    """Read, validate and decode a trace into a Routing (the arrays every replay shares). Decoded
    arrays are cached on disk by the file's content digest (MOESIM_DECODE_CACHE=0 turns it off)."""
    from moesim.traces.decode_cache import load_decoded

    return load_decoded(path, candidates=candidates)


def sweep(trace, *, budgets=None, slots=None, evictions=None, misses=None, thetas=None, admits=None,
          allocations=None, batches=None, warm: bool | None = None, warmup_tokens: int | None = None,
          reset_per_sequence: bool | None = None, step_pin: bool | None = None, max_uploads: int | None = None,
          lowbit_share: float | None = None, lowbit_quant: str | None = None, hw=None, model: str | None = None,
          quant=None, config=None,
          output: str | os.PathLike | None = None, jobs: int | None = None, executor: str = "local",
          top: int | None = None, layers: bool = False, presets: bool = True, baseline: str | None = None,
          rank_by: str = "class", max_mass: float | None = None, ci=None, ci_resamples: int | None = None,
          ci_unit: str = "auto", ci_method: str = "rotated", stream: bool | None = None, prefetches=None,
          prefetch_depth: int | None = None, prefetch_train: str | None = None, overlap: str | None = None,
          engine: str | None = None, context: int | None = None, speculative: int | None = None,
          accept: float | None = None, admission: str | None = None, holdout: float | None = None):
    """Rank a grid of policies on one trace (path or Routing) or a list of them, like ``moesim sweep``.

    Axes take a value or a list (budgets also a range "0.05:0.5:0.05" or {"start", "stop", "step"});
    None means the default axis (the registry's default evictions and miss policies; admission none
    and 0.5). ``admits`` may contain None (no admission). ``config`` is a TOML path or a dict with the
    same keys; the keyword arguments override its axes. ``presets=False`` leaves out the named presets
    (the CLI always includes them). ``output`` keeps results in a keyed Parquet (rerunning computes only
    what is missing). Returns the rows ranked within each group (see docs/sweep.md), best first:
    ``rank_by="class"`` lists the policies that always run the router's first choice first, "time" ranks
    by time alone; ``speedup`` divides the time per token of ``baseline`` (default: the fetch-all preset;
    or "EVICTION/MISS[/admit β]") by the row's. ``max_mass`` keeps the configs within that substituted
    mass per step; ``top`` the best N of each group; ``layers=True`` returns (rows, per-layer rows).
    ``ci=95`` adds 95% confidence intervals: ``<statistic>_low``/``_high`` columns, ``overlaps_best`` and the
    ci_* settings (docs/uncertainty.md); ``ci_resamples`` (default 1000), ``ci_unit`` (auto, sequence,
    block) and ``ci_method`` (rotated, single) as --ci-resamples, --ci-unit and --ci-method. ``stream``: replay a
    chunk of tokens at a time (None: traces too large to decode whole; docs/sweep.md). ``prefetches`` (a prefetch
    policy or a list: none, prev-token, next-layer, lookahead, oracle) is an axis (None: no prefetch plus the
    default grid's three prefetch variants), ``prefetch_depth``/``prefetch_train`` as --prefetch-depth and
    --prefetch-train; ``overlap`` (none, layer, cross-layer; None: the engine profile's) and ``engine`` price
    the clock (docs/replay-semantics.md); ``context`` (tokens per sequence) sizes the KV cache that VRAM and host RAM
    hold before the expert tiers; ``speculative``/``accept``: every config's steps verify G drafted tokens per
    sequence, A of them accepted. ``admission`` (always, second-touch[:W]) and ``holdout`` (the fraction of each
    trace learned static placements learn from, not counted; None: 0.25 when the grid has one) as --admission and
    --holdout."""
    import polars as pl

    from moesim.sweeps.grid import grid_from_options
    from moesim.sweeps.run import run_sweep

    grid = grid_from_options(config, budgets=budgets, slots=slots, evictions=evictions, misses=misses,
                             thetas=thetas, admits=admits, allocations=allocations, batches=batches, warm=warm,
                             warmup_tokens=warmup_tokens, reset_per_sequence=reset_per_sequence, hws=hw,
                             model=model, quants=quant, presets=presets, baseline=baseline, prefetches=prefetches,
                             prefetch_depth=prefetch_depth, prefetch_train=prefetch_train, overlap=overlap,
                             engine=engine, step_pin=step_pin, max_uploads=max_uploads, lowbit_share=lowbit_share,
                             lowbit_quant=lowbit_quant, context=context, speculative=speculative, accept=accept,
                             admission=admission, holdout=holdout)
    out = run_sweep(trace, grid, output=output, jobs=jobs, executor=executor, rank_by=rank_by,
                    ci=_ci(ci, ci_resamples, ci_unit, ci_method), stream=stream)
    from moesim.sweeps.ranking import select_rows

    rows, _ = select_rows(out.rows, top, max_mass)
    if layers:
        return rows, out.layers.filter(pl.col("row_key").is_in(rows["row_key"].to_list()))
    return rows


def simulate(trace, *, eviction: str = "lru", miss: str = "fetch-all", admit: float | None = None,
             budget: float | None = None, slots: int | None = None, allocation: str = "per-layer",
             warm: bool = False, warmup_tokens: int = 0, reset_per_sequence: bool = False, batch: int = 1,
             step_pin: bool = False, max_uploads: int | None = None, lowbit_share: float | None = None,
             lowbit_quant: str | None = None, hw: str | None = None, model: str | None = None,
             quant: str | None = None, layers: bool = False,
             baseline: str = "fetch-all", ci=None, ci_resamples: int | None = None, ci_unit: str = "auto",
             ci_method: str = "rotated", stream: bool | None = None, prefetch: str = "none", prefetch_depth: int = 1,
             prefetch_train: str | None = None, overlap: str | None = None, engine: str | None = None,
             context: int = 0, speculative: int = 0, accept: float | None = None):
    """Replay one policy, like ``moesim simulate``: a one-row DataFrame with the sweep's columns
    (the speed-up over ``baseline`` included when the trace is priced). ``layers=True`` returns (row,
    per-layer rows). ``ci=95`` fills the interval columns, as in ``sweep``; ``stream`` too.
    ``prefetch``, ``prefetch_depth``, ``prefetch_train``, ``overlap``, ``engine`` and ``context`` as the CLI's
    options; ``speculative``/``accept`` (G drafted tokens per step, A of them accepted) too.
    The raw replay (counters per layer and per token) is ``moesim.simulator.simulate``."""
    from moesim.simulator.config import SimConfig
    from moesim.sweeps.single import simulate_one

    if budget is None and slots is None:
        raise MoesimError("give budget= (fraction of experts) or slots= (per layer)")
    config = SimConfig(eviction=eviction, miss=miss, admit=admit, budget=budget, slots=slots, allocation=allocation,
                       warm=warm, warmup_tokens=warmup_tokens, reset_per_sequence=reset_per_sequence, batch=batch,
                       prefetch=prefetch, prefetch_depth=prefetch_depth, prefetch_train=prefetch_train, overlap=overlap,
                       step_pin=step_pin, max_uploads=max_uploads, lowbit_share=lowbit_share, lowbit_quant=lowbit_quant,
                       speculative=speculative, accept=accept)
    one = simulate_one(trace, config, hw=hw, model=model, quant=quant, engine=engine, baseline=baseline,
                       ci=_ci(ci, ci_resamples, ci_unit, ci_method), stream=stream, context=context)
    return (one.row, one.layers) if layers else one.row


def mrc(trace, *, evictions=None, allocations=None, slots=None, budgets=None, warmup_tokens: int = 0,
        reset_per_sequence: bool = False, jobs: int | None = None, executor: str = "local", layers: bool = False,
        ci=None, ci_resamples: int | None = None, ci_unit: str = "auto", ci_method: str = "rotated"):
    """Hit rate at every cache size, like ``moesim mrc``: one row per (eviction, allocation, slots per
    layer). LRU covers every size 1..E exactly (one stack-distance pass); other evictions are
    replayed at ``slots`` / ``budgets`` (default budgets 1/64 .. 1/2). ``layers=True`` returns
    (curve, per-layer rows). ``ci=95`` adds hit_rate_low/high and the ci_* settings to the curve rows."""
    from moesim.sweeps.grid import axis
    from moesim.sweeps.mrc import mrc as _mrc

    def values(x):
        return None if x is None else ([x] if isinstance(x, (str, int, float)) else list(x))

    curve, lay = _mrc(trace, evictions=values(evictions), allocations=values(allocations),
                      slots=axis("slots", values(slots)) if slots is not None else None,
                      budgets=axis("budgets", values(budgets)) if budgets is not None else None,
                      warmup_tokens=warmup_tokens, reset_per_sequence=reset_per_sequence, jobs=jobs,
                      executor=executor, ci=_ci(ci, ci_resamples, ci_unit, ci_method))
    return (curve, lay) if layers else curve
