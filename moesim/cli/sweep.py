"""`moesim sweep`: rank many cache policies on one or more traces, in parallel, resumable."""

from __future__ import annotations

import click

from moesim.cli.output import FINITE, FiniteRange, Progress, ci_options, make_ci
from moesim.cli.simulate import (
    ADMISSION_HELP,
    EVICTION_HELP,
    LOWBIT_QUANT_OPTION,
    LOWBIT_SHARE_OPTION,
    MAX_UPLOADS_OPTION,
    MISS_HELP,
    STEP_PIN_OPTION,
    STREAM_OPTION,
)
from moesim.policies import miss as miss_policies
from moesim.policies import registry

TABLE_FORMATS = ["table", "json", "csv", "markdown", "latex"]
# Not in CSV (lists): the per-unit sums and the offset the intervals come from (Parquet and JSON keep them).
STORAGE_COLUMNS = ("ci_unit_sums", "ci_offset_sums")
WIDTH = 120
FORMAT = click.option("--format", "fmt", type=click.Choice(TABLE_FORMATS), default="table", show_default=True,
                      help="table: ranked terminal table; json/csv: the result rows; markdown/latex: paper tables.")


def print_results(df, fmt: str, top: int | None, header: dict, *, max_mass: float | None = None,
                  wide: bool = False):
    from moesim.reports.tables import frame_csv, frame_json, render, sweep_tables, vs_best
    from moesim.sweeps.ranking import select_rows

    best = vs_best(df)
    shown, dropped = select_rows(df, top if fmt in ("json", "csv") else None, max_mass)
    if fmt == "csv":  # CSV holds no lists
        shown = shown.drop([c for c in STORAGE_COLUMNS if c in shown.columns])
    if fmt == "json":
        click.echo(frame_json(shown, **header))
    elif fmt == "csv":
        click.echo(frame_csv(shown), nl=False)
    else:
        tables = sweep_tables(shown, top, wide=wide, dropped=dropped, best=best)
        click.echo(render(tables, fmt, width=WIDTH if not wide else 0))


@click.command("sweep")
@click.argument("traces", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=str))
@click.option("--budget", "-b", multiple=True, metavar="F",
              help="Cache size as a fraction of each layer's experts; repeat, or a range START:STOP:STEP.")
@click.option("--slots", "-s", multiple=True, metavar="N", help="Cache slots per layer; repeat, or START:STOP:STEP.")
@click.option("--eviction", "-e", multiple=True,
              help=EVICTION_HELP + f" Repeat for several (default: {', '.join(registry.default_evictions())}; "
                                   "static-layers comes with the llama.cpp preset).")
@click.option("--miss", "-m", multiple=True,
              help=MISS_HELP + f" Repeat for several (default: {', '.join(miss_policies.default_misses())}).")
@click.option("--theta", multiple=True, metavar="θ",
              help="Add threshold:θ miss policies (repeat, or START:STOP:STEP).")
@click.option("--admit", multiple=True, metavar="β|none",
              help="Background admission thresholds; 'none' for no admission (default: none and 0.5).")
@click.option("--allocation", multiple=True, type=click.Choice(["per-layer", "global"]),
              help="Cache per layer or one shared pool (default: per-layer); repeat for both.")
@click.option("--batch", multiple=True, metavar="B", help="Decode B sequences in lock step (default 1); repeat.")
@click.option("--warm/--cold", default=None, help="Start with the most requested experts resident (default: cold).")
@click.option("--warmup-tokens", type=int, default=None, help="Replay but do not count the first W tokens.")
@click.option("--reset-per-sequence/--no-reset-per-sequence", default=None,
              help="Empty the cache at each new sequence (default: no).")
@click.option("--admission", default=None, metavar="always|second-touch[:W]",
              help=ADMISSION_HELP + " Every row but the baseline (default: always).")
@click.option("--holdout", type=float, default=None, metavar="F",
              help="Learn the static placements (static, static-domain) from the first fraction F of each trace's "
                   "tokens and count only the tokens after them, in every row: out of sample (default: 0.25 when the "
                   "grid has such a placement, else 0; 0 learns them from the counted tokens themselves).")
@STEP_PIN_OPTION
@MAX_UPLOADS_OPTION
@LOWBIT_SHARE_OPTION
@LOWBIT_QUANT_OPTION
@click.option("--hw", multiple=True, help="Hardware preset or TOML file; repeat to compare machines "
                                          "(default rtx3090-pcie4).")
@click.option("--model", default=None, help="Model preset or TOML file (default: the trace's model).")
@click.option("--quant", multiple=True, help="Quantization(s): bf16, q8_0, q4_k_m, ... (default: the native format if "
                                             "it fits the machine, else Q8_0 or Q4_K_M, for the largest cache; "
                                             "docs/costmodel.md).")
@click.option("--engine", default=None,
              help="Engine profile pricing the grid: ideal, llama.cpp, llama.cpp-expert-cache, mixtral-offloading, "
                   "ktransformers, imp or a TOML file (default: the machine file's [engine], else ideal). The "
                   "llama.cpp preset is always priced with the llama.cpp profile.")
@click.option("--speculative", type=click.IntRange(min=0), default=None, metavar="G",
              help="Speculative / multi-token-prediction decoding for every config (the baseline too): a step "
                   "verifies G drafted tokens plus one per sequence; tokens per second count the accepted ones.")
@click.option("--accept", type=click.FloatRange(0.0, 1.0), default=None, metavar="A",
              help="Fraction of drafted tokens accepted (with --speculative).")
@click.option("--context", type=click.IntRange(min=0), default=None,
              help="Tokens of context per sequence: the KV cache of every sequence of a batch takes VRAM and host "
                   "RAM before the expert tiers (default 0: not counted).")
@click.option("--config", "config", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="TOML file declaring the grid (docs/sweep.md); flags given here replace its axes.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Results Parquet (one row per config; per-layer rows in NAME.layers.parquet). Rows already "
                   "in it are not recomputed: rerun an interrupted sweep to finish it.")
@FORMAT
@click.option("--jobs", "-j", type=int, default=None, help="Worker processes (default: one per core).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: forked processes on this machine; ray: Ray tasks (RAY_ADDRESS or a local cluster).")
@click.option("--top", type=click.IntRange(min=1), default=None, help="Print only the best N configs of each group.")
@click.option("--baseline", default=None, metavar="PRESET|EVICTION/MISS[/admit β]",
              help="The config every speed-up divides by, added to every group (default: the fetch-all preset, "
                   "lru/fetch-all: what an offloading engine without a policy runs).")
@click.option("--rank-by", "rank_by", type=click.Choice(["class", "time"]), default="class", show_default=True,
              help="class: policies that always run the router's first choice first (substituted mass tracks "
                   "perplexity within that class), then time per token; time: time per token alone.")
@click.option("--max-mass", "max_mass", type=FiniteRange(min=0.0), default=None, metavar="M",
              help="Print only configs that substitute or drop at most M gate mass per (token, layer) step.")
@click.option("--wide", is_flag=True,
              help="Print every column (first-choice substitutions, GB per token, VRAM); the default fits 120 "
                   "columns.")
@click.option("--flush-every", type=FiniteRange(min=0.0), default=2.0, show_default=True, metavar="SECONDS",
              help="Save finished rows to -o at least this often.")
@click.option("--quality", "quality", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Quality results of the trace's model (moesim emulate --grid ... -o): adds measured dppl %, and for "
                   "policies that always fetch the first choice an estimate from the model's mass fit (marked ~).")
@click.option("--max-dppl", type=FINITE, default=None, metavar="X",
              help="With --quality: rank only the configs whose dppl % (measured or estimated) is at most X.")
@click.option("--max-kl", type=FiniteRange(min=0.0), default=None, metavar="X",
              help="With --quality: rank only the emulated configs whose mean next-token KL divergence from the "
                   "unmodified model (nats per token) is at most X.")
@click.option("--report", "report_dir", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Also write the HTML report, charts and paper tables of the first trace to this directory "
                   "(as moesim report does).")
@click.option("--reroute", multiple=True, metavar="bias:λ|keep:J|none",
              help="Rerouting axis (docs/replay-semantics.md, 'Rerouting'); repeat or comma-separate (default: none, "
                   "plus bias 0.1 / 0.25 / 0.5 and keep:2 under lru and freq with fetch-all, on traces with candidate "
                   "scores).")
@click.option("--reroute-pool", "reroute_pool", type=click.IntRange(min=1), default=None, metavar="M",
              help="Candidates a reroute considers (default: every candidate the trace stores).")
@click.option("--reroute-resident", "reroute_resident", default=None, metavar="cache|recent:W",
              help="What counts as resident for rerouting (default: cache).")
@click.option("--reroute-weights", "reroute_weights", type=click.Choice(("original", "biased")), default=None,
              help="The rerouted experts' gate weights (default: original).")
@click.option("--prefetch", multiple=True, metavar="P",
              help="Prefetch axis: none, prev-token, next-layer, lookahead, oracle; repeat or comma-separate "
                   "(default: no prefetch, plus lru + oracle, lru + next-layer and belady + oracle under fetch-all).")
@click.option("--prefetch-depth", type=int, default=None, metavar="D",
              help="Prefetch for the MoE layer D ahead (default 1).")
@click.option("--prefetch-train", type=click.Path(dir_okay=False, path_type=str), default=None, metavar="TRACE",
              help="Learn the next-layer prefetch from this trace (default: the first 10% of the replayed one).")
@click.option("--overlap", type=click.Choice(["none", "layer", "cross-layer"]), default=None,
              help="Copy/compute overlap of the clock (default: each engine profile's; docs/replay-semantics.md).")
@ci_options
@STREAM_OPTION
def command(traces, budget, slots, eviction, miss, theta, admit, allocation, batch, warm, warmup_tokens,
            reset_per_sequence, admission, holdout, step_pin, max_uploads, lowbit_share, lowbit_quant, hw, model,
            quant, engine, speculative, accept, context, config,
            output, fmt, jobs, executor, top, baseline, rank_by, max_mass, wide, flush_every, quality, max_dppl,
            max_kl, report_dir, reroute, reroute_pool, reroute_resident, reroute_weights, prefetch, prefetch_depth,
            prefetch_train, overlap, ci, ci_resamples, ci_unit, ci_method, stream):
    """Replay TRACE(s) through a grid of cache policies and print them ranked:
    policies that always run the router's first choice first, then by time per
    token (by hit rate when the trace cannot be priced), with the speed-up over
    one baseline (--baseline), hit, substitution and drop rates, substituted
    gate mass and a Pareto flag. Each table says the model, quantization and
    machine its times assume, and warns when the cache does not fit in VRAM.

    With only --budget the grid is 6 evictions (lru, lfu, freq, fifo, static,
    belady) x 5 miss policies (fetch-all, threshold:0.15, first-choice,
    substitute, cpu) x admission (none, 0.5) = 60 combinations, of which 36 are
    replayed per budget (admission where it cannot act, substitute without
    admission, and cpu under every eviction but one are left out, docs/sweep.md),
    plus the llama.cpp preset (static-layers + cpu) and three prefetch variants
    under fetch-all (lru + oracle, lru + next-layer, belady + oracle: the lower
    bound on time per token, named under each table): 40 configs. On a trace
    that keeps the candidates' scores, eight reroute variants under fetch-all
    too (lru and freq with bias:0.1, bias:0.25, bias:0.5 and keep:2): 48. The
    presets quality-first, speed-first, fetch-all and llama.cpp are always
    included.

    Example: moesim sweep traces/qwen3next.parquet --budget 0.25 -o results.parquet
    """
    from moesim.sweeps.grid import grid_from_options
    from moesim.sweeps.run import run_sweep
    from moesim.sweeps.store import layers_path

    def given(values):  # a repeatable flag that was not given keeps the file's (or the default) axis
        return list(values) or None

    from moesim.files import note_input

    for path in (*traces, config, prefetch_train, quality):  # read here or in a worker: no output may replace them
        note_input(path)
    if report_dir:  # before the replays: a report that cannot be written fails at once
        from moesim.reports.report import check_destination

        check_destination(report_dir, [output, layers_path(output)] if output else [])  # the report reads -o
    intervals = make_ci(ci, ci_resamples, ci_unit, ci_method)
    qual = None
    if quality:  # read before the replays: a bad file fails at once, and no output may replace it
        from moesim.emulator.quality import read_quality

        qual = read_quality(quality)
    elif max_dppl is not None or max_kl is not None:
        from moesim.errors import MoesimError

        flag = "--max-dppl" if max_dppl is not None else "--max-kl"
        raise MoesimError(f"{flag} needs --quality (measured quality from moesim emulate)")
    grid = grid_from_options(config, budgets=given(budget), slots=given(slots), evictions=given(eviction),
                             misses=given(miss), thetas=given(theta), admits=given(admit),
                             allocations=given(allocation), batches=given(batch), warm=warm,
                             warmup_tokens=warmup_tokens, reset_per_sequence=reset_per_sequence, hws=given(hw),
                             model=model, quants=given(quant), engine=engine, baseline=baseline,
                             prefetches=given(prefetch), prefetch_depth=prefetch_depth, prefetch_train=prefetch_train,
                             overlap=overlap, step_pin=step_pin, max_uploads=max_uploads, lowbit_share=lowbit_share,
                             lowbit_quant=lowbit_quant, context=context, speculative=speculative, accept=accept,
                             reroutes=given(reroute), reroute_pool=reroute_pool, reroute_resident=reroute_resident,
                             reroute_weights=reroute_weights, admission=admission, holdout=holdout)
    with Progress("sweep") as bar:
        out = run_sweep(list(traces), grid, output=output, jobs=jobs, executor=executor, progress=bar,
                        flush_seconds=flush_every, rank_by=rank_by, ci=intervals, stream=stream)
    df = out.rows
    if qual is not None:
        from moesim.sweeps.quality import attach_quality, within

        df = attach_quality(df, qual, source=quality)
        if max_dppl is not None or max_kl is not None:
            df = within(df, max_dppl, max_kl, baseline=grid.baseline, rank_by=rank_by)
    synthetic = bool(df["synthetic"].any()) if df.height else False

    def distinct(col):
        return sorted({v for v in df[col].to_list() if v}) if df.height else []

    header = {"traces": list(traces), "synthetic": synthetic, "ranked_by": distinct("ranked_by"),
              "baseline": distinct("baseline"), "priced_as": out.notes, "quant_choice": distinct("quant_choice"),
              "fits_in_vram": bool(df["fits_in_vram"].fill_null(True).all()) if df.height else True,
              "max_mass": max_mass,
              "holdout_tokens": sorted({v for v in df["holdout_tokens"].to_list() if v}) if df.height else []}
    from moesim.reports.tables import ci_header, lower_bound

    groups: dict[str, list[dict]] = {}
    for r in df.to_dicts():
        groups.setdefault(r["group_key"], []).append(r)
    bounds = [b for b in map(lower_bound, groups.values()) if b is not None]
    if bounds:
        header["lower_bound"] = bounds  # belady + oracle prefetch: the lower bound on time per token
    account = ci_header(df)  # rows of -o replayed with --ci keep their intervals in a later run without it
    if account is not None:
        header["ci"] = account
    print_results(df, fmt, top, header, max_mass=max_mass, wide=wide)
    if executor == "ray" and out.computed:
        from moesim.sweeps.executors import ray_summary

        click.echo(ray_summary(out.executor_stats), err=True)
    if out.output:
        click.echo(f"{len(df)} configs: {out.computed} computed, {out.reused} already in {out.output}; results in "
                   f"{out.output} and {layers_path(out.output)}", err=True)
    else:
        click.echo(f"{len(df)} configs computed (not saved: add -o results.parquet to keep them and resume)",
                   err=True)
    if report_dir:
        from moesim.reports.report import build_report

        build_report(report_dir, results=out.output or out, trace=traces[0], baseline=grid.baseline, ci=intervals)
        click.echo(f"report: {report_dir}/index.html", err=True)
