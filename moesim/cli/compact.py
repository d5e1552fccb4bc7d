"""`moesim compact`: rewrite a dense or sparse trace in the compact ranked layout."""

from __future__ import annotations

import click


@click.command("compact")
@click.argument("trace", type=click.Path(dir_okay=False, path_type=str))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=str),
              help="Trace file to write (Parquet, schema version 3).")
def command(trace, output):
    """Rewrite TRACE in the ranked layout: the candidates in rank order with their router logits,
    as compact binary rows. Decoding gives the same candidates, logits, selection and weights bit
    for bit, so every replay and step policy is unchanged; lse is dropped. See docs/trace-format.md."""
    import os

    from moesim.traces.compact import compact_trace

    path = compact_trace(trace, output)
    before, after = os.path.getsize(trace), os.path.getsize(path)
    click.echo(f"wrote {path}: {after:,} bytes ({after / before:.0%} of {before:,})")
