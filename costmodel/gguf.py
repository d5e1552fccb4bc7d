"""A model preset from a GGUF file's header and tensor index (the ``gguf`` package; no weights are read).

Geometry comes from the architecture keys (``{arch}.block_count``, ``expert_count``, ...); bits per weight of
each tensor group come from the file's own tensor sizes, so the quantization named after the file (``gguf``)
reproduces its exact bytes: file size, bytes per expert, dense bytes per token.
"""

from __future__ import annotations

from pathlib import Path

from moesim.costmodel.models import GROUPS, ModelPreset, check_sizes
from moesim.errors import MoesimError

FILE_QUANT = "gguf"


def _group(name: str, n_dims: int) -> str:
    if "_exps" in name:
        return "expert"
    if "ffn_gate_inp" in name and "shexp" not in name:
        return "router"
    if name.startswith("token_embd"):
        return "embed"
    if name.startswith("output.") and n_dims >= 2:
        return "lm_head"
    if n_dims <= 1:
        return "small"
    return "dense"


def read_index(path: str | Path) -> tuple[dict, list[tuple[str, int, int, int]]]:
    """(header key -> scalar value, [(tensor name, n_dims, n_elements, n_bytes)])."""
    try:
        import gguf
    except ImportError:
        raise MoesimError("reading a GGUF file needs the gguf package: pip install gguf") from None
    try:
        r = gguf.GGUFReader(str(path))
    except FileNotFoundError:
        raise MoesimError(f"GGUF file not found: {path}") from None
    except (ValueError, OSError) as exc:
        raise MoesimError(f"{path}: not a readable GGUF file ({exc})") from None
    header = {}
    for key, f in r.fields.items():
        try:
            if len(f.data) == 1:
                v = f.parts[f.data[0]]
                header[key] = bytes(v).decode("utf-8", "replace") if f.types[0] == gguf.GGUFValueType.STRING \
                    else v[0].item()
        except (IndexError, AttributeError, TypeError):
            continue
    tensors = [(t.name, len(t.shape), int(t.n_elements), int(t.n_bytes)) for t in r.tensors]
    return header, tensors


def load_gguf(path: str | Path) -> ModelPreset:
    header, tensors = read_index(path)
    arch = header.get("general.architecture")
    if not arch:
        raise MoesimError(f"{path}: GGUF header has no general.architecture")

    def key(name, default=None):
        v = header.get(f"{arch}.{name}", default)
        if v is None:
            raise MoesimError(f"{path}: GGUF header lacks {arch}.{name} (not an MoE model moesim can read)")
        return v

    n_layers, n_experts, top_k = int(key("block_count")), int(key("expert_count")), int(key("expert_used_count"))
    hidden = int(key("embedding_length"))
    expert_ff = int(key("expert_feed_forward_length", 0)) or int(key("feed_forward_length"))
    heads = int(key("attention.head_count"))
    if heads < 1 or hidden < 1:
        raise MoesimError(f"{path}: GGUF header gives {heads} attention heads and embedding length {hidden}")
    kv_heads = int(header.get(f"{arch}.attention.head_count_kv", heads))
    head_dim = int(header.get(f"{arch}.attention.key_length", hidden // heads))
    vocab = int(header.get(f"{arch}.vocab_size", 0))
    by_group = dict.fromkeys(GROUPS, 0)
    elems = dict.fromkeys(GROUPS, 0)
    moe_layers = set()
    for name, n_dims, n_el, n_bytes in tensors:
        g = _group(name, n_dims)
        by_group[g] += n_bytes
        elems[g] += n_el
        if g == "expert" and name.startswith("blk."):
            moe_layers.add(int(name.split(".")[1]))
        if name.startswith("token_embd") and not vocab:
            vocab = n_el // hidden
    if not moe_layers:
        raise MoesimError(f"{path}: no expert tensors (*_exps) in the GGUF: not an MoE model")
    tied = by_group["lm_head"] == 0
    m = ModelPreset(
        name=str(header.get("general.name", Path(path).stem)), hf_id="", family=str(arch),
        source=f"GGUF header and tensor index of {Path(path).name}", n_layers=n_layers,
        moe_layers=tuple(sorted(moe_layers)), n_experts=n_experts, top_k=top_k, gating="softmax",
        norm_topk_prob=True, moe_intermediate_size=expert_ff, hidden_size=hidden, vocab_size=vocab,
        tie_word_embeddings=tied, attention={"kind": "gqa", "n_heads": heads, "n_kv_heads": kv_heads,
                                             "head_dim": head_dim},
        native_quant=FILE_QUANT, path=str(path),
    )
    check_sizes(m, path)  # before anything loops over the layers a forged header claims
    # bits per group so that the preset's own parameter counts reproduce the file's bytes exactly
    geometry = m.param_groups()
    bits = {}
    for g in GROUPS:
        params = geometry.get(g, 0) or elems[g]
        bits[g] = 8.0 * by_group[g] / params if params and by_group[g] else 16.0
    if tied:
        bits["lm_head"] = bits["embed"]
    object.__setattr__(m, "quants", {FILE_QUANT: bits})
    object.__setattr__(m, "file_tensor_bytes", sum(by_group.values()))
    return m
