"""`moesim mrc`: hit rate at every cache size (miss-ratio curves)."""

from __future__ import annotations

import click

from moesim.cli.output import Progress, ci_options, echo, make_ci
from moesim.cli.simulate import EVICTION_HELP
from moesim.cli.sweep import FORMAT
from moesim.policies import registry


@click.command("mrc")
@click.argument("trace", type=click.Path(dir_okay=False, path_type=str))
@click.option("--eviction", "-e", multiple=True,
              help=EVICTION_HELP + f" Repeat for several (default: {', '.join(registry.default_evictions())}). "
                                   "LRU is computed in one stack-distance pass at every size; the others are "
                                   "replayed on the size grid.")
@click.option("--allocation", multiple=True, type=click.Choice(["per-layer", "global"]),
              help="Cache per layer and/or one pool shared by all layers (default: both).")
@click.option("--slots-grid", default=None, metavar="N,N,...|START:STOP:STEP",
              help="Slots per layer to replay (and print); default: budgets 1/64 .. 1/2 of E.")
@click.option("--budget-grid", default=None, metavar="F,F,...|START:STOP:STEP",
              help="The size grid as fractions of E instead of slots.")
@click.option("--warmup-tokens", type=int, default=0, show_default=True,
              help="Replay but do not count the first W tokens.")
@click.option("--reset-per-sequence", is_flag=True, help="Empty the cache at each new sequence.")
@FORMAT
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Write the curves (.parquet, .csv or .json) and their per-layer rows to NAME.layers.<suffix>.")
@click.option("--jobs", "-j", type=int, default=None, help="Worker processes for the replays (default: one per core).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="Where the replays run (see moesim sweep).")
@ci_options
def command(trace, eviction, allocation, slots_grid, budget_grid, warmup_tokens, reset_per_sequence, fmt, output,
            jobs, executor, ci, ci_resamples, ci_unit, ci_method):
    """Hit rate of TRACE at every cache size, per eviction policy (fetch-all,
    cold start). LRU: exact at every size from 1 to E slots per layer in one
    pass (stack distances), per layer and for a global pool. Other policies:
    one replay per size of the grid, in parallel. The table shows the grid;
    JSON/CSV/-o hold every row (the full LRU curve).

    Example: moesim mrc traces/qwen3next.parquet --slots-grid 16:256:16
    """
    from moesim.reports.tables import frame_csv, frame_json, mrc_tables, render
    from moesim.sweeps.grid import axis
    from moesim.sweeps.mrc import check_curve_paths, mrc, size_grid, write_curves

    if output:
        check_curve_paths(output, [trace])
    intervals = make_ci(ci, ci_resamples, ci_unit, ci_method)
    slots = axis("slots", slots_grid) if slots_grid else None
    budgets = axis("budgets", budget_grid) if budget_grid else None
    bar = Progress("mrc")
    try:
        curve, layers = mrc(trace, evictions=list(eviction) or None, allocations=list(allocation) or None,
                            slots=slots, budgets=budgets, warmup_tokens=warmup_tokens,
                            reset_per_sequence=reset_per_sequence, jobs=jobs, executor=executor, progress=bar,
                            ci=intervals)
    finally:
        bar.close()
    if output:
        write_curves(curve, layers, output, inputs=[trace])
    if fmt == "json":
        click.echo(frame_json(curve, trace=trace, synthetic=bool(curve["synthetic"].any())))
    elif fmt == "csv":
        click.echo(frame_csv(curve), nl=False)
    else:
        E = int(round(curve["slots_per_layer"][0] / curve["budget"][0]))
        click.echo(render(mrc_tables(curve, size_grid(E, slots, budgets)), fmt))
    if output:
        echo(f"wrote {output} ({curve.height} rows) and its per-layer rows", err=True)
