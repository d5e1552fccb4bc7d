"""`moesim import {flame,table,fiddler,jsonl,array,prompts,moe-infinity,fitz-tec,moe-l2,bigrig,vllm-routed,megatron}`:
other tools' routing -> moesim traces."""

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
              help="Drop the first N forward passes (sequences) in order of appearance, e.g. profiling runs.")
@click.option("--passes", type=click.Choice(["restart", "drop", "off"]), default="restart", show_default=True,
              help="Where a new forward pass (sequence) starts within one sequence id: where pos restarts at 0, "
                   "where pos does not increase, or never.")
@click.option("--drop-incomplete", is_flag=True,
              help="Keep only tokens that have every layer (ragged logs); says how many were dropped.")
@click.option("--phase", type=click.Choice(["prefill", "decode"]), default="decode", show_default=True,
              help="Phase of every token when the records have no phase field.")
def jsonl(files, out, n_experts, top_k, model_id, mapping, skip_passes, passes, drop_incomplete, phase):
    """JSON Lines routing logs: one record per line naming a layer, a token and
    its k selected experts (+ weights). Several FILES (e.g. one per layer)
    make one trace. Each forward pass is a sequence: within one sequence id
    (or the whole log without a seq field) a new pass starts wherever pos
    restarts at 0. Lines without the experts field are skipped (a meta line's
    model id, top-k and expert count are used)."""
    from moesim.traces.importers.jsonl import import_jsonl

    _report(import_jsonl(list(files), out, n_experts=n_experts, top_k=top_k, model_id=model_id, mapping=mapping,
                         skip_passes=skip_passes, drop_incomplete=drop_incomplete, phase=phase, passes=passes))


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


MODEL = click.option("--model", "model_id", help="Model id for the metadata; a moesim preset's name or Hugging Face id "
                     "also gives E, k, gating and bytes per expert (moesim models list).")
CANDIDATES = click.option("--candidates", type=int, help="Scored experts kept per row: all E (dense layout) by "
                          "default, or the M best (sparse, with the log-sum-exp over all E).")
GATING = click.option("--gating", type=click.Choice(["softmax", "softmax_topk", "sigmoid"]),
                      help="Gating the logits go through [default: the preset's, else softmax].")
PHASE = click.option("--phase", type=click.Choice(["prefill", "decode"]), default="decode", show_default=True,
                     help="Phase of every token (the file does not say it).")


@command.command("fitz-tec")
@click.argument("file", type=click.Path(path_type=str))
@OUT
@click.option("--top-k", type=int, help="Experts per token k of the traced model (required without a --model preset: "
              "the file stores the softmax, not k).")
@MODEL
@CANDIDATES
@click.option("--prompt-tokens", type=int, default=0, show_default=True,
              help="The first N tokens are the prompt (phase prefill), the rest decode.")
@click.option("--norm-topk-prob/--no-norm-topk-prob", default=None,
              help="Whether the model renormalizes its top-k weights [default: the preset's, else yes].")
def fitz_tec(file, out, top_k, model_id, candidates, prompt_tokens, norm_topk_prob):
    """fitz-tec router traces (RTRACE01: int32 token, int32 layer, E float32
    softmax per record). The softmax over all E is kept as the candidates' scores.
    Memory-mapped: only each record's (token, layer) key and order are held."""
    from moesim.traces.importers.fitz_tec import import_fitz_tec

    _report(import_fitz_tec(file, out, top_k=top_k, model_id=model_id, candidates=candidates,
                            prompt_tokens=prompt_tokens, norm_topk_prob=norm_topk_prob))


@command.command("moe-l2")
@click.argument("log", type=click.Path(path_type=str))
@OUT
@click.option("--experts", "n_experts", type=int, help="Routed experts per layer E (required without a --model "
              "preset).")
@click.option("--top-k", type=int, help="Experts per token k (checked against the id lists).")
@MODEL
@click.option("--one-sequence", is_flag=True, help="Keep the whole log as one sequence (default: a prompt batch "
              "after decode steps starts a new one).")
@click.option("--drop-incomplete", is_flag=True, help="Drop a last batch that lacks some layer's line (a log cut "
              "mid-batch) instead of refusing the log.")
def moe_l2(log, out, n_experts, top_k, model_id, one_sequence, drop_incomplete):
    """moe-l2 / LLAMA_EXPERT_LOG routing logs: EXPERT|L<layer>|T<tokens>: [ids] [ids]
    lines (one id list per token of the batch); other lines are skipped. Streamed."""
    from moesim.traces.importers.moe_l2 import import_moe_l2

    _report(import_moe_l2(log, out, n_experts=n_experts, top_k=top_k, model_id=model_id, one_sequence=one_sequence,
                          drop_incomplete=drop_incomplete))


@command.command("bigrig")
@click.argument("file", type=click.Path(path_type=str))
@OUT
@click.option("--experts", "n_experts", type=int, help="Routed experts per layer E (required for idx without a "
              "--model preset).")
@click.option("--top-k", type=int, help="Experts per token k (required for logits without a --model preset).")
@MODEL
@click.option("--layers", help="Original indices of the file's layers, e.g. '0-23' [default: 0..L-1].")
@CANDIDATES
@GATING
@PHASE
def bigrig(file, out, n_experts, top_k, model_id, layers, candidates, gating, phase):
    """bigrig *_full.npz traces: idx [L, T, k] selected ids or logits [L, T, E],
    with seq_bounds. Memory-mapped (compressed members inflated once beside OUT)."""
    from moesim.traces.importers.bigrig import import_bigrig

    _report(import_bigrig(file, out, n_experts=n_experts, top_k=top_k, model_id=model_id, layers=layers,
                          candidates=candidates, gating=gating, phase=phase))


@command.command("vllm-routed")
@click.argument("file", type=click.Path(path_type=str))
@OUT
@click.option("--experts", "n_experts", type=int, help="Routed experts per layer E (required without a --model "
              "preset).")
@MODEL
@click.option("--layers", help="Which layer indices of the arrays are MoE layers, e.g. '3-47' [default: the preset's, "
              "else the layers not all zero].")
@PHASE
def vllm_routed(file, out, n_experts, model_id, layers, phase):
    """vLLM --enable-return-routed-experts arrays [seq_len, num_hidden_layers, k]
    saved with np.save (one request) or np.savez (one member per request, one
    sequence each). Memory-mapped."""
    from moesim.traces.importers.vllm_routed import import_vllm_routed

    _report(import_vllm_routed(file, out, n_experts=n_experts, model_id=model_id, layers=layers, phase=phase))


@command.command("megatron")
@click.argument("file", type=click.Path(path_type=str))
@OUT
@click.option("--experts", "n_experts", type=int, help="Routed experts per layer E (required without logits or a "
              "--model preset).")
@MODEL
@CANDIDATES
@GATING
@PHASE
@click.option("--no-logits", is_flag=True, help="Ignore the logits sidecar (import the top indices only).")
def megatron(file, out, n_experts, model_id, candidates, gating, phase, no_logits):
    """Megatron-LM router traces (--moe-routing-trace-path): router_trace_rank{N}.jsonl
    with its logits_rank{N}.bin sidecar when present. Each step is a sequence."""
    from moesim.traces.importers.megatron import import_megatron

    _report(import_megatron(file, out, n_experts=n_experts, model_id=model_id, candidates=candidates, gating=gating,
                            phase=phase, no_logits=no_logits))
