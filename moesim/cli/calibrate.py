"""`moesim calibrate`: fit a machine file's free factors and an engine's costs to measured runs."""

from __future__ import annotations

import click

from moesim.cli.output import echo_kv


@click.command("calibrate")
@click.argument("runs", type=click.Path(exists=True, dir_okay=False, path_type=str))
@click.option("--hw", required=True, help="The machine file (or preset) the runs were measured on.")
@click.option("--model", default=None, help="Model preset or file for llama-bench rows (they name only the arch).")
@click.option("--engine", default=None,
              help="Engine profile of the cache runs (rows with vram_hit): default the machine file's [engine], "
                   "else llama.cpp-expert-cache. Placement runs are llama.cpp's.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=str), required=True,
              help="Calibrated machine file to write (never overwrites an existing file).")
def command(runs, hw, model, engine, output):
    """Fit a machine to RUNS: llama-bench output, or a CSV with columns model, quant, tok_s and either placement
    (vram, cpu, n-cpu-moe=N: runs of llama.cpp, which fit the VRAM and CPU expert rates) or vram_hit (runs of an
    engine with a dynamic expert cache at a measured hit rate, which fit a fixed cost per decode step and one per
    missed expert; two runs at different hit rates are enough). Prints residuals before and after and writes the
    calibrated machine file (fitted numbers say `fitted:`): `moesim estimate --hw FILE --vram-hit F` then predicts
    other cache sizes with the fitted engine."""
    from pathlib import Path

    from moesim.costmodel.calibrate import fit, machine_doc, read_runs
    from moesim.costmodel.tomlout import dumps
    from moesim.errors import MoesimError
    from moesim.files import write_text

    if Path(output).exists():
        raise MoesimError(f"{output} exists; choose a new file name")
    rs = read_runs(runs, model)
    if not rs:
        raise MoesimError(f"{runs}: no decode (tg) runs found")
    res = fit(rs, hw, engine)
    for r, b, a in zip(rs, res["residuals_before"], res["residuals_after"]):
        what = f"vram_hit {r['vram_hit']:.3g}" if "vram_hit" in r else r["placement"]
        click.echo(f"{r['model']} {r['quant']} {what}: measured {r['tok_s']:.4g} tok/s, "
                   f"ln(predicted/measured) {b:+.3f} -> {a:+.3f}")
    write_text(dumps(machine_doc(res, runs)), output, inputs=[runs, hw if Path(hw).is_file() else None])
    rows = [("fitted", ", ".join(res["fitted"]) or "nothing (too few runs load a rate, or the fit was rejected)"),
            *([("rejected", "; ".join(res["rejected"]))] if res["rejected"] else []),
            ("VRAM rate x", f"{res['vram_factor']:.3g}"), ("CPU expert rate x", f"{res['cpu_factor']:.3g}")]
    if res["engine"] is not None:
        rows += [("engine", res["engine"].name),
                 ("per step", f"{res['token_s'] * 1e6:+.1f} us"),
                 ("per missed expert", f"{res['miss_s'] * 1e6:+.2f} us")]
    echo_kv(rows + [("written", output)])
