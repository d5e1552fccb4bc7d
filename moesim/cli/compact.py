"""`moesim compact`: rewrite a dense or sparse trace in the compact ranked layout."""

from __future__ import annotations

import click


@click.command("compact")
@click.argument("trace", type=click.Path(dir_okay=False, path_type=str))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=str),
              help="Trace file to write (Parquet, schema version 2).")
def command(trace, output):
    """Rewrite TRACE in the ranked layout: the candidates in rank order (move-to-front coded) and
    only the scores the gate weights need. Decoding gives the same candidates, selection and
    weights bit for bit, so every replay is unchanged; the logits of unselected candidates and
    lse are dropped. See docs/trace-format.md."""
    import os

    from moesim.traces.compact import compact_trace

    path = compact_trace(trace, output)
    before, after = os.path.getsize(trace), os.path.getsize(path)
    click.echo(f"wrote {path}: {after:,} bytes ({after / before:.0%} of {before:,})")
