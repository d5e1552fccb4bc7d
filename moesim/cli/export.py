"""`moesim export`: a static placement as an engine takes it (llama.cpp flags, a pin list, JSON), or a re-pinning
placement's schedule."""

from __future__ import annotations

import click

from moesim.cli.output import FINITE, echo


@click.command("export")
@click.argument("trace", type=click.Path(dir_okay=False, path_type=str))
@click.option("--budget", "-b", type=FINITE, default=None,
              help="VRAM for experts as a fraction of each layer's routed experts (the same VRAM as floor(F·E) "
                   "slots per layer).")
@click.option("--slots", "-s", type=int, default=None, help="VRAM for experts as cache slots per layer.")
@click.option("--policy", default="static-layers", show_default=True,
              help="static-layers: whole layers on the GPU (llama.cpp --n-cpu-moe / -ot placement); static[:W]: "
                   "the most requested experts of each layer (of the first W tokens), for engines with per-expert "
                   "caches that read pin lists; repin:N[,G] and static-domain[:W]: re-pinning placements, written "
                   "as their schedule (--format json|schedule) or, static-domain with --domain, one domain's table.")
@click.option("--domain", default=None, metavar="NAME",
              help="static-domain: write this domain's table (every pin-list format takes it).")
@click.option("--format", "fmt",
              type=click.Choice(["llama.cpp", "pins", "json", "fitz-tec", "moe-l2", "ktransformers", "schedule"]),
              default="llama.cpp", show_default=True,
              help="llama.cpp: --n-cpu-moe and -ot flags (static-layers only); pins: CSV of (layer, expert) kept on "
                   "the GPU, layers by their original index; json: both, with the expected hit rate and time; "
                   "fitz-tec: its EXPERT_CACHE_PIN_LIST v1; moe-l2: its router map (MOE_L2_ROUTER_FILE); "
                   "ktransformers: its GPU-expert mask, bool [layers, experts] .npy; schedule: a re-pinning "
                   "placement's swaps, CSV of token, layer, expert, in|out (docs/export.md).")
@click.option("--allocation", type=click.Choice(["per-layer", "global"]), default="per-layer", show_default=True,
              help="static: the same number of experts per layer, or the most requested over all layers.")
@click.option("--hw", default=None, help="Hardware preset or TOML file that prices the expected time per token.")
@click.option("--model", default=None, help="Model preset, TOML or GGUF file (default: the trace's model).")
@click.option("--quant", default=None,
              help="Quantization (default: the native format if it fits the machine, else Q8_0 or Q4_K_M; "
                   "docs/costmodel.md).")
@click.option("--engine", default=None,
              help="Engine profile pricing the expected time per token (default: llama.cpp for static-layers, "
                   "the ideal bandwidth model for static).")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=str),
              help="File to write (text for llama.cpp, fitz-tec and moe-l2, CSV for pins, JSON for json, .npy for "
                   "ktransformers).")
@click.option("--ci", "ci", type=FINITE, default=None, metavar="LEVEL",
              help="Also give LEVEL% confidence intervals of the expected hit rate and time (docs/uncertainty.md).")
def command(trace, budget, slots, policy, domain, fmt, allocation, hw, model, quant, engine, output, ci):
    """Write the experts (or whole layers) a static placement keeps on the GPU
    for TRACE, as an engine takes them, and print the hit rate and time per
    token the replay expects of it (misses computed on the CPU). Give --budget
    or --slots. docs/export.md shows how to run the result in llama.cpp.

    Example: moesim export traces/qwen3next.parquet -b 0.25 --format llama.cpp -o flags.txt
    """
    from pathlib import Path

    from moesim.files import check_output
    from moesim.reports.placement import placement, write_placement

    inputs = [trace] + [f for f in (hw, model, engine) if f and Path(f).is_file()]
    check_output(output, inputs)
    from moesim.cli.output import make_ci

    p = placement(trace, budget=budget, slots=slots, policy=policy, allocation=allocation, hw=hw, model=model,
                  quant=quant, engine=engine, ci=make_ci(ci, None, "auto"), domain=domain)
    text = p.render(fmt)  # a llama.cpp export of a per-expert policy fails here, before anything is written
    write_placement(p, fmt, output, inputs=inputs)
    from moesim.reports.placement import with_interval

    e = p.expected
    timed = f", {with_interval(e, 'ms_per_token', 1, '.2f')} ms/token ({e['priced_as']})" \
        if e.get("ms_per_token") is not None else ""
    note = f" (±: half the {e['ci_level']:g}% interval over {e['ci_units']}; docs/uncertainty.md)" \
        if e.get("intervals") else ""
    what = p.policy + (f" ({p.domain} table)" if p.domain else "")
    echo(f"wrote {output}: {what} placement, {p.slots_per_layer} slots per layer; expected hit rate "
         f"{with_interval(e, 'hit_rate', 100, '.1f')}%{timed}{note}")
    if fmt == "llama.cpp":
        click.echo("".join(line + "\n" for line in text.splitlines() if not line.startswith("#")), nl=False)
