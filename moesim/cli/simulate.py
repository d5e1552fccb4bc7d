"""`moesim simulate`: replay a trace through one cache policy."""

from __future__ import annotations

import click

from moesim.cli.output import FINITE, FORMAT_OPTION, WIDTH, ci_options, echo, echo_json, make_ci
from moesim.policies import miss, prefetch, registry

EVICTION_HELP = registry.help_text()
MISS_HELP = miss.help_text()
PREFETCH_HELP = prefetch.help_text()
OVERLAPS = prefetch.OVERLAPS


def policy_options(f):
    """Options shared by the commands that replay one configuration."""
    opts = [
        click.option("--eviction", "-e", default="lru", show_default=True, help=EVICTION_HELP),
        click.option("--miss", "-m", default="fetch-all", show_default=True, help=MISS_HELP),
        click.option("--admit", type=FINITE, default=None,
                     help="Background admission: a substituted/dropped expert whose gate weights add up to "
                          "β is copied into the cache (admitted at the layer's next step)."),
        click.option("--budget", "-b", type=FINITE, default=None,
                     help="Cache size as a fraction of each layer's routed experts: floor(F·E) slots per layer."),
        click.option("--slots", "-s", type=int, default=None, help="Cache slots per layer."),
        click.option("--allocation", type=click.Choice(["per-layer", "global"]), default="per-layer",
                     show_default=True, help="One cache per layer, or one pool of slots·L shared by all layers."),
        click.option("--warm", is_flag=True, help="Start with the most requested experts resident (default: cold)."),
        click.option("--warmup-tokens", type=int, default=0, show_default=True,
                     help="Replay but do not count the first W tokens."),
        click.option("--reset-per-sequence", is_flag=True,
                     help="Empty the cache at each new sequence (default: sequences replay back to back)."),
        click.option("--batch", type=int, default=1, show_default=True,
                     help="Decode B sequences in lock step; each layer reads the union of their experts."),
        click.option("--prefetch", default="none", show_default=True, help=PREFETCH_HELP),
        click.option("--prefetch-depth", type=int, default=1, show_default=True, metavar="D",
                     help="Prefetch for the MoE layer D ahead of the current one (same token)."),
        click.option("--prefetch-train", type=click.Path(dir_okay=False, path_type=str), default=None,
                     metavar="TRACE",
                     help="Learn the next-layer prefetch from this trace (same geometry) instead of the first 10% "
                          "(at most 10,000) tokens of the replayed one."),
        click.option("--overlap", type=click.Choice(OVERLAPS), default=None,
                     help="Copy/compute overlap of the clock: none (each fetch, then its compute), layer (a layer's "
                          "copies overlap its resident compute; the link is synchronized per layer), cross-layer "
                          "(copies also run while later layers compute). Default: the engine profile's "
                          "(docs/replay-semantics.md)."),
        ADMISSION_OPTION, STEP_PIN_OPTION, MAX_UPLOADS_OPTION, LOWBIT_SHARE_OPTION, LOWBIT_QUANT_OPTION,
        SPECULATIVE_OPTION, ACCEPT_OPTION, *REROUTE_OPTIONS,
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


ADMISSION_HELP = ("Which fetched experts are cached: always, or second-touch[:W]: only an expert its pool requested "
                  "before (within its last W requests), else it runs for that use only (docs/replay-semantics.md).")
ADMISSION_OPTION = click.option("--admission", default="always", show_default=True, metavar="always|second-touch[:W]",
                                help=ADMISSION_HELP)
STEP_PIN_OPTION = click.option(
    "--step-pin", is_flag=True, default=None,
    help="Engine step semantics (llama.cpp expert caches, moe-l2): a step's hits run first and its own experts are "
         "not evicted by its misses, which are fetched together (not for arc, s3fifo, sieve, clock; "
         "docs/replay-semantics.md).")
LOWBIT_SHARE_OPTION = click.option(
    "--lowbit-share", type=FINITE, default=None, metavar="F",
    help="Tiered residency: keep floor(F·slots) of each layer's slots as low-bit copies (--lowbit-quant) of the most "
         "requested experts, as many as their bytes allow; a miss with a low-bit copy runs it without a transfer.")
LOWBIT_QUANT_OPTION = click.option(
    "--lowbit-quant", default=None, metavar="Q",
    help="Quantization of the low-bit copies (q2_k, q4_k, q4_k_m, ...; default: lowbit:Q's).")
MAX_UPLOADS_OPTION = click.option(
    "--max-uploads", type=int, default=None, metavar="N",
    help="Admit at most N fetched experts per layer per step (llama.cpp's expert-cache insert cap); further "
         "fetches run for that use only.")


SPECULATIVE_OPTION = click.option(
    "--speculative", type=click.IntRange(min=0), default=0, show_default=True, metavar="G",
    help="Speculative / multi-token-prediction decoding: each step verifies G drafted tokens plus one per sequence, "
         "reading the union of their experts; tokens per second count the accepted tokens (in memory).")
ACCEPT_OPTION = click.option(
    "--accept", type=click.FloatRange(0.0, 1.0), default=None, metavar="A",
    help="Fraction of drafted tokens accepted: a step yields 1 + A·G tokens per sequence (with --speculative).")


def reroute_help() -> str:
    from moesim.policies.reroute import help_text

    return help_text()


REROUTE_OPTIONS = [
    click.option("--reroute", default=None, metavar="bias:λ|keep:J", help=reroute_help()),
    click.option("--reroute-pool", "reroute_pool", type=click.IntRange(min=1), default=None, metavar="M",
                 help="Candidates a reroute considers (at least k; default: every candidate the trace stores)."),
    click.option("--reroute-resident", "reroute_resident", default="cache", show_default=True, metavar="cache|recent:W",
                 help="What counts as resident for --reroute: in the GPU cache, or requested in the last W tokens."),
    click.option("--reroute-weights", "reroute_weights", type=click.Choice(("original", "biased")), default="original",
                 show_default=True, help="The rerouted experts' gate weights: the unbiased scores renormalized over "
                                         "them (as engines do), or the biased ones."),
]


def cost_options(f):
    """--hw/--model/--quant: the machine and model that price a replay."""
    opts = [
        click.option("--hw", default=None,
                     help="Hardware preset or TOML file (moesim hw list; default rtx3090-pcie4)."),
        click.option("--model", default=None,
                     help="Model preset or TOML file (default: the preset matching the trace's model)."),
        click.option("--quant", default=None,
                     help="Quantization: bf16, q8_0, q4_k_m, ... (default: the native format if it fits the machine, "
                          "else Q8_0 or Q4_K_M; docs/costmodel.md)."),
        click.option("--engine", default=None,
                     help="Engine profile that prices the replay: ideal, llama.cpp, llama.cpp-expert-cache, "
                          "mixtral-offloading, ktransformers, imp, or a TOML file (default: the machine file's "
                          "[engine], else ideal)."),
        click.option("--context", type=click.IntRange(min=0), default=0, show_default=True,
                     help="Tokens of context per sequence: the KV cache of every sequence of the batch takes VRAM "
                          "and host RAM before the expert tiers, and each token reads it (docs/costmodel.md)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


STREAM_OPTION = click.option(
    "--stream/--no-stream", default=None,
    help="Replay the trace a chunk of tokens at a time, the cache state carried across chunks, so memory does not "
         "grow with the trace (default: when decoding it whole would take more than MOESIM_STREAM_MB, 512 MB; "
         "chunk size MOESIM_STREAM_TOKENS, default ~32 MB of decoded arrays). Needs rows in token order.")


def make_config(eviction, miss, admit, budget, slots, allocation, warm, warmup_tokens, reset_per_sequence,
                batch=1, prefetch="none", prefetch_depth=1, prefetch_train=None, overlap=None, step_pin=False,
                max_uploads=None, lowbit_share=None, lowbit_quant=None, speculative=0, accept=None,
                admission="always", **reroute):
    from moesim.simulator import SimConfig

    return SimConfig(eviction=eviction, miss=miss, admit=admit, admission=admission, budget=budget, slots=slots,
                     allocation=allocation,
                     warm=warm, warmup_tokens=warmup_tokens, reset_per_sequence=reset_per_sequence, batch=batch,
                     prefetch=prefetch, prefetch_depth=prefetch_depth, prefetch_train=prefetch_train, overlap=overlap,
                     step_pin=bool(step_pin), max_uploads=max_uploads, lowbit_share=lowbit_share,
                     lowbit_quant=lowbit_quant, speculative=speculative, accept=accept, **reroute)


@click.command("simulate")
@click.argument("trace", type=click.Path(dir_okay=False, path_type=str))
@policy_options
@cost_options
@click.option("--per-token", "per_token", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Also write the per-token series (hits, misses, substitutions, mass, ...) to this CSV or "
                   "Parquet file.")
@click.option("--baseline", default="fetch-all", show_default=True, metavar="PRESET|EVICTION/MISS[/admit β]",
              help="The config the speed-up divides by (as in moesim sweep): a preset or a policy.")
@ci_options
@STREAM_OPTION
@FORMAT_OPTION
def command(trace, eviction, miss, admit, budget, slots, allocation, warm, warmup_tokens, reset_per_sequence,
            batch, prefetch, prefetch_depth, prefetch_train, overlap, admission, step_pin, max_uploads, lowbit_share,
            lowbit_quant, speculative, accept, reroute, reroute_pool, reroute_resident, reroute_weights, hw, model,
            quant, engine, context, per_token, baseline, ci, ci_resamples, ci_unit, ci_method, stream, fmt):
    """Replay TRACE through one cache policy and print hit, miss, substitution
    and gate-mass counters, in total and per layer, and the time per token on
    the chosen machine, with the speed-up over the baseline (default: the
    fetch-all preset, lru + fetch-all) at the same cache size, replayed in the
    same run, exactly as a sweep row. Give --budget or --slots.

    Example: moesim simulate traces/qwen3next.parquet -e freq -m threshold:0.15 --admit 0.5 -b 0.25
    """
    from moesim.files import check_output
    from moesim.sweeps.single import simulate_one

    inputs = [trace, prefetch_train]
    if per_token:
        check_output(per_token, inputs)
    config = make_config(eviction, miss, admit, budget, slots, allocation, warm, warmup_tokens, reset_per_sequence,
                         batch, prefetch, prefetch_depth, prefetch_train, overlap, step_pin, max_uploads,
                         lowbit_share, lowbit_quant, speculative, accept, admission=admission, reroute=reroute,
                         reroute_pool=reroute_pool,
                         reroute_resident=reroute_resident, reroute_weights=reroute_weights)
    intervals = make_ci(ci, ci_resamples, ci_unit, ci_method)
    one = simulate_one(trace, config, hw=hw, model=model, quant=quant, engine=engine, baseline=baseline,
                       ci=intervals, stream=stream, context=context)
    result = one.result
    if per_token:
        from moesim.files import write_table

        write_table(result.tokens_frame(), per_token, inputs=inputs)
    row = one.row.row(0, named=True)
    doc = result.to_dict()
    doc["trace"].update(path=trace, model=row["model_id"])
    doc["priced_as"] = one.priced_as
    doc["quant_choice"] = one.quant_choice
    doc["keeps_first_choice"] = row["keeps_first_choice"]
    if result.timing is not None:
        doc["speedup"] = row["speedup"]
        doc["baseline"] = row["baseline"]
    if intervals is not None:
        doc["ci"] = ci_doc(row)
    if fmt == "json":
        echo_json(doc)
        return
    import textwrap

    for line in render(doc):
        # long lines wrap under their value (the labels are 12 characters wide)
        for part in textwrap.wrap(line, WIDTH, subsequent_indent=" " * 12, break_on_hyphens=False) or [""]:
            echo(part)


def ci_doc(row: dict) -> dict:
    """The interval part of simulate's JSON: how the intervals were taken and [low, high] per statistic."""
    from moesim.simulator.bootstrap import ASSUMPTION, SEED
    from moesim.simulator.units import describe
    from moesim.sweeps.schema import INTERVAL_STATISTICS

    units = describe(row["ci_unit"], row["ci_units"], row["ci_block_steps"],
                     "batch step" if row["batch"] > 1 else "token")
    doc = {"level": row["ci_level"], "resamples": row["ci_resamples"], "seed": SEED, "method_used": row["ci_method"],
           "unit": row["ci_unit"],
           "units": row["ci_units"], "block_steps": row["ci_block_steps"], "described": units, "method": ASSUMPTION,
           "intervals": {name: [row[f"{name}_low"], row[f"{name}_high"]] for name in INTERVAL_STATISTICS
                         if row.get(f"{name}_low") is not None}}
    if row["ci_units"] < 2:
        from moesim.reports.tables import single_unit

        doc["no_interval"] = single_unit(row["ci_unit"], units)
    return doc


def _pm(doc: dict, name: str, value, scale: float = 1.0, spec: str = ".2f") -> str:
    """``value`` x ``scale`` formatted, followed by ±half the interval of statistic ``name`` when there is one."""
    text = "-" if value is None else format(value * scale, spec)
    iv = doc.get("ci", {}).get("intervals", {}).get(name)
    if not iv or value is None:
        return text
    return f"{text}±{format((iv[1] - iv[0]) / 2 * scale, spec)}"


def render(doc: dict) -> list[str]:
    t = doc["totals"]
    tag = "SYNTHETIC trace" if doc["trace"]["synthetic"] else "real trace"
    lines = [
        f"{doc['trace']['path']} ({doc['trace']['model']}, {tag})",
        f"policy      {doc['config']['label']}"
        + (f"  ({doc['slots_per_layer']} slots per layer)" if doc["config"]["budget"] is not None else ""),
        f"requests    {t['requests']:,} over {doc['counted_tokens']:,} tokens",
        f"hit rate    {_pm(doc, 'hit_rate', t['hit_rate'], 100)}%   misses {t['misses']:,} = "
        f"fetches {t['fetches']:,} + substituted {t['substitutions']:,} + dropped {t['drops']:,} + cpu {t['cpu']:,}"
        + (f" + low-bit {t['lowbit']:,}" if t.get("lowbit") else ""),
        f"substituted {_pm(doc, 'substitution_rate', t['substitution_rate'], 100)}% of requests, "
        f"dropped {_pm(doc, 'drop_rate', t['drop_rate'], 100)}%, "
        f"first choices substituted or dropped {t['first_choice_substitutions']:,}, "
        f"mass per step {_pm(doc, 'mass_per_step', t['mass_per_step'], 1, '.4f')}",
        "class       " + ("always runs the router's first choice" if doc["keeps_first_choice"]
                          else "may substitute, drop or reroute away from the router's first choice"
                          if doc["config"].get("reroute") else "may substitute or drop the router's first choice"),
        f"admissions  {t['admissions']:,}   evictions {t['evictions']:,}   replay {doc['replay_seconds'] * 1e3:.1f} ms",
    ]
    if doc["config"].get("reroute"):
        at = "member positions" if doc["config"].get("batch", 1) > 1 else "steps"  # batched: counted per member
        lines.append(f"rerouted    {t['rerouted']:,} requests, first choice changed at {t['first_choice_changed']:,} "
                     f"{at}, displaced mass per step {t['displaced_mass_per_step']:.4f} (the router's gate weight "
                     "rerouted away)")
    if doc["config"].get("prefetch", "none") != "none":
        def pct(x):
            return "-" if x != x else f"{100 * x:.1f}%"  # NaN: nothing to divide

        lines.append(f"prefetch    {t['prefetches']:,} issued, {t['prefetch_used']:,} used before eviction, "
                     f"{t['prefetch_late']:,} late: precision {pct(t['prefetch_precision'])} (used / issued), "
                     f"recall {pct(t['prefetch_recall'])} (used / (used + misses)), "
                     f"timeliness {pct(t['prefetch_timeliness'])} (1 - late / used)")
    if "timing" in doc:
        tm = doc["timing"]
        by = tm["bytes_per_token"]
        lines += [
            f"time        {_pm(doc, 'ms_per_token', 1e3 * tm['s_per_token'])} ms/token "
            f"({tm['tok_per_s']:.2f} tok/s, {tm['timed_steps']} steps), "
            f"{_pm(doc, 'speedup', doc['speedup'])}x vs {doc['baseline']}",
            f"priced as   {doc['priced_as']} (quantization {doc['quant_choice']}), overlap {tm['overlap']}, "
            f"stall {1e3 * tm['stall_per_token']:.2f} ms/token",
            f"moved/token link {by['link_sync'] / 1e6:.1f} MB sync + {by['link_background'] / 1e6:.1f} MB background"
            + (f" + {by['link_prefetch'] / 1e6:.1f} MB prefetch" if by.get("link_prefetch") else "") + ", "
            f"NVMe {by['nvme'] / 1e6:.1f} MB, CPU {by['cpu'] / 1e6:.1f} MB",
        ]
        if not tm["fits_in_vram"]:
            lines.append(f"warning     the cache needs {tm['vram_bytes_for_cache'] / 2**30:.1f} GiB of VRAM; "
                         f"{tm['hw']} has {tm['vram_bytes_free_for_experts'] / 2**30:.1f} GiB free for experts")
    else:
        lines.append(f"time        not priced: {doc['priced_as']}")
    if "ci" in doc:
        from moesim.simulator.bootstrap import method_note

        c = doc["ci"]
        lines.append(f"interval    none: {c['no_interval']}" if "no_interval" in c else
                     f"interval    ± = half the {c['level']:g}% interval: percentile bootstrap over {c['described']}"
                     f"{' (few units: a coarse interval)' if c['units'] < 10 else ''}, {c['resamples']} resamples "
                     f"(seed fixed); {method_note(c['method_used'])} (docs/uncertainty.md); the speed-up's is paired "
                     "with the baseline's")
    lines += [
        "",
        f"{'layer':>5} {'hit%':>7} {'fetch':>8} {'subst':>8} {'drop':>7} {'cpu':>8} {'mass/step':>10}",
    ]
    for r in doc["layers"]:
        lines.append(f"{r['layer']:>5} {100 * r['hit_rate']:7.2f} {r['fetches']:8d} {r['substitutions']:8d} "
                     f"{r['drops']:7d} {r['cpu']:8d} {r['mass_per_step']:10.4f}")
    return lines

