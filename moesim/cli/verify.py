"""`moesim verify`: the replay's hit rate against what an engine's expert cache counted."""

from __future__ import annotations

import click

from moesim.cli.output import echo


@click.command("verify")
@click.argument("trace", type=click.Path(dir_okay=False, path_type=str))
@click.argument("engine_log", type=click.Path(dir_okay=False, path_type=str))
@click.option("--log-format", type=click.Choice(["auto", "llama.cpp", "moe-l2", "csv"]), default="auto",
              show_default=True,
              help="The log's format: llama.cpp's expert cache (PR #27861 'moe-cache: steps=' lines), moe-l2's cache "
                   "statistics (/stats JSON or 'moe-l2 stats' text), or a CSV of hits,misses[,layer][,step] "
                   "(docs/verify.md).")
@click.option("--eviction", "-e", default=None,
              help="The engine's eviction policy [default: lru, what both engines run].")
@click.option("--slots", "-s", type=int, default=None,
              help="Cache slots per layer [default: the llama.cpp log's 'N slots', moe-l2's 96].")
@click.option("--budget", "-b", type=float, default=None, help="Cache size as a fraction of each layer's experts.")
@click.option("--step-pin/--no-step-pin", default=None,
              help="Engine step semantics: a step's hits first, its experts not evicted by its misses [default: on for "
                   "llama.cpp and moe-l2, off for CSV].")
@click.option("--max-uploads", type=int, default=None, metavar="N",
              help="At most N experts admitted per layer per step [default: the llama.cpp log's 'inserts/step', else "
                   "none].")
@click.option("--tokens", type=click.Choice(["auto", "all", "decode"]), default="auto", show_default=True,
              help="Tokens replayed: decode only (llama.cpp's cache counts decode steps only; auto picks it for that "
                   "log) or all.")
@click.option("--layers", help="Original indices of the layers the engine caches, e.g. '12-47' [default: all].")
@click.option("--allocation", type=click.Choice(["per-layer", "global"]), default="per-layer", show_default=True,
              help="One pool per layer (both engines) or one shared pool.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Report as a table or as JSON.")
def command(trace, engine_log, log_format, eviction, slots, budget, step_pin, max_uploads, tokens, layers, allocation,
            fmt):
    """Replay TRACE with the policy and step semantics of the engine that wrote
    ENGINE_LOG and report predicted against realized hit rate, overall, per window
    of steps and per layer (where the log has them), with the difference broken
    down by step semantics and what the replay does not model (docs/verify.md).

    Example: moesim verify run.parquet llama-server.log
    """
    import json

    from moesim.reports.verify import verify

    v = verify(trace, engine_log, log_format=log_format, eviction=eviction, slots=slots, budget=budget,
               step_pin=step_pin, max_uploads=max_uploads, tokens=tokens, layers=layers, allocation=allocation)
    if fmt == "json":
        echo(json.dumps(v.document(), indent=2))
    else:
        echo(v.text().rstrip("\n"))
