"""`moesim info` and `moesim validate`."""

from __future__ import annotations

import click

from moesim.cli.output import FORMAT_OPTION, echo, echo_json, echo_kv, human_bytes

TRACE = click.argument("trace", type=click.Path(dir_okay=False, path_type=str))


@click.command("info")
@TRACE
@FORMAT_OPTION
def info(trace, fmt):
    """Describe TRACE: model, geometry, tokens, sequences, domains, phases,
    layout, size on disk, synthetic or real, provenance.

    Reads only the metadata and the key columns, so it is fast on a multi-GB
    trace; it checks the file, the metadata and the key structure (layers,
    duplicates, missing layers) but not the scores: run 'moesim validate' for
    that."""
    from moesim.traces.info import trace_info

    d = trace_info(trace)
    if fmt == "json":
        echo_json(d)
        return
    echo_kv([
        ("trace", d["path"]),
        ("data", "SYNTHETIC (generated, not recorded from a model)" if d["synthetic"] else "real (recorded routing)"),
        ("model", f"{d['model']} ({d['family']})"),
        ("MoE layers", f"{d['moe_layers']} (original indices {_span(d['layer_indices'])})"),
        ("dense layers", d["dense_layers"]),
        ("experts", f"{d['experts']} routed, top-{d['top_k']}, {d['shared_experts']} shared"),
        ("gating", f"{d['gating']}" + (", top-k renormalized" if d["norm_topk_prob"] else "")),
        ("bytes/expert", {q: human_bytes(b) for q, b in d["bytes_per_expert"].items()}),
        ("layout", _layout(d)),
        ("scores", "router logits of every candidate (what a step policy re-selects with)" if d["candidate_scores"]
         else "none (" + _why_no_scores(d) + "): step policies refuse this trace"),
        ("ties", "equal weights keep the stored order (the source's rank order)" if d["tie_order"] == "stored"
         else "equal scores and weights rank the lower expert id first"),
        ("columns", d["columns"]),
        ("tokens", d["tokens"] if not d["frequency_only"]
         else f"n/a (frequency-only: expert counts of {d['requests']} requests, no time order)"),
        ("sequences", d["sequences"]),
        ("phases", d["phases"]),
        ("domains", d["domains"]),
        ("rows", f"{d['rows']} in {d['row_groups']} row group(s)"),
        ("size", human_bytes(d["size_bytes"])),
        ("tracer", d["tracer"]),
        ("source", d["source"]),
        ("checked", "file, metadata and key structure; scores not read (run 'moesim validate')"),
    ])


def _layout(d):
    if d["layout"] == "counts":
        return "counts (per request and layer, how often each expert was selected)"
    return f"{d['layout']} ({d['candidates_per_row']} scored experts per row)"


def _why_no_scores(d):
    if d["layout"] == "counts":
        return "frequency-only"
    if d["layout"] == "ranked" and d["schema_version"] == 2:
        return "a version-2 ranked trace keeps only the selection's gate scores"
    return "the source records no candidate logits"


def _span(xs):
    if xs and xs == list(range(xs[0], xs[-1] + 1)) and len(xs) > 2:
        return f"{xs[0]}..{xs[-1]}"
    return ", ".join(map(str, xs))


@click.command("validate")
@TRACE
def validate(trace):
    """Read every row of TRACE and check it (schema, keys, expert ids, scores,
    weights), a row group at a time. Prints one line and exits 0 when the trace
    is valid; otherwise one error line and exit code 2."""
    from moesim.traces.reader import TraceFile
    from moesim.traces.routing import validate_trace

    tf = TraceFile(trace)
    v = validate_trace(tf)
    m = tf.meta
    tag = "synthetic" if m.synthetic else "real"
    what = (f"{v['tokens']} tokens" if not v["frequency_only"]
            else f"frequency-only, {v['requests']} requests, {v['steps']} routed steps")
    echo(f"ok: {trace}: {what} x {m.n_layers} MoE layers, top-{m.top_k} of {m.n_experts} ({tag})")


commands = {"info": info, "validate": validate}
