"""Model presets: architecture geometry read from the TOML files in presets/models/, and the parameter and byte
accounting derived from it (total and active parameters, bytes per expert, dense bytes per decoded token, file size).

Units: parameters are counts, bytes are bytes (1 GB = 1e9 B, 1 GiB = 2**30 B).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from moesim.errors import MoesimError

# Bits per weight of a routed expert's tensors, by quantization. q8_0: 32 int8 + one fp16 scale per block;
# q4_k_m: llama.cpp's mix (Q4_K, 4.5 bpw, with Q6_K, 6.5625 bpw, for half of the ffn_down tensors) ~ 4.83 bpw;
# mxfp4: 32 fp4 values + one 8-bit scale per block.
QUANT_BITS = {"bf16": 16.0, "fp16": 16.0, "fp8": 8.0, "q8_0": 8.5, "q4_k_m": 4.5 + (6.5625 - 4.5) / 6, "mxfp4": 4.25}

# Bits per weight by tensor group, for each quantization; "expert" is QUANT_BITS. GGUF files (q8_0, q4_k_m) keep
# 1-D tensors (norms, biases, conv, gates) and the router (ffn_gate_inp, never quantized by llama-quantize) in F32;
# q4_k_m stores the LM head as Q6_K and the token embedding as Q4_K; its attention/shared matrices follow the same
# Q4_K + Q6_K mix as the experts (attn_v and ffn_down of half the layers get Q6_K), so they take the expert average.
# bf16/fp16/fp8/mxfp4 describe Hugging Face checkpoints: fp8 (DeepSeek-V3) quantizes every linear layer except
# embedding, LM head and router (block scales add ~0.002 bpw, ignored); mxfp4 (gpt-oss) quantizes only the experts.
_G = ("expert", "dense", "router", "embed", "lm_head", "small")
QUANT_SCHEMES: dict[str, dict[str, float]] = {
    "bf16": dict.fromkeys(_G, 16.0),
    "fp16": dict.fromkeys(_G, 16.0),
    "fp8": {"expert": 8.0, "dense": 8.0, "router": 16.0, "embed": 16.0, "lm_head": 16.0, "small": 16.0},
    "q8_0": {"expert": 8.5, "dense": 8.5, "router": 32.0, "embed": 8.5, "lm_head": 8.5, "small": 32.0},
    "q4_k_m": {"expert": QUANT_BITS["q4_k_m"], "dense": QUANT_BITS["q4_k_m"], "router": 32.0, "embed": 4.5,
               "lm_head": 6.5625, "small": 32.0},
    "mxfp4": {"expert": 4.25, "dense": 16.0, "router": 16.0, "embed": 16.0, "lm_head": 16.0, "small": 16.0},
}
GROUPS = _G

# Keys a model TOML may hold, per table; anything else is a typo worth an error.
_TOP_KEYS = {"name", "hf_id", "family", "source", "total_params_b", "active_params_b", "active_params_convention",
             "active_params_source", "native_quant", "moe", "dense", "attention"}
_MOE_KEYS = {"n_layers", "moe_layers", "n_experts", "top_k", "gating", "norm_topk_prob", "moe_intermediate_size",
             "n_shared_experts", "shared_expert_intermediate_size", "dense_intermediate_size", "routed_scaling_factor",
             "n_group", "topk_group", "glu", "expert_bias", "router_bias", "shared_expert_gate"}
_DENSE_KEYS = {"hidden_size", "vocab_size", "tie_word_embeddings"}
_ATTN_KEYS = {"kind", "n_heads", "n_kv_heads", "head_dim", "qk_norm", "bias", "sinks", "output_gate",
              "sliding_window", "sliding_every", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
              "qk_rope_head_dim", "v_head_dim", "full_attention_interval", "linear_n_key_heads",
              "linear_n_value_heads", "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel"}
ATTENTION_KINDS = ("mha", "gqa", "mla", "hybrid_linear")
ACTIVE_CONVENTIONS = ("with_embeddings", "without_embedding_table", "without_embeddings")


@dataclass(frozen=True)
class ModelPreset:
    name: str
    hf_id: str
    family: str
    source: str
    n_layers: int
    moe_layers: tuple[int, ...]
    n_experts: int
    top_k: int
    gating: str
    norm_topk_prob: bool
    moe_intermediate_size: int
    hidden_size: int
    vocab_size: int
    n_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0
    dense_intermediate_size: int = 0
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    glu: bool = True
    tie_word_embeddings: bool = False
    total_params_b: float = 0.0
    attention: dict = field(default_factory=dict)
    active_params_b: float = 0.0
    active_params_convention: str = "with_embeddings"
    active_params_source: str = ""
    native_quant: str = "bf16"
    expert_bias: bool = False
    router_bias: bool = False
    shared_expert_gate: bool = False

    @property
    def dense_layers(self) -> tuple[int, ...]:
        moe = set(self.moe_layers)
        return tuple(i for i in range(self.n_layers) if i not in moe)

    @property
    def n_moe_layers(self) -> int:
        return len(self.moe_layers)

    @property
    def params_per_expert(self) -> int:
        """Weights of one routed expert: gate+up+down projections (GLU) or up+down."""
        return (3 if self.glu else 2) * self.hidden_size * self.moe_intermediate_size

    def bytes_per_expert(self, quant: str) -> int:
        if quant not in QUANT_BITS:
            raise MoesimError(f"unknown quantization {quant!r} (known: {', '.join(QUANT_BITS)})")
        return int(round(self.params_per_expert * QUANT_BITS[quant] / 8))

    def bytes_per_expert_table(self, quants=("bf16", "q8_0", "q4_k_m")) -> dict[str, int]:
        return {q: self.bytes_per_expert(q) for q in quants}

    # ---- parameter accounting -------------------------------------------------------------------------------

    def _is_full_attention(self, layer: int) -> bool:
        a = self.attention
        if a.get("kind") != "hybrid_linear":
            return True
        return (layer + 1) % int(a["full_attention_interval"]) == 0

    def _attention_params(self, layer: int) -> tuple[int, int]:
        """(matrix weights, small 1-D weights) of one layer's attention or linear-attention block."""
        a, h = self.attention, self.hidden_size
        kind = a.get("kind", "gqa")
        if kind == "mla":
            nh, nope, rope, vd = a["n_heads"], a["qk_nope_head_dim"], a["qk_rope_head_dim"], a["v_head_dim"]
            qr, kvr = a.get("q_lora_rank", 0), a["kv_lora_rank"]
            q = h * qr + qr * nh * (nope + rope) if qr else h * nh * (nope + rope)
            mats = q + h * (kvr + rope) + kvr * nh * (nope + vd) + nh * vd * h
            return mats, qr + kvr
        if kind == "hybrid_linear" and not self._is_full_attention(layer):
            nk, nv = a["linear_n_key_heads"], a["linear_n_value_heads"]
            kd, vd = nk * a["linear_key_head_dim"], nv * a["linear_value_head_dim"]
            mats = h * (2 * kd + 2 * vd) + h * 2 * nv + vd * h  # in_proj_qkvz, in_proj_ba, out_proj
            small = (2 * kd + vd) * a["linear_conv_kernel"] + 2 * nv + a["linear_value_head_dim"]
            return mats, small  # conv1d (depthwise), dt_bias + A_log, gated RMSNorm
        nh, nkv, hd = a["n_heads"], a.get("n_kv_heads", a["n_heads"]), a["head_dim"]
        gate = 2 if a.get("output_gate", False) else 1
        mats = h * nh * hd * gate + 2 * h * nkv * hd + nh * hd * h
        small = 0
        qk_norm = a.get("qk_norm", "none")
        if qk_norm == "head":
            small += 2 * hd
        elif qk_norm == "full":
            small += (nh + nkv) * hd
        if a.get("bias", False):
            small += nh * hd * gate + 2 * nkv * hd + h
        if a.get("sinks", False):
            small += nh
        return mats, small

    def param_groups(self, active: bool = False) -> dict[str, int]:
        """Parameters by group (see GROUPS); ``active=True`` counts what one decoded token touches: top_k routed
        experts per MoE layer instead of all of them (the embedding table is still counted whole here)."""
        h = self.hidden_size
        ffn = 3 if self.glu else 2
        g = dict.fromkeys(GROUPS, 0)
        moe = set(self.moe_layers)
        n_routed = self.top_k if active else self.n_experts
        for i in range(self.n_layers):
            mats, small = self._attention_params(i)
            g["dense"] += mats
            g["small"] += small + 2 * h  # input and post-attention norms
            if i in moe:
                g["expert"] += n_routed * self.params_per_expert
                if self.expert_bias:
                    g["small"] += n_routed * (2 * self.moe_intermediate_size + h)
                g["router"] += self.n_experts * h + (self.n_experts if self.router_bias else 0)
                g["dense"] += self.n_shared_experts * ffn * h * self.shared_expert_intermediate_size
                if self.shared_expert_gate:
                    g["small"] += h
            else:
                g["dense"] += ffn * h * self.dense_intermediate_size
        g["embed"] = self.vocab_size * h
        g["lm_head"] = 0 if self.tie_word_embeddings else self.vocab_size * h
        g["small"] += h  # final norm
        return g

    def total_params(self) -> int:
        return sum(self.param_groups().values())

    def active_params(self, convention: str = "with_embeddings") -> int:
        """Active parameters per token. Vendors differ: Qwen/Mistral/DeepSeek/AllenAI count embeddings and LM head
        (``with_embeddings``); OpenAI's gpt-oss count leaves out the embedding table (``without_embedding_table``);
        ``without_embeddings`` leaves out both the table and the LM head."""
        if convention not in ACTIVE_CONVENTIONS:
            raise MoesimError(f"unknown active-parameter convention {convention!r} "
                              f"(known: {', '.join(ACTIVE_CONVENTIONS)})")
        g = self.param_groups(active=True)
        n = sum(g.values())
        if convention in ("without_embedding_table", "without_embeddings"):
            n -= g["embed"]
        if convention == "without_embeddings":
            n -= g["lm_head"] if not self.tie_word_embeddings else 0
        return n

    # ---- bytes ---------------------------------------------------------------------------------------------------

    def _scheme(self, quant: str) -> dict[str, float]:
        if quant not in QUANT_SCHEMES:
            raise MoesimError(f"unknown quantization {quant!r} (known: {', '.join(QUANT_SCHEMES)})")
        return QUANT_SCHEMES[quant]

    def file_bytes(self, quant: str) -> int:
        """Size of all weights at this quantization (a GGUF file's size, give or take its small header)."""
        s = self._scheme(quant)
        return int(round(sum(n * s[k] / 8 for k, n in self.param_groups().items())))

    def expert_bytes_total(self, quant: str) -> int:
        """All routed experts of all MoE layers."""
        return self.n_moe_layers * self.n_experts * self.bytes_per_expert(quant)

    def dense_bytes_by_group(self, quant: str) -> dict[str, int]:
        """Non-expert bytes read per decoded token, by group: every dense weight once, the LM head fully, one row of
        the embedding table (a tied LM head shares the table, read fully as the head)."""
        s = self._scheme(quant)
        g = self.param_groups(active=True)
        out = {k: int(round(g[k] * s[k] / 8)) for k in ("dense", "router", "small", "lm_head")}
        if self.tie_word_embeddings:
            out["lm_head"] = int(round(g["embed"] * s["lm_head"] / 8))
        out["embed_row"] = int(round(self.hidden_size * s["embed"] / 8))
        return out

    def dense_bytes_per_token(self, quant: str) -> int:
        """Non-expert bytes read per decoded token (see dense_bytes_by_group)."""
        return sum(self.dense_bytes_by_group(quant).values())

    def dense_resident_bytes(self, quant: str) -> int:
        """Non-expert weights an engine keeps on the GPU: all dense weights and the LM head; the embedding table stays
        in host memory (as llama.cpp keeps token_embd on the CPU) unless it is tied to the head."""
        return self.dense_bytes_per_token(quant) - self.dense_bytes_by_group(quant)["embed_row"]

    def embedding_table_bytes(self, quant: str) -> int:
        return 0 if self.tie_word_embeddings else int(round(self.vocab_size * self.hidden_size
                                                            * self._scheme(quant)["embed"] / 8))

    def active_bytes_per_token(self, quant: str) -> int:
        """Every byte one decoded token reads (batch 1): dense bytes plus top_k experts per MoE layer."""
        return self.dense_bytes_per_token(quant) + self.n_moe_layers * self.top_k * self.bytes_per_expert(quant)

    # ---- KV cache / recurrent state --------------------------------------------------------------------------

    def kv_read_bytes(self, context: int, kv_bytes: float = 2.0) -> int:
        """Bytes of attention state one decoded token reads with ``context`` tokens before it (fp16 cache by
        default): K and V of every full-attention layer (MLA: the compressed latent plus the rope key; banded
        layers at most their window), plus the fixed recurrent state of linear-attention layers (fp32)."""
        a = self.attention
        kind = a.get("kind", "gqa")
        total = 0.0
        for i in range(self.n_layers):
            if kind == "mla":
                total += context * (a["kv_lora_rank"] + a["qk_rope_head_dim"]) * kv_bytes
            elif kind == "hybrid_linear" and not self._is_full_attention(i):
                nv = a["linear_n_value_heads"]
                state = nv * a["linear_key_head_dim"] * a["linear_value_head_dim"] * 4
                kd, vd = a["linear_n_key_heads"] * a["linear_key_head_dim"], nv * a["linear_value_head_dim"]
                conv = (2 * kd + vd) * (a["linear_conv_kernel"] - 1) * kv_bytes
                total += 2 * state + conv  # the state is read and written back
            else:
                n = context
                every = int(a.get("sliding_every", 0))
                if every and i % every == 0:
                    n = min(context, int(a["sliding_window"]))
                total += n * 2 * a.get("n_kv_heads", a["n_heads"]) * a["head_dim"] * kv_bytes
        return int(round(total))

    def summary(self) -> dict:
        """Plain-data description (for `moesim models show --format json`)."""
        quants = [q for q in ("bf16", "q8_0", "q4_k_m", self.native_quant) if q in QUANT_SCHEMES]
        quants = list(dict.fromkeys(quants))
        groups = self.param_groups()
        return {
            "name": self.name, "hf_id": self.hf_id, "family": self.family, "source": self.source,
            "layers": self.n_layers, "moe_layers": self.n_moe_layers, "dense_layers": list(self.dense_layers),
            "experts": self.n_experts, "top_k": self.top_k, "shared_experts": self.n_shared_experts,
            "gating": self.gating, "norm_topk_prob": self.norm_topk_prob, "hidden_size": self.hidden_size,
            "moe_intermediate_size": self.moe_intermediate_size, "vocab_size": self.vocab_size,
            "attention": dict(self.attention), "native_quant": self.native_quant,
            "params": {"total": self.total_params(), "by_group": groups,
                       "active_with_embeddings": self.active_params("with_embeddings"),
                       "active_without_embedding_table": self.active_params("without_embedding_table"),
                       "active_without_embeddings": self.active_params("without_embeddings")},
            "published": {"total_params_b": self.total_params_b, "active_params_b": self.active_params_b,
                          "active_params_convention": self.active_params_convention,
                          "active_params_source": self.active_params_source},
            "params_per_expert": self.params_per_expert,
            "bytes_per_expert": {q: self.bytes_per_expert(q) for q in quants},
            "dense_bytes_per_token": {q: self.dense_bytes_per_token(q) for q in quants},
            "active_bytes_per_token": {q: self.active_bytes_per_token(q) for q in quants},
            "expert_bytes_total": {q: self.expert_bytes_total(q) for q in quants},
            "file_bytes": {q: self.file_bytes(q) for q in quants},
            "kv_bytes_per_token_at_4096": self.kv_read_bytes(4096),
        }


def _preset_dir() -> Path:
    return Path(str(resources.files("moesim.costmodel") / "presets" / "models"))


def model_names() -> list[str]:
    return sorted(p.stem for p in _preset_dir().glob("*.toml"))


def _layers(spec, n_layers: int) -> tuple[int, ...]:
    if spec == "all":
        return tuple(range(n_layers))
    if isinstance(spec, str) and "-" in spec:
        a, b = spec.split("-")
        return tuple(range(int(a), int(b) + 1))
    return tuple(int(x) for x in spec)


def _check_keys(table: dict, allowed: set, where: str, path: Path) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise MoesimError(f"{path}: unknown key '{where}{unknown[0]}' in model preset")


def find_model(model_id: str) -> ModelPreset | None:
    """The preset whose name or Hugging Face id matches a trace's ``model_id`` (case-insensitive), else None."""
    key = model_id.strip().lower()
    for name in model_names():
        m = load_model(name)
        ids = {m.name.lower(), m.hf_id.lower(), m.hf_id.split("/")[-1].lower()}
        if key in ids or key.split("/")[-1] in ids:
            return m
    return None


def load_model(name_or_path: str) -> ModelPreset:
    """A model preset by name (``moesim models list``) or from a TOML file path."""
    path = Path(name_or_path)
    if not (path.suffix == ".toml" and path.exists()):
        if path.suffix == ".toml" or "/" in str(name_or_path):
            raise MoesimError(f"model preset file not found: {name_or_path}")
        path = _preset_dir() / f"{name_or_path}.toml"
        if not path.exists():
            raise MoesimError(f"unknown model preset {name_or_path!r} (known: {', '.join(model_names())})")
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise MoesimError(f"{path}: not valid TOML ({exc})") from None
    try:
        _check_keys(doc, _TOP_KEYS, "", path)
        moe, dense = doc["moe"], doc["dense"]
        _check_keys(moe, _MOE_KEYS, "moe.", path)
        _check_keys(dense, _DENSE_KEYS, "dense.", path)
        attention = dict(doc.get("attention", {}))
        _check_keys(attention, _ATTN_KEYS, "attention.", path)
        m = ModelPreset(
            name=doc["name"], hf_id=doc.get("hf_id", ""), family=doc["family"], source=doc.get("source", ""),
            n_layers=int(moe["n_layers"]), moe_layers=_layers(moe.get("moe_layers", "all"), int(moe["n_layers"])),
            n_experts=int(moe["n_experts"]), top_k=int(moe["top_k"]), gating=moe["gating"],
            norm_topk_prob=bool(moe.get("norm_topk_prob", True)),
            moe_intermediate_size=int(moe["moe_intermediate_size"]), hidden_size=int(dense["hidden_size"]),
            vocab_size=int(dense["vocab_size"]), n_shared_experts=int(moe.get("n_shared_experts", 0)),
            shared_expert_intermediate_size=int(moe.get("shared_expert_intermediate_size", 0)),
            dense_intermediate_size=int(moe.get("dense_intermediate_size", 0)),
            routed_scaling_factor=float(moe.get("routed_scaling_factor", 1.0)),
            n_group=int(moe.get("n_group", 1)), topk_group=int(moe.get("topk_group", 1)),
            glu=bool(moe.get("glu", True)), tie_word_embeddings=bool(dense.get("tie_word_embeddings", False)),
            total_params_b=float(doc.get("total_params_b", 0.0)), attention=attention,
            active_params_b=float(doc.get("active_params_b", 0.0)),
            active_params_convention=str(doc.get("active_params_convention", "with_embeddings")),
            active_params_source=str(doc.get("active_params_source", "")),
            native_quant=str(doc.get("native_quant", "bf16")),
            expert_bias=bool(moe.get("expert_bias", False)), router_bias=bool(moe.get("router_bias", False)),
            shared_expert_gate=bool(moe.get("shared_expert_gate", False)),
        )
    except KeyError as exc:
        raise MoesimError(f"{path}: model preset is missing required key {exc.args[0]!r}") from None
    except (ValueError, TypeError) as exc:
        raise MoesimError(f"{path}: not a valid model preset ({exc})") from None
    _validate_model(m, path)
    return m


def _validate_model(m: ModelPreset, path: Path) -> None:
    def bad(msg):
        raise MoesimError(f"{path}: {msg}")

    for name in ("n_layers", "n_experts", "top_k", "moe_intermediate_size", "hidden_size", "vocab_size"):
        if getattr(m, name) <= 0:
            bad(f"{name} must be > 0 (got {getattr(m, name)})")
    if m.top_k > m.n_experts:
        bad(f"top_k ({m.top_k}) exceeds n_experts ({m.n_experts})")
    if not m.moe_layers or min(m.moe_layers) < 0 or max(m.moe_layers) >= m.n_layers:
        bad(f"moe_layers must be indices in 0..{m.n_layers - 1}")
    if m.dense_layers and m.dense_intermediate_size <= 0:
        bad("dense layers need moe.dense_intermediate_size > 0")
    if m.n_shared_experts and m.shared_expert_intermediate_size <= 0:
        bad("shared experts need moe.shared_expert_intermediate_size > 0")
    if m.native_quant not in QUANT_SCHEMES:
        bad(f"native_quant {m.native_quant!r} is not one of {', '.join(QUANT_SCHEMES)}")
    if m.active_params_convention not in ACTIVE_CONVENTIONS:
        bad(f"active_params_convention must be one of {', '.join(ACTIVE_CONVENTIONS)}")
    a = m.attention
    kind = a.get("kind", "gqa")
    if kind not in ATTENTION_KINDS:
        bad(f"attention.kind {kind!r} is not one of {', '.join(ATTENTION_KINDS)}")
    need = {"mla": ("n_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"),
            "hybrid_linear": ("n_heads", "head_dim", "full_attention_interval", "linear_n_key_heads",
                              "linear_n_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                              "linear_conv_kernel")}.get(kind, ("n_heads", "head_dim"))
    for key in need:
        if key not in a:
            bad(f"attention.kind = {kind!r} needs attention.{key}")
    if a.get("qk_norm", "none") not in ("none", "head", "full"):
        bad("attention.qk_norm must be 'none', 'head' or 'full'")
    if a.get("sliding_every") and "sliding_window" not in a:
        bad("attention.sliding_every needs attention.sliding_window")
