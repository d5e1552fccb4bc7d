"""`moesim emulate`: run a model teacher-forced under cache policies and measure perplexity."""

from __future__ import annotations

import click

from moesim.cli.output import FINITE, echo, echo_json
from moesim.cli.simulate import EVICTION_HELP, MISS_HELP
from moesim.cli.trace import CANDIDATES, DENSE, DOMAINS, MAX_TOKENS, TEXTS

FLUSH_SECONDS = 30.0


@click.command("emulate")
@click.argument("model_dir", type=click.Path(file_okay=False, path_type=str))
@TEXTS
@DOMAINS
@click.option("--eviction", "-e", default="lru", show_default=True, help=EVICTION_HELP)
@click.option("--miss", "-m", default="fetch-all", show_default=True, help=MISS_HELP)
@click.option("--admit", type=FINITE, default=None,
              help="Background admission: a substituted/dropped expert whose gate weights add up to β is admitted "
                   "at the layer's next step.")
@click.option("--budget", "-b", multiple=True, metavar="F",
              help="Cache size as a fraction of each layer's experts (floor(F·E) slots per layer); with --grid, "
                   "repeat for several.")
@click.option("--slots", "-s", multiple=True, metavar="N", help="Cache slots per layer; with --grid, repeat.")
@click.option("--reroute", default=None, metavar="bias:λ|keep:J",
              help="Reroute each step toward resident experts before the cache is asked, inside every MoE layer "
                   "(docs/replay-semantics.md, 'Rerouting'): bias:λ adds λ x the step's logit range to each resident "
                   "candidate's score; keep:J keeps the router's first J and fills the rest from resident candidates.")
@click.option("--reroute-pool", type=int, default=None, metavar="M",
              help="With --reroute: candidates considered (default: every candidate the routing keeps, --candidates).")
@click.option("--reroute-resident", default="cache", show_default=True, metavar="cache|recent:W",
              help="With --reroute: what counts as resident: in the layer's cache, or requested in the last W tokens.")
@click.option("--reroute-weights", type=click.Choice(["original", "biased"]), default="original", show_default=True,
              help="With --reroute: the rerouted experts' gate weights (the emulator runs original: the router's "
                   "unbiased scores renormalized over the new set).")
@click.option("--warm", is_flag=True, help="Start with the most requested experts resident (default: cold).")
@click.option("--warmup-tokens", type=int, default=0, show_default=True,
              help="Replay but do not count the first W tokens in the counters (perplexity counts every token).")
@click.option("--reset-per-sequence", is_flag=True, help="Empty the cache at each window.")
@click.option("--grid", "grid", default=None, metavar="default|presets|FILE.toml",
              help="Emulate many policies in one model load: the sweep's default grid, its presets only, or a "
                   "sweep TOML file (docs/sweep.md), at the --budget/--slots given. -o then writes quality results.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
              help="Where the model runs (default: the first CUDA GPU if any, else the CPU).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default="float32", show_default=True,
              help="Weights and activations.")
@MAX_TOKENS
@click.option("--window", type=int, default=None,
              help="Tokens per teacher-forced window (default: the model's context); longer texts are cut into "
                   "consecutive windows, each scoring its tokens 2..n.")
@CANDIDATES
@DENSE
@click.option("--drop", "drop", type=click.Choice(["renormalize", "zero"]), default="renormalize", show_default=True,
              help="A dropped expert's weight: spread over the step's other experts, or just lost.")
@click.option("--model-id", default=None, help="Model id of the results (default: as the tracer names the model).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="Output format.")
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="One policy: write the routing the emulator saw (closed loop) as a trace. With --grid: the "
                   "quality results Parquet (rows already in it are kept and not recomputed).")
def command(model_dir, texts, domains, eviction, miss, admit, budget, slots, reroute, reroute_pool, reroute_resident,
            reroute_weights, warm, warmup_tokens, reset_per_sequence, grid, device, dtype, max_tokens, window,
            candidates, dense, drop, model_id, fmt, out):
    """Run MODEL_DIR (a local transformers checkpoint) teacher-forced over the --text files with the
    cache policy applied inside every MoE layer, and measure the perplexity it costs: ppl against the
    unmodified model on the same tokens (dppl %), the replay's counters for the routing the model
    produced under the policy (closed loop), and the same policy replayed on the unmodified model's
    routing (open loop, what trace replay sees). Fetch latency is idealized; see docs/emulator.md.

    Example: moesim emulate ~/.cache/moesim/demo-model --text eval_code.txt -e freq -m threshold:0.15
    --admit 0.5 -b 0.25
    """
    from moesim.emulator import policy
    from moesim.emulator.quality import existing_keys, quality_frame, read_quality, write_quality
    from moesim.emulator.run import load_emulator
    from moesim.errors import MoesimError
    from moesim.simulator import SimConfig

    budgets = [float(b) for b in budget]
    slot_list = [int(s) for s in slots]
    if grid is None:
        if len(budgets) + len(slot_list) != 1:
            raise MoesimError("give one cache size: --budget F or --slots N (several only with --grid)")
        configs = [SimConfig(eviction=eviction, miss=miss, admit=admit, warm=warm, warmup_tokens=warmup_tokens,
                             reset_per_sequence=reset_per_sequence, reroute=reroute, reroute_pool=reroute_pool,
                             reroute_resident=reroute_resident, reroute_weights=reroute_weights,
                             **({"budget": budgets[0]} if budgets else {"slots": slot_list[0]}))]
    else:
        if reroute is not None or reroute_pool is not None or reroute_resident != "cache" \
                or reroute_weights != "original":
            raise MoesimError("--reroute and its options qualify one policy: emulate it without --grid (a grid's "
                              "rerouting comes from its configs)")
        if out and not out.endswith(".parquet"):
            raise MoesimError(f"{out}: quality results are written as .parquet")
        configs = configs_from_grid(grid, budgets, slot_list, warm=warm, warmup_tokens=warmup_tokens,
                                    reset_per_sequence=reset_per_sequence)
    for c in configs:
        policy.check_config(c)
    if out:
        from moesim.files import check_output

        # the quality file of --grid is read and extended on purpose (resume); never a model or a text
        check_output(out, [model_dir, *texts])
    em = load_emulator(model_dir, texts, domains=list(domains) or None, dtype=dtype, device=device, window=window,
                       max_tokens=max_tokens, candidates=candidates, dense=dense, drop=drop, model_id=model_id)
    for c in configs:
        c.slots_per_layer(em.meta.n_experts)
    if grid is None:
        run = em.run(configs[0], trace_out=out)
        doc = run.to_dict(em.setup)
        if fmt == "json":
            echo_json(doc)
        else:
            for line in render(doc):
                echo(line)
        if out:
            click.echo(f"wrote {out} (closed-loop routing, {doc['setup']['tokens']} tokens)", err=True)
        return

    import dataclasses
    import time

    import polars as pl

    from moesim.sweeps.grid import replay_twin
    from moesim.sweeps.run import preset_names

    keys = [f"{em.setup.key}:{c.key()}" for c in configs]
    have = (existing_keys(out) or set()) if out else set()
    todo = [c for c, k in zip(configs, keys) if k not in have]
    runs, twins, saved = [], {}, 0
    bar = _Progress("emulate")

    def flush():
        """Save the rows computed so far: an interrupted grid resumes where it stopped."""
        nonlocal saved
        if out and len(runs) > saved:
            df = quality_frame(em.setup, runs[saved:])
            df = df.with_columns(pl.Series("preset", [preset_names(r.config) for r in runs[saved:]], dtype=pl.Utf8))
            write_quality(df, out)
            saved = len(runs)

    last = time.monotonic()
    try:
        for i, c in enumerate(todo):
            twin = replay_twin(c)   # never-cached configs run identically whatever the eviction: one pass
            if twin.key() not in twins:
                twins[twin.key()] = em.run(twin)
            runs.append(dataclasses.replace(twins[twin.key()], config=c))
            bar(i + 1, len(todo))
            if time.monotonic() - last > FLUSH_SECONDS:
                flush()
                last = time.monotonic()
    finally:
        bar.close()
        flush()
    if out:
        click.echo(f"{len(runs)} configs emulated; {out} holds {read_quality(out).height} rows", err=True)
    df = quality_frame(em.setup, runs) if runs else None
    if df is not None:
        df = df.with_columns(pl.Series("preset", [preset_names(r.config) for r in runs], dtype=pl.Utf8))
    if out:   # the grid's rows: those just computed and those already in the file
        df = read_quality(out).filter(pl.col("row_key").is_in(keys))
    _print_grid(df, em, fmt)


def configs_from_grid(spec: str, budgets: list[float], slots: list[int], **scalars):
    """The sweep's grid as configs: ``default`` (every eviction x miss x admission and the presets),
    ``presets`` (the named presets only) or a sweep TOML file; --budget/--slots replace its sizes."""
    import dataclasses
    import os

    from moesim.errors import MoesimError
    from moesim.sweeps.grid import Grid, expand, load_toml

    if spec == "default":
        grid = Grid()
    elif spec == "presets":
        grid = Grid(evictions=[], misses=[], admits=[None])
    elif spec.endswith(".toml") or os.path.exists(spec):
        grid = load_toml(spec)
    else:
        raise MoesimError(f"--grid takes default, presets or a sweep TOML file, got {spec!r}")
    grid = grid.override(budgets=budgets or None, slots=slots or None)
    grid = dataclasses.replace(grid, hws=[None], quants=[None], warm=scalars.get("warm") or grid.warm,
                               warmup_tokens=scalars.get("warmup_tokens") or grid.warmup_tokens,
                               reset_per_sequence=scalars.get("reset_per_sequence") or grid.reset_per_sequence)
    out: dict = {}
    for p in expand(grid):
        out.setdefault(p.config.key(), p.config)
    bad = [c for c in out.values() if c.allocation != "per-layer" or c.batch != 1]
    if bad:
        from moesim.emulator.policy import check_config

        check_config(bad[0])
    if grid.prefetches is None:  # the prefetch variants the grid adds by itself: asked for by no one here
        skipped = [c for c in out.values() if c.prefetch != "none"]
        if skipped:
            names = ", ".join(c.label() for c in skipped)
            echo(f"note: left out the grid's {len(skipped)} prefetch configs ({names}): "
                 "the emulator replays one layer at a time, and under fetch-all a prefetch changes when experts "
                 "arrive, not which run (their quality is the fetch-all row's)", err=True)
        return [c for c in out.values() if c.prefetch == "none"]
    return list(out.values())


class _Progress:
    def __init__(self, label):
        self.label, self.bar, self.shown = label, None, 0

    def __call__(self, done, total):
        import sys

        if not sys.stderr.isatty() or total < 2:
            return
        if self.bar is None:
            self.bar = click.progressbar(length=total, label=self.label, file=sys.stderr, show_pos=True)
            self.bar.__enter__()
        self.bar.update(done - self.shown)
        self.shown = done

    def close(self):
        if self.bar is not None:
            self.bar.__exit__(None, None, None)


def _print_grid(df, em, fmt):
    import json

    if fmt == "json":
        from moesim.cli.output import _plain

        click.echo(json.dumps(_plain({"setup": em.setup.to_dict(), "rows": df.to_dicts()}), indent=2))
        return
    s = em.setup
    echo(f"{s.model_id}: {s.scored_tokens:,} scored tokens in {s.windows} window(s) of <= {s.window}, "
               f"{s.dtype} on {s.device}; baseline ppl {df['ppl_baseline'][0]:.4f}")
    click.echo(f"{'policy':<40} {'size':>10} {'ppl':>10} {'dppl %':>8} {'KL':>8} {'top-1 %':>7} {'mass/step':>10} "
               f"{'open m/step':>11} {'hit %':>6}  class")
    for r in df.sort(["budget", "slots", "dppl_pct"], nulls_last=True).to_dicts():
        size = f"b {r['budget']:g}" if r["budget"] is not None else f"{r['slots']} slots"
        cls = "fetches 1st" if r["fetches_first"] else "substitutes 1st"
        kl = "-" if r.get("kl") is None else f"{r['kl']:.5f}"
        top1 = "-" if r.get("top1_agreement") is None else f"{100 * r['top1_agreement']:.2f}"
        echo(f"{r['policy']:<40} {size:>10} {r['ppl']:10.4f} {r['dppl_pct']:+8.3f} {kl:>8} {top1:>7} "
             f"{r['mass_per_step']:10.4f} {r['open_mass_per_step']:11.4f} {100 * r['hit_rate']:6.1f}  {cls}")


def render(doc: dict) -> list[str]:
    s, t, o = doc["setup"], doc["totals"], doc["open_loop"]
    return [
        f"{s['model_id']} ({s['family']}): {doc['tokens']:,} scored tokens in {s['windows']} window(s) of <= "
        f"{s['window']}, {s['dtype']} on {s['device']}",
        f"policy      {doc['config']['label']}  (drop: {s['drop']})",
        f"perplexity  {doc['ppl']:.4f} vs {doc['ppl_baseline']:.4f} unmodified: {doc['dppl_pct']:+.3f}%",
        f"divergence  KL {doc['kl']:.5f} nats per token from the unmodified model's next-token distribution, "
        f"top-1 agreement {100 * doc['top1_agreement']:.2f}%",
        f"closed loop hit rate {100 * t['hit_rate']:.2f}%, substituted {100 * t['substitution_rate']:.2f}% "
        f"({t['substitutions']:,}), dropped {t['drops']:,}, first choices {t['first_choice_substitutions']:,}, "
        f"mass per step {t['mass_per_step']:.4f}" + (f", low-bit {t['lowbit']:,}" if t.get("lowbit") else ""),
        f"open loop   hit rate {100 * o['hit_rate']:.2f}%, substituted {100 * o['substitution_rate']:.2f}%, mass per "
        f"step {o['mass_per_step']:.4f}; {100 * o['routing_drift']:.2f}% of steps routed differently",
        f"emulated    {doc['emulated']} ({doc['seconds']:.2f} s)",
    ] + ([f"rerouted    {t['rerouted']:,} requests, first choice changed at {t['first_choice_changed']:,} steps, "
          f"displaced mass per step {t['displaced_mass_per_step']:.4f} (open loop "
          f"{o['totals']['displaced_mass_per_step']:.4f})"] if doc["config"].get("reroute") else [])
