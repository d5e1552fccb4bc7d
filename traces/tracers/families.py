"""What the tracers know about each supported MoE family: where the router sits,
how it gates, which layers are dense, how big an expert is. No torch import here.

Families are keyed by the transformers ``model_type`` (also the ``family`` field of
trace metadata and of the model presets).
"""

from __future__ import annotations

from dataclasses import dataclass

from moesim.costmodel.models import QUANT_BITS
from moesim.errors import MoesimError


@dataclass(frozen=True)
class Family:
    name: str                 # model_type
    label: str                # human name
    router: str               # attribute path of the router inside a decoder layer
    gating: str               # moesim gating (traces/meta.py GATINGS)
    experts_key: str          # config key holding E
    inter_key: str            # config key of one routed expert's intermediate size
    default_norm: bool | None = None   # None: read config.norm_topk_prob; else fixed by the architecture
    shared_key: str | None = None      # config key of the shared expert count / size
    quants: tuple[str, ...] = ("bf16", "q8_0", "q4_k_m")
    deepseek_like: bool = False        # first_k_dense_replace, routed_scaling_factor, n_group/topk_group


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("qwen3_moe", "Qwen3-MoE", "mlp.gate", "softmax", "num_experts", "moe_intermediate_size"),
    Family("qwen3_next", "Qwen3-Next", "mlp.gate", "softmax", "num_experts", "moe_intermediate_size",
           shared_key="shared_expert_intermediate_size"),
    Family("qwen2_moe", "Qwen2-MoE", "mlp.gate", "softmax", "num_experts", "moe_intermediate_size",
           shared_key="shared_expert_intermediate_size"),
    # Mixtral renormalizes the k softmax probabilities: the softmax over the k selected logits.
    Family("mixtral", "Mixtral", "mlp.gate", "softmax_topk", "num_local_experts", "intermediate_size",
           default_norm=True),
    Family("olmoe", "OLMoE", "mlp.gate", "softmax", "num_experts", "intermediate_size"),
    Family("deepseek_v3", "DeepSeek-V3", "mlp.gate", "sigmoid", "n_routed_experts", "moe_intermediate_size",
           shared_key="n_shared_experts", deepseek_like=True),
    # transformers' DeepSeek-V2 router never renormalizes (norm_topk_prob is not read)
    Family("deepseek_v2", "DeepSeek-V2", "mlp.gate", "softmax", "n_routed_experts", "moe_intermediate_size",
           default_norm=False, shared_key="n_shared_experts", deepseek_like=True),
    Family("glm4_moe", "GLM-4.5 (GLM4-MoE)", "mlp.gate", "sigmoid", "n_routed_experts", "moe_intermediate_size",
           shared_key="n_shared_experts", deepseek_like=True),
    Family("dots1", "dots.llm1", "mlp.gate", "sigmoid", "n_routed_experts", "moe_intermediate_size",
           shared_key="n_shared_experts", deepseek_like=True),
    # top-k of the logits, softmax over the k (like Mixtral); router at block_sparse_moe.router
    Family("granitemoe", "Granite-MoE", "block_sparse_moe.router", "softmax_topk", "num_local_experts",
           "intermediate_size", default_norm=True),
    # sigmoid, selection on sigmoid + e_score_correction_bias (a buffer of the MoE block), always renormalized
    Family("minimax_m2", "MiniMax-M2", "mlp.gate", "sigmoid", "num_local_experts", "intermediate_size",
           default_norm=True),
    Family("gpt_oss", "gpt-oss", "mlp.router", "softmax_topk", "num_local_experts", "intermediate_size",
           default_norm=True, quants=("bf16", "mxfp4", "q8_0")),
)}


def family_of(model_type: str) -> Family:
    fam = FAMILIES.get(model_type)
    if fam is None:
        known = ", ".join(f"{f.label} ({f.name})" for f in FAMILIES.values())
        raise MoesimError(f"unsupported model family {model_type!r} (supported: {known}); for another architecture "
                          "use the Python API moesim.traces.tracers.record_router with modules=...")
    return fam


def _get(config, key, default=None):
    if isinstance(config, dict):
        return config.get(key, default)
    return getattr(config, key, default)


def moe_layer_indices(config, fam: Family) -> tuple[list[int], list[int]]:
    """(MoE layer indices, dense layer indices) as the architecture builds them from the config."""
    n = int(_get(config, "num_hidden_layers"))
    if fam.deepseek_like:
        first = int(_get(config, "first_k_dense_replace", 0) or 0)
        moe = [i for i in range(n) if i >= first]
    elif fam.name in ("qwen3_moe", "qwen3_next", "qwen2_moe"):
        only = set(_get(config, "mlp_only_layers", None) or [])
        step = int(_get(config, "decoder_sparse_step", 1) or 1)
        experts = int(_get(config, fam.experts_key, 0) or 0)
        moe = [i for i in range(n) if i not in only and experts > 0 and (i + 1) % step == 0]
    else:
        moe = list(range(n))
    dense = [i for i in range(n) if i not in set(moe)]
    return moe, dense


def n_shared_experts(config, fam: Family) -> int:
    if fam.shared_key is None:
        return 0
    v = int(_get(config, fam.shared_key, 0) or 0)
    if fam.shared_key.endswith("intermediate_size"):
        return 1 if v > 0 else 0
    return v


def bytes_per_expert(config, fam: Family) -> dict[str, int]:
    """Bytes of one routed expert's gate+up+down projections, per quantization."""
    hidden = int(_get(config, "hidden_size"))
    inter = int(_get(config, fam.inter_key))
    params = 3 * hidden * inter
    return {q: int(round(params * QUANT_BITS[q] / 8)) for q in fam.quants}


def gating_meta(config, fam: Family) -> dict:
    """The TraceMeta fields that describe the family's gating, read from the config."""
    norm = fam.default_norm
    if norm is None:
        norm = bool(_get(config, "norm_topk_prob", False))
    out = {
        "gating": fam.gating,
        "norm_topk_prob": bool(norm),
        "n_experts": int(_get(config, fam.experts_key)),
        "top_k": int(_get(config, "num_experts_per_tok")),
        "n_shared_experts": n_shared_experts(config, fam),
    }
    if fam.deepseek_like:
        out["routed_scaling_factor"] = float(_get(config, "routed_scaling_factor", 1.0) or 1.0)
        out["n_group"] = int(_get(config, "n_group", 1) or 1)
        out["topk_group"] = int(_get(config, "topk_group", 1) or 1)
    return out
