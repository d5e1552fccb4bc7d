"""`moesim calibrate`: fit a machine file's free factors to measured runs."""

from __future__ import annotations

import click

from moesim.cli.output import echo_kv


@click.command("calibrate")
@click.argument("runs", type=click.Path(exists=True, dir_okay=False, path_type=str))
@click.option("--hw", required=True, help="The machine file (or preset) the runs were measured on.")
@click.option("--model", default=None, help="Model preset or file for llama-bench rows (they name only the arch).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=str), required=True,
              help="Calibrated machine file to write (never overwrites an existing file).")
def command(runs, hw, model, output):
    """Fit the VRAM and CPU expert rates of a machine to RUNS (llama-bench output, or a CSV with columns
    model, quant, placement, tok_s) under the llama.cpp profile; print residuals before and after; write the
    calibrated machine file (fitted numbers say `fitted:`)."""
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
    res = fit(rs, hw)
    for r, b, a in zip(rs, res["residuals_before"], res["residuals_after"]):
        click.echo(f"{r['model']} {r['quant']} {r['placement']}: measured {r['tok_s']:.4g} tok/s, "
                   f"ln(predicted/measured) {b:+.3f} -> {a:+.3f}")
    write_text(dumps(machine_doc(res, runs)), output, inputs=[runs, hw if Path(hw).is_file() else None])
    echo_kv([("fitted", ", ".join(res["fitted"]) or "nothing (too few runs load a rate, or the fit was rejected)"),
             *([("rejected", "; ".join(res["rejected"]))] if res["rejected"] else []),
             ("VRAM rate x", f"{res['vram_factor']:.3g}"), ("CPU expert rate x", f"{res['cpu_factor']:.3g}"),
             ("written", output)])
