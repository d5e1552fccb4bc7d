"""`moesim import {flame,table,fiddler,jsonl,array,prompts,moe-infinity}`: other tools' routing -> moesim traces."""

from __future__ import annotations

import click

OUT = click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False, path_type=str),
                   help="Trace file to write (Parquet; written atomically).")


def _report(result) -> None:
    from moesim.cli.output import echo

    for note in result.notes:
        echo(f"moesim: warning: {note}", err=True)
    echo(result.summary())


@click.group("import")
def command():
    """Convert other tools' routing traces to moesim traces (docs/importers.md)."""


@command.command("flame")
@click.argument("path", type=click.Path(path_type=str))
@OUT
@click.option("--layout", type=click.Choice(["prefill", "decode"]),
              help="Which layout to import; required when PATH holds both (they make two traces).")
@click.option("--seq-len", type=int, help="Tokens per sequence in the prefill layout "
              "[default: from the file names, e.g. 32seqs_2048tokens -> 64].")
@click.option("--top-k", type=int, help="Experts per token [default: the nonzero entries per row].")
@click.option("--model", "model_id", default="FLAME-MoE-290M", show_default=True, help="Model id for the metadata.")
def flame(path, out, layout, seq_len, top_k, model_id):
    """FLAME-MoE / DynaNDE CSV folders (Encoder_Batch_* prefill, Decoder_Batch_* decode).

    PATH is the folder holding them, or one Encoder_Batch_* / Decoder_Batch_*
    folder. Probabilities become sparse log-probabilities with the nonzero
    experts as the selected ones."""
    from moesim.traces.importers.flame import import_flame

    _report(import_flame(path, out, layout=layout, seq_len=seq_len, top_k=top_k, model_id=model_id))


@command.command("table")
@click.argument("file", type=click.Path(path_type=str))
@OUT
@click.option("--experts", "n_experts", type=int, help="Routed experts per layer E (required without --preset).")
@click.option("--top-k", type=int, help="Experts per token k [default: from the data].")
@click.option("--preset", help="moesim model preset for the geometry (e.g. qwen3-30b-a3b).")
@click.option("--model", "model_id", help="Model id for the metadata [default: the preset's].")
@click.option("--family", help="Model family for the metadata [default: the preset's, else 'unknown'].")
@click.option("--gating", type=click.Choice(["softmax", "softmax_topk", "sigmoid"]),
              help="Gating function [default: the preset's, else softmax].")
@click.option("--norm-topk-prob/--no-norm-topk-prob", default=None,
              help="Whether the model renormalizes the top-k weights [default: the preset's, else yes].")
@click.option("--phase", type=click.Choice(["prefill", "decode"]), default="decode", show_default=True,
              help="Phase of every row when the table has no phase column.")
@click.option("--synthetic", is_flag=True, help="Mark the trace as synthetic (not recorded from a model).")
def table(file, out, n_experts, top_k, preset, model_id, family, gating, norm_topk_prob, phase, synthetic):
    """A generic CSV or Parquet routing table: one row per (seq, pos, layer) with
    an 'experts' list, or one row per selected expert with 'expert' [and 'rank'];
    optional weights, logits, lse, phase, domain, token columns."""
    from moesim.traces.importers.table import import_table

    _report(import_table(file, out, n_experts=n_experts, top_k=top_k, preset=preset, model_id=model_id,
                         family=family, gating=gating, norm_topk_prob=norm_topk_prob, phase=phase,
                         synthetic=synthetic))


@command.command("fiddler")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=str))
@OUT
@click.option("--experts", "n_experts", type=int, default=60, show_default=True, help="Routed experts per layer.")
@click.option("--top-k", type=int, help="Experts per token [default: the ids of a decode step].")
@click.option("--model", "model_id", default="Qwen/Qwen1.5-MoE-A2.7B", show_default=True,
              help="Model id for the metadata.")
def fiddler(files, out, n_experts, top_k, model_id):
    """Fiddler expert-selection JSON; each FILE is one request (sequence).

    Reads the recorder's {pass: {layer: [ids]}} layout (pass 0 = the prompt,
    k ids per token concatenated; passes 1.. = decode steps) and the
    layer-major one (per layer a prefill entry plus one id list per step)."""
    from moesim.traces.importers.fiddler import import_fiddler

    _report(import_fiddler(list(files), out, n_experts=n_experts, top_k=top_k, model_id=model_id))


@command.command("jsonl")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=str))
@OUT
@click.option("--experts", "n_experts", type=int,
              help="Routed experts per layer E [default: a meta line's, or the model preset's].")
@click.option("--top-k", type=int, help="Experts per token k [default: from the records].")
@click.option("--model", "model_id", help="Model id for the metadata [default: a meta line's, else 'unknown'].")
@click.option("--map", "mapping", metavar="FIELD=NAME,...",
              help="Which record field holds what: seq, pos, layer, experts, weights, domain, phase "
                   "(e.g. seq=problem_id,pos=token_idx,experts=topk_ids).")
@click.option("--skip-passes", type=int, default=0, show_default=True,
              help="Drop the first N sequences (forward passes without a seq field), e.g. profiling runs.")
@click.option("--drop-incomplete", is_flag=True,
              help="Keep only tokens that have every layer (ragged logs); says how many were dropped.")
@click.option("--phase", type=click.Choice(["prefill", "decode"]), default="decode", show_default=True,
              help="Phase of every token when the records have no phase field.")
def jsonl(files, out, n_experts, top_k, model_id, mapping, skip_passes, drop_incomplete, phase):
    """JSON Lines routing logs: one record per line naming a layer, a token and
    its k selected experts (+ weights). Several FILES (e.g. one per layer)
    make one trace. Without a seq field, a new sequence starts wherever pos
    restarts at 0. Lines without the experts field are skipped (a meta line's
    model id, top-k and expert count are used)."""
    from moesim.traces.importers.jsonl import import_jsonl

    _report(import_jsonl(list(files), out, n_experts=n_experts, top_k=top_k, model_id=model_id, mapping=mapping,
                         skip_passes=skip_passes, drop_incomplete=drop_incomplete, phase=phase))


@command.command("array")
@click.argument("file", type=click.Path(path_type=str))
@OUT
@click.option("--experts", "n_experts", type=int, help="Routed experts per layer E (required without a --model "
              "that names a moesim preset).")
@click.option("--top-k", type=int, help="Experts per token k (checked against the array).")
@click.option("--model", "model_id", default="unknown", show_default=True, help="Model id for the metadata.")
@click.option("--layers", help="Original indices of the array's layers, e.g. '0-23' or '3,7' [default: 0..L-1].")
@click.option("--phase", type=click.Choice(["prefill", "decode"]), default="decode", show_default=True,
              help="Phase of every token.")
def array(file, out, n_experts, top_k, model_id, layers, phase):
    """Selected expert ids [T, L, k] in a .npy, or a .npz with 'ids' (+ optional
    'weights' [T, L, k] and 'seq' [T]); never unpickles."""
    from moesim.traces.importers.arrays import import_array

    _report(import_array(file, out, n_experts=n_experts, top_k=top_k, model_id=model_id, layers=layers,
                         phase=phase))


@command.command("prompts")
@click.argument("file", type=click.Path(path_type=str))
@OUT
@click.option("--experts", "n_experts", type=int, help="Routed experts per layer E [default: num_experts].")
@click.option("--top-k", type=int, help="Experts per token k [default: top_k].")
@click.option("--model", "model_id", help="Model id for the metadata [default: the file's 'model', else 'unknown'].")
@click.option("--layers", help="Original indices of the logged layers, e.g. '0-23' [default: 0..L-1].")
def prompts(file, out, n_experts, top_k, model_id, layers):
    """Nested per-prompt JSON: {"num_experts", "top_k", "num_layers", "prompts":
    {name: {"prefill": [pos][layer][k], "decode": [step][layer][k]}}}; each
    prompt is one sequence and its name the domain."""
    from moesim.traces.importers.prompts import import_prompts

    _report(import_prompts(file, out, n_experts=n_experts, top_k=top_k, model_id=model_id, layers=layers))


@command.command("moe-infinity")
@click.argument("file", type=click.Path(path_type=str))
@OUT
@click.option("--top-k", type=int, required=True, help="Experts per token k of the model that was traced.")
@click.option("--model", "model_id", default="unknown", show_default=True, help="Model id for the metadata.")
@click.option("--family", default="unknown", show_default=True, help="Model family for the metadata.")
@click.option("--layers", help="Original indices of the matrix's layers, e.g. '0-23' or '1,3,5' [default: 0..L-1].")
def moe_infinity(file, out, top_k, model_id, family, layers):
    """MoE-Infinity expert-count matrices (.npy, requests x layers x experts) as a
    frequency-only trace: 'moesim info' and expert frequencies work on it,
    replay refuses it (no time order)."""
    from moesim.traces.importers.moe_infinity import import_moe_infinity

    _report(import_moe_infinity(file, out, top_k=top_k, model_id=model_id, family=family, layers=layers))
