"""`moesim trace hf` and `moesim trace llama`: record router logits from a real model."""

from __future__ import annotations

import click

from moesim.cli.output import Progress, echo

TEXTS = click.option("--text", "texts", multiple=True, required=True, type=click.Path(dir_okay=False),
                     help="A UTF-8 text file to run through the model (repeatable).")
DOMAINS = click.option("--domain", "domains", multiple=True,
                       help="Domain label of each --text file, in order (one for all, or one per file).")
SEQ_LEN = click.option("--seq-len", type=int, default=512, show_default=True,
                       help="Tokens per teacher-forced sequence.")
MAX_TOKENS = click.option("--max-tokens", type=int, default=None,
                          help="Trace at most N tokens of each --text file.")
CANDIDATES = click.option("--candidates", type=int, default=None,
                          help="Sparse layout: scored experts kept per row, M (default max(32, 2k), at most E).")
DENSE = click.option("--dense", is_flag=True, help="Store all E logits per row instead of the best M.")
MODEL_ID = click.option("--model-id", default=None, help="Model id in the metadata (default: from the model).")
OUT = click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False),
                   help="Output trace (.parquet).")


def _source_options(f):
    """The options both tracers share: texts, domains, sequence length, token cap, layout."""
    for opt in reversed((TEXTS, DOMAINS, SEQ_LEN, MAX_TOKENS, CANDIDATES, DENSE)):
        f = opt(f)
    return f


def _done(out: str) -> None:
    from moesim.traces.info import trace_info

    d = trace_info(out)
    echo(f"wrote {out}: {d['tokens']} tokens x {d['moe_layers']} MoE layers, top-{d['top_k']} of "
               f"{d['experts']} ({d['family']}, {d['layout']} layout)")


def _check_exclusive(candidates, dense):
    from moesim.errors import MoesimError

    if dense and candidates is not None:
        raise MoesimError("--candidates and --dense exclude each other")


@click.group("trace")
def command():
    """Record router logits from a real model into a moesim trace.

    Teacher-forced forward passes over text files; every MoE layer's router
    logits, the model's own top-k and gate weights, and the token ids are
    written as they come (memory bounded by one sequence)."""


@command.command("hf")
@click.argument("model_dir", type=click.Path(file_okay=False))
@_source_options
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto",
              show_default=True, help="Weights dtype (auto: as stored in the checkpoint).")
@click.option("--device", default=None, help="torch device, e.g. cpu or cuda:0 (default: cuda when available).")
@click.option("--lookahead", is_flag=True,
              help="Also record, per row, the experts the next MoE layer's router selects when run on this layer's "
                   "input (the lookahead column a lookahead prefetcher replays; not for MiniMax-M2).")
@MODEL_ID
@OUT
def hf(model_dir, texts, domains, seq_len, max_tokens, candidates, dense, dtype, device, lookahead, model_id, out):
    """Trace a local transformers checkpoint MODEL_DIR with PyTorch.

    Families: Qwen3-MoE, Qwen3-Next, Qwen2-MoE, Mixtral, OLMoE, DeepSeek-V3,
    DeepSeek-V2, GLM-4.5 (glm4_moe), dots.llm1, gpt-oss. Never downloads:
    MODEL_DIR must hold config.json, the weights and the tokenizer. Needs the extra: pip install 'moesim[torch]'."""
    from moesim.traces.tracers.hf import trace_hf

    _check_exclusive(candidates, dense)
    with Progress("tracing") as tick:
        trace_hf(model_dir, texts, out, domains=domains, seq_len=seq_len, max_tokens=max_tokens,
                 candidates=candidates, dense=dense, dtype=dtype, device=device, model_id=model_id,
                 lookahead=lookahead, progress=tick)
    _done(out)


@command.command("llama")
@click.argument("gguf", type=click.Path(dir_okay=False))
@_source_options
@click.option("--n-batch", type=int, default=512, show_default=True,
              help="llama.cpp logical batch size (a sequence longer than this runs in several micro-batches).")
@click.option("--threads", type=int, default=None, help="CPU threads for llama.cpp (default: its own choice).")
@click.option("--kv-type", type=click.Choice(["f16", "f32"]), default="f16", show_default=True,
              help="KV cache type (f32 with --flash-attn off matches an f32 PyTorch run to ~1e-5).")
@click.option("--flash-attn", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True,
              help="llama.cpp flash attention.")
@click.option("--generate", type=int, default=0, show_default=True,
              help="After each sequence, N greedy decode steps, recorded as decode rows.")
@MODEL_ID
@OUT
def llama(gguf, texts, domains, seq_len, max_tokens, candidates, dense, n_batch, threads, kv_type, flash_attn,
          generate, model_id, out):
    """Trace a GGUF model with llama.cpp (llama-cpp-python, eval callback).

    Captures ffn_moe_logits-<layer>, the selected ids and the gate weights of
    every MoE layer for every token. Architectures: qwen3moe, qwen3next,
    qwen2moe, llama (Mixtral), olmoe, deepseek2, gpt-oss, glm4moe, dots1;
    others are refused.
    Needs the extra: pip install 'moesim[llama]'."""
    from moesim.traces.tracers.llama import trace_llama

    _check_exclusive(candidates, dense)
    with Progress("tracing") as tick:
        trace_llama(gguf, texts, out, domains=domains, seq_len=seq_len, max_tokens=max_tokens,
                    candidates=candidates, dense=dense, n_batch=n_batch, n_threads=threads, kv_type=kv_type,
                    flash_attn={"auto": None, "on": True, "off": False}[flash_attn], model_id=model_id,
                    generate=generate, progress=tick)
    _done(out)
