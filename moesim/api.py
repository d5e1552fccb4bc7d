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

import dataclasses
import os

from moesim.errors import MoesimError


def load_trace(path: str | os.PathLike, *, candidates: int | None = None):
    """Read, validate and decode a trace into a Routing (the arrays every replay shares). Decoded
    arrays are cached on disk by the file's content digest (MOESIM_DECODE_CACHE=0 turns it off)."""
    from moesim.simulator.trace_cache import load_decoded

    return load_decoded(path, candidates=candidates)


def _listify(x):
    if x is None:
        return None
    if isinstance(x, (str, int, float)):
        return [x]
    return list(x)


def _grid(config, budgets, slots, evictions, misses, thetas, admits, allocations, batches, warm, warmup_tokens,
          reset_per_sequence, hw, model, quant, presets=True):
    from moesim.simulator.grid import Grid, axis, grid_from_doc, load_toml

    if isinstance(config, dict):
        grid = grid_from_doc(config)
    else:
        grid = load_toml(config) if config else Grid()

    def ax(name, v):
        v = _listify(v)
        return axis(name, v) if v else None

    admits_l = None if admits is None else ["none" if a is None else a for a in _listify(admits)]
    if misses is not None and not _listify(misses):
        grid = dataclasses.replace(grid, misses=[])  # an explicitly empty miss axis: only thetas
    return grid.override(budgets=ax("budgets", budgets), slots=ax("slots", slots),
                         evictions=ax("evictions", evictions), misses=ax("misses", misses),
                         thetas=ax("thetas", thetas), admits=ax("admits", admits_l),
                         allocations=_listify(allocations), batches=ax("batches", batches), warm=warm,
                         warmup_tokens=warmup_tokens, reset_per_sequence=reset_per_sequence,
                         hws=_listify(hw), model=model, quants=_listify(quant), presets=presets)


def sweep(trace, *, budgets=None, slots=None, evictions=None, misses=None, thetas=None, admits=None,
          allocations=None, batches=None, warm: bool | None = None, warmup_tokens: int | None = None,
          reset_per_sequence: bool | None = None, hw=None, model: str | None = None, quant=None, config=None,
          output: str | os.PathLike | None = None, jobs: int | None = None, executor: str = "local",
          top: int | None = None, layers: bool = False, presets: bool = True):
    """Rank a grid of policies on one trace (path or Routing) or a list of them, like ``moesim sweep``.

    Axes take a value or a list (budgets also a range "0.05:0.5:0.05" or {"start", "stop", "step"});
    None means the default axis (every eviction; fetch-all, threshold:0.15, first-choice, substitute,
    cpu; admission none and 0.5). ``admits`` may contain None (no admission). ``config`` is a TOML path
    or a dict with the same keys; the keyword arguments override its axes. ``presets=False`` leaves out
    the named presets (the CLI always includes them). ``output`` keeps results in
    a keyed Parquet (rerunning computes only what is missing). Returns the rows ranked within each
    group (see docs/sweep.md), best first; ``top`` keeps the best N of each group; ``layers=True``
    returns (rows, per-layer rows)."""
    import polars as pl

    from moesim.simulator.sweep import run_sweep

    grid = _grid(config, budgets, slots, evictions, misses, thetas, admits, allocations, batches, warm,
                 warmup_tokens, reset_per_sequence, hw, model, quant, presets)
    out = run_sweep(trace, grid, output=output, jobs=jobs, executor=executor)
    rows = out.rows
    if top:
        rows = rows.filter(pl.col("rank") <= top)
    if layers:
        return rows, out.layers.filter(pl.col("row_key").is_in(rows["row_key"].to_list()))
    return rows


def simulate(trace, *, eviction: str = "lru", miss: str = "fetch-all", admit: float | None = None,
             budget: float | None = None, slots: int | None = None, allocation: str = "per-layer",
             warm: bool = False, warmup_tokens: int = 0, reset_per_sequence: bool = False, batch: int = 1,
             hw: str | None = None, model: str | None = None, quant: str | None = None, layers: bool = False):
    """Replay one policy, like ``moesim simulate``: a one-row DataFrame with the sweep's columns
    (speed-up vs fetch-all with the same eviction included when the trace is priced).
    ``layers=True`` returns (row, per-layer rows)."""
    if budget is None and slots is None:
        raise MoesimError("give budget= (fraction of experts) or slots= (per layer)")
    rows = sweep(trace, budgets=budget, slots=slots, evictions=[eviction], misses=[miss], admits=[admit],
                 allocations=[allocation], batches=[batch], warm=warm, warmup_tokens=warmup_tokens,
                 reset_per_sequence=reset_per_sequence, hw=hw, model=model, quant=quant, jobs=1, layers=True,
                 presets=False)
    df, lay = rows
    from moesim.simulator.config import SimConfig
    from moesim.simulator.grid import canonical

    want = canonical(SimConfig(eviction=eviction, miss=miss, admit=admit, budget=budget, slots=slots,
                               allocation=allocation, warm=warm, warmup_tokens=warmup_tokens,
                               reset_per_sequence=reset_per_sequence, batch=batch)).key()
    import polars as pl

    one = df.filter(pl.col("config_key") == want)
    if layers:
        return one, lay.filter(pl.col("config_key") == want)
    return one


def mrc(trace, *, evictions=None, allocations=None, slots=None, budgets=None, warmup_tokens: int = 0,
        reset_per_sequence: bool = False, jobs: int | None = None, executor: str = "local", layers: bool = False):
    """Hit rate at every cache size, like ``moesim mrc``: one row per (eviction, allocation, slots per
    layer). LRU covers every size 1..E exactly (one stack-distance pass); other evictions are
    replayed at ``slots`` / ``budgets`` (default budgets 1/64 .. 1/2). ``layers=True`` returns
    (curve, per-layer rows)."""
    from moesim.simulator.grid import axis
    from moesim.simulator.mrc import mrc as _mrc

    curve, lay = _mrc(trace, evictions=_listify(evictions), allocations=_listify(allocations),
                      slots=axis("slots", _listify(slots)) if slots is not None else None,
                      budgets=axis("budgets", _listify(budgets)) if budgets is not None else None,
                      warmup_tokens=warmup_tokens, reset_per_sequence=reset_per_sequence, jobs=jobs,
                      executor=executor)
    return (curve, lay) if layers else curve
