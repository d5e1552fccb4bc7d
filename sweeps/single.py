"""One config replayed the way a sweep replays it: the path behind ``moesim simulate`` and
``moesim.simulate`` alike, so that their numbers (speed-up included) are the sweep's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moesim.simulator import SimConfig, SimResult, simulate
from moesim.simulator.bootstrap import CI
from moesim.sweeps.executors import payload
from moesim.sweeps.grid import DEFAULT_BASELINE, Grid, canonical
from moesim.sweeps.inputs import load_traces
from moesim.sweeps.ranking import annotate
from moesim.sweeps.run import check_config, check_stream, make_rows, plan
from moesim.sweeps.schema import LAYER_SCHEMA, ROW_SCHEMA, frame


@dataclass
class One:
    row: Any        # polars DataFrame: the config's sweep row (one row)
    layers: Any     # polars DataFrame: its per-layer rows
    result: SimResult
    priced_as: str
    quant_choice: str


def simulate_one(trace, config: SimConfig, *, hw: str | None = None, model: str | None = None,
                 quant: str | None = None, engine: str | None = None, baseline: str = DEFAULT_BASELINE,
                 ci: CI | None = None, stream: bool | None = None, context: int = 0) -> One:
    """Replay ``config`` on ``trace`` (a path or a Routing), priced by (hw, model, quant) when the trace
    can be priced, together with the speed-up baseline (``baseline``, as in a sweep) its row is compared with.
    With ``ci`` the row has confidence intervals (docs/uncertainty.md), the speed-up's paired with the baseline's.
    ``stream``: as simulator.simulate (None: streamed when the trace is too large to decode whole)."""
    entry = load_traces([trace], stream)[0]
    try:
        return _simulate_one(entry, config, hw, model, quant, engine, baseline, ci, context)
    finally:
        entry.close()


def _simulate_one(entry, config: SimConfig, hw, model, quant, engine, baseline: str, ci, context: int = 0) -> One:
    import polars as pl

    config = canonical(config)
    size = {"budgets": [config.budget]} if config.budget is not None else {"slots": [config.slots]}
    grid = Grid(evictions=[config.eviction], misses=[config.miss], admits=[config.admit],
                allocations=[config.allocation], batches=[config.batch], hws=[hw], model=model, quants=[quant],
                engine=engine, context=context, speculative=config.speculative, accept=config.accept,
                warm=config.warm, warmup_tokens=config.warmup_tokens,
                reset_per_sequence=config.reset_per_sequence, presets=False, baseline=baseline,
                prefetches=[config.prefetch], prefetch_depth=config.prefetch_depth,
                prefetch_train=config.prefetch_train, overlap=config.overlap, step_pin=config.step_pin,
                max_uploads=config.max_uploads, lowbit_share=config.lowbit_share, lowbit_quant=config.lowbit_quant,
                reroutes=[config.reroute], reroute_pool=config.reroute_pool, reroute_resident=config.reroute_resident,
                reroute_weights=config.reroute_weights, admission=config.admission, holdout=0.0, **size)
    tasks, costs, cost_info, notes = plan([entry], grid)
    for task in tasks:
        check_stream(task.config, entry, "local", ci)
    routing = entry.source_for(logits=config.reroute is not None)
    rows, layers, mine = [], [], None
    for task in tasks:
        check_config(task.config, routing)
        # a streamed replay keeps the per-token series (O(T)) of the config itself only
        res = simulate(routing, task.config, cost=costs[task.cost], tokens=not entry.streamed or task.config == config)
        if task.config == config:
            mine = (task.row_key, res)
        done = payload(res, routing=routing, config=task.config, cost=costs[task.cost], ci=ci)
        row, lay = make_rows(task, done, entry, costs[task.cost], *cost_info[task.cost], ci=ci)
        rows.append(row)
        layers.extend(lay)
    assert mine is not None  # the grid holds the config itself
    key, result = mine
    df = annotate(frame(rows, ROW_SCHEMA), baseline).filter(pl.col("row_key") == key)
    lay_df = frame(layers, LAYER_SCHEMA).filter(pl.col("row_key") == key).sort("layer")
    info = next(cost_info[t.cost] for t in tasks if t.row_key == key)
    return One(row=df, layers=lay_df, result=result, priced_as=info[0], quant_choice=info[4])
