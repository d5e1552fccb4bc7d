"""`moesim report`: charts and paper tables from sweep results (and the trace)."""

from __future__ import annotations

import click

from moesim.cli.output import FINITE, ci_options, make_ci


@click.command("report")
@click.argument("results", type=click.Path(dir_okay=False, path_type=str), required=False)
@click.option("--trace", "trace", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="The sweep's trace (default: the path the sweep recorded, if it still exists). Adds the "
                   "profile, gate-weight, domain and per-token charts and the routing-profile table.")
@click.option("--budget", "budgets", type=FINITE, multiple=True,
              help="Budgets for the routing-profile table and the per-token replays (default: the sweep's; "
                   "without results 0.125, 0.25, 0.5). Repeatable.")
@click.option("--quality", "quality", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Quality results (moesim emulate --grid ... -o quality.parquet): adds perplexity increase against "
                   "substituted mass per policy class, with Pearson r and n. A RESULTS file of quality results is "
                   "read as --quality.")
@click.option("--title", default=None, help="Page title (default: 'moesim report: MODEL').")
@click.option("--baseline", default=None, metavar="PRESET|EVICTION/MISS[/admit β]",
              help="The config every speed-up divides by (default: the one the sweep used; see moesim sweep).")
@click.option("-o", "--output", "out", type=click.Path(file_okay=False, path_type=str), required=True,
              help="Report directory to write (replaced atomically if it holds an earlier report and only the files "
                   "that report wrote).")
@ci_options
def command(results, trace, budgets, quality, title, baseline, out, ci, ci_resamples, ci_unit, ci_method):
    """Write a self-contained HTML report of sweep RESULTS (results.parquet from `moesim sweep`) and/or
    a --trace to directory -o: index.html works offline (Vega inlined, no network request), every chart
    also as PNG and SVG, every table as Markdown, LaTeX and CSV (docs/reports.md). Sweep rows with
    intervals (sweep --ci) show them; --ci adds them to what comes from the trace (hit-rate curve,
    routing profile).

    Example: moesim sweep traces/qwen3next.parquet --budget 0.125 --budget 0.25 --budget 0.5 -o r.parquet &&
    moesim report r.parquet -o report/
    """
    from moesim.errors import MoesimError
    from moesim.reports.report import build_report

    if results is not None and quality is None and _is_quality(results):
        results, quality = None, results
    if results is None and trace is None and quality is None:
        raise MoesimError("give sweep RESULTS (a results.parquet), --trace TRACE, --quality FILE, or several")
    intervals = make_ci(ci, ci_resamples, ci_unit, ci_method)
    manifest = build_report(out, results=results, trace=trace, budgets=list(budgets) or None, title=title,
                            progress=_progress(), baseline=baseline, quality=quality, ci=intervals)
    echo_summary(manifest, out)


def _is_quality(path) -> bool:
    """A quality results file (moesim emulate --grid -o) rather than sweep results."""
    try:
        import pyarrow.parquet as pq

        return "ppl" in pq.read_schema(path).names
    except Exception:  # noqa: BLE001 - not readable here: let the sweep reader say why
        return False


def _progress():
    import sys

    if not sys.stderr.isatty():
        return None
    return lambda msg: click.echo(f"moesim report: {msg}", err=True)


def echo_summary(manifest: dict, out: str) -> None:
    """What a report directory holds, in a few lines."""
    from pathlib import Path

    from moesim.cli.output import echo

    files = manifest["files"]
    base = Path(out)
    echo(f"wrote {base / files['html']} ({len(files['charts'])} charts, {len(files['tables'])} tables, "
               f"{manifest['seconds']:.1f} s){'  [synthetic trace]' if manifest['synthetic'] else ''}")
    for name, f in files["charts"].items():
        click.echo(f"  chart  {name}: {base / f['png']}, {Path(f['svg']).name}")
    for name, f in files["tables"].items():
        click.echo(f"  table  {name}: {base / f['Markdown']}, {Path(f['LaTeX']).name}, {Path(f['CSV']).name}")
    for n in manifest["notes"]:
        echo(f"  note   {n}")
