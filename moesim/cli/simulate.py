"""`moesim simulate`: replay a trace through one cache policy."""

from __future__ import annotations

import click

from moesim.cli.output import FORMAT_OPTION, WIDTH, echo, echo_json
from moesim.policies import miss, registry

EVICTION_HELP = registry.help_text()
MISS_HELP = miss.help_text()


def policy_options(f):
    """Options shared by the commands that replay one configuration."""
    opts = [
        click.option("--eviction", "-e", default="lru", show_default=True, help=EVICTION_HELP),
        click.option("--miss", "-m", default="fetch-all", show_default=True, help=MISS_HELP),
        click.option("--admit", type=float, default=None,
                     help="Background admission: a substituted/dropped expert whose gate weights add up to "
                          "β is copied into the cache (admitted at the layer's next step)."),
        click.option("--budget", "-b", type=float, default=None,
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
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


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
                     help="Engine profile that prices the replay: ideal (default), llama.cpp, mixtral-offloading, "
                          "ktransformers, or a TOML file."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def make_config(eviction, miss, admit, budget, slots, allocation, warm, warmup_tokens, reset_per_sequence,
                batch=1):
    from moesim.simulator import SimConfig

    return SimConfig(eviction=eviction, miss=miss, admit=admit, budget=budget, slots=slots, allocation=allocation,
                     warm=warm, warmup_tokens=warmup_tokens, reset_per_sequence=reset_per_sequence, batch=batch)


@click.command("simulate")
@click.argument("trace", type=click.Path(dir_okay=False, path_type=str))
@policy_options
@cost_options
@click.option("--per-token", "per_token", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Also write the per-token series (hits, misses, substitutions, mass, ...) to this CSV or "
                   "Parquet file.")
@click.option("--baseline", default="fetch-all", show_default=True, metavar="PRESET|EVICTION/MISS[/admit β]",
              help="The config the speed-up divides by (as in moesim sweep): a preset or a policy.")
@FORMAT_OPTION
def command(trace, eviction, miss, admit, budget, slots, allocation, warm, warmup_tokens, reset_per_sequence,
            batch, hw, model, quant, engine, per_token, baseline, fmt):
    """Replay TRACE through one cache policy and print hit, miss, substitution
    and gate-mass counters, in total and per layer, and the time per token on
    the chosen machine, with the speed-up over the baseline (default: the
    fetch-all preset, lru + fetch-all) at the same cache size, replayed in the
    same run, exactly as a sweep row. Give --budget or --slots.

    Example: moesim simulate traces/qwen3next.parquet -e freq -m threshold:0.15 --admit 0.5 -b 0.25
    """
    from moesim.files import check_output
    from moesim.sweeps.single import simulate_one

    if per_token:
        check_output(per_token, [trace])
    config = make_config(eviction, miss, admit, budget, slots, allocation, warm, warmup_tokens, reset_per_sequence,
                         batch)
    one = simulate_one(trace, config, hw=hw, model=model, quant=quant, engine=engine, baseline=baseline)
    result = one.result
    if per_token:
        from moesim.files import write_table

        write_table(result.tokens_frame(), per_token, inputs=[trace])
    row = one.row.row(0, named=True)
    doc = result.to_dict()
    doc["trace"].update(path=trace, model=row["model_id"])
    doc["priced_as"] = one.priced_as
    doc["quant_choice"] = one.quant_choice
    doc["keeps_first_choice"] = row["keeps_first_choice"]
    if result.timing is not None:
        doc["speedup"] = row["speedup"]
        doc["baseline"] = row["baseline"]
    if fmt == "json":
        echo_json(doc)
        return
    import textwrap

    for line in render(doc):
        # long lines wrap under their value (the labels are 12 characters wide)
        for part in textwrap.wrap(line, WIDTH, subsequent_indent=" " * 12, break_on_hyphens=False) or [""]:
            echo(part)


def render(doc: dict) -> list[str]:
    t = doc["totals"]
    tag = "SYNTHETIC trace" if doc["trace"]["synthetic"] else "real trace"
    lines = [
        f"{doc['trace']['path']} ({doc['trace']['model']}, {tag})",
        f"policy      {doc['config']['label']}"
        + (f"  ({doc['slots_per_layer']} slots per layer)" if doc["config"]["budget"] is not None else ""),
        f"requests    {t['requests']:,} over {doc['counted_tokens']:,} tokens",
        f"hit rate    {100 * t['hit_rate']:.2f}%   misses {t['misses']:,} = fetches {t['fetches']:,} + "
        f"substituted {t['substitutions']:,} + dropped {t['drops']:,} + cpu {t['cpu']:,}",
        f"substituted {100 * t['substitution_rate']:.2f}% of requests, dropped {100 * t['drop_rate']:.2f}%, "
        f"first choices substituted or dropped {t['first_choice_substitutions']:,}, "
        f"mass per step {t['mass_per_step']:.4f}",
        "class       " + ("always runs the router's first choice" if doc["keeps_first_choice"]
                          else "may substitute or drop the router's first choice"),
        f"admissions  {t['admissions']:,}   evictions {t['evictions']:,}   replay {doc['replay_seconds'] * 1e3:.1f} ms",
    ]
    if "timing" in doc:
        tm = doc["timing"]
        by = tm["bytes_per_token"]
        lines += [
            f"time        {1e3 * tm['s_per_token']:.2f} ms/token "
            f"({tm['tok_per_s']:.2f} tok/s, {tm['timed_steps']} steps), "
            f"{_times(doc['speedup'])} vs {doc['baseline']}",
            f"priced as   {doc['priced_as']} (quantization {doc['quant_choice']})",
            f"moved/token link {by['link_sync'] / 1e6:.1f} MB sync + {by['link_background'] / 1e6:.1f} MB background, "
            f"NVMe {by['nvme'] / 1e6:.1f} MB, CPU {by['cpu'] / 1e6:.1f} MB",
        ]
        if not tm["fits_in_vram"]:
            lines.append(f"warning     the cache needs {tm['vram_bytes_for_cache'] / 2**30:.1f} GiB of VRAM; "
                         f"{tm['hw']} has {tm['vram_bytes_free_for_experts'] / 2**30:.1f} GiB free for experts")
    else:
        lines.append(f"time        not priced: {doc['priced_as']}")
    lines += [
        "",
        f"{'layer':>5} {'hit%':>7} {'fetch':>8} {'subst':>8} {'drop':>7} {'cpu':>8} {'mass/step':>10}",
    ]
    for r in doc["layers"]:
        lines.append(f"{r['layer']:>5} {100 * r['hit_rate']:7.2f} {r['fetches']:8d} {r['substitutions']:8d} "
                     f"{r['drops']:7d} {r['cpu']:8d} {r['mass_per_step']:10.4f}")
    return lines


def _times(x) -> str:
    return "-" if x is None else f"{x:.2f}x"
