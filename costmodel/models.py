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
from moesim.files import read_toml
from moesim.traces.meta import GATINGS

_G = ("expert", "dense", "router", "embed", "lm_head", "small")
GROUPS = _G


def _load_quants() -> dict[str, dict[str, float]]:
    """The named mixes of presets/quants.toml: bits per weight of each tensor group, plus a ``source`` line."""
    doc = tomllib.loads((Path(str(resources.files("moesim.costmodel") / "presets")) / "quants.toml").read_text())
    return {name: {g: float(t[g]) for g in _G} for name, t in doc.items()}


def quant_sources() -> dict[str, str]:
    doc = tomllib.loads((Path(str(resources.files("moesim.costmodel") / "presets")) / "quants.toml").read_text())
    return {name: str(t.get("source", "")) for name, t in doc.items()}


# Bits per weight by tensor group for each named mix (data: presets/quants.toml); QUANT_BITS = the expert bits.
QUANT_SCHEMES: dict[str, dict[str, float]] = _load_quants()
QUANT_BITS = {q: s["expert"] for q, s in QUANT_SCHEMES.items()}

# Keys a model TOML may hold, per table; anything else is a typo worth an error.
_TOP_KEYS = {"name", "hf_id", "family", "source", "total_params_b", "active_params_b", "active_params_convention",
             "active_params_source", "native_quant", "moe", "dense", "attention", "quant"}
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
    quants: dict = field(default_factory=dict)  # this model's own mixes ([quant.NAME] tables, or a GGUF's exact bits)
    path: str = ""

    def quant_names(self) -> list[str]:
        return list(dict.fromkeys([*self.quants, *QUANT_SCHEMES]))

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
        return int(round(self.params_per_expert * self._scheme(quant)["expert"] / 8))

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
        if quant in self.quants:
            return self.quants[quant]
        if quant not in QUANT_SCHEMES:
            raise MoesimError(f"unknown quantization {quant!r} (known: {', '.join(self.quant_names())})")
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
        quants = [q for q in ("bf16", "q8_0", "q4_k_m", *self.quants, self.native_quant) if q in self.quant_names()]
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


def _layers(spec, n_layers: int, path: Path) -> tuple[int, ...]:
    """moe_layers: "all", "A-B" or a list of layer indices, each in 0..n_layers-1 (checked before any range is
    built, so a typo cannot allocate a billion-entry tuple)."""
    def bad():
        raise MoesimError(f"{path}: moe.moe_layers must be \"all\", \"A-B\" or a list of layer indices in "
                          f"0..{n_layers - 1} (got {spec!r:.80})")

    if spec == "all":
        return tuple(range(n_layers))
    if isinstance(spec, str):
        a, sep, b = spec.partition("-")
        if not (sep and a.strip().isdigit() and b.strip().isdigit()):
            bad()
        lo, hi = int(a), int(b)
        if not 0 <= lo <= hi < n_layers:
            bad()
        return tuple(range(lo, hi + 1))
    if not isinstance(spec, list) or len(spec) > n_layers:
        bad()
    out = tuple(_whole(x, "moe.moe_layers", path, 0, n_layers - 1) for x in spec)
    if len(set(out)) != len(out):
        bad()
    return out


# Bounds on every size a model file gives: far above any real model (DeepSeek-V3: 61 layers, 256 experts, hidden
# 7168, vocabulary 129280), low enough that a typo cannot make moesim allocate gigabytes or loop for minutes.
SIZE_BOUNDS = {
    "n_layers": (1, 1024), "n_experts": (1, 32767), "top_k": (1, 32767), "moe_intermediate_size": (1, 1 << 22),
    "hidden_size": (1, 1 << 20), "vocab_size": (1, 1 << 24), "n_shared_experts": (0, 1024),
    "shared_expert_intermediate_size": (0, 1 << 22), "dense_intermediate_size": (0, 1 << 22),
    "n_group": (1, 32767), "topk_group": (1, 32767),
}
_ATTN_INTS = {"n_heads": (1, 1 << 16), "n_kv_heads": (1, 1 << 16), "head_dim": (1, 1 << 16),
              "q_lora_rank": (0, 1 << 20), "kv_lora_rank": (1, 1 << 20), "qk_nope_head_dim": (0, 1 << 16),
              "qk_rope_head_dim": (0, 1 << 16), "v_head_dim": (1, 1 << 16), "sliding_window": (1, 1 << 31),
              "sliding_every": (0, 1024), "full_attention_interval": (1, 1024), "linear_n_key_heads": (1, 1 << 16),
              "linear_n_value_heads": (1, 1 << 16), "linear_key_head_dim": (1, 1 << 16),
              "linear_value_head_dim": (1, 1 << 16), "linear_conv_kernel": (1, 1024)}
_ATTN_BOOLS = ("bias", "sinks", "output_gate")


def _whole(v, name: str, path: Path, lo: int, hi: int) -> int:
    """An integer in [lo, hi]; a float only if it is whole (``top_k = 8.9`` is an error, not 8)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
        raise MoesimError(f"{path}: {name} must be a whole number (got {v!r:.80})")
    if not lo <= v <= hi:
        raise MoesimError(f"{path}: {name} must be between {lo} and {hi} (got {v!r})")
    return int(v)


def _real(v, name: str, path: Path, lo: float = 0.0, hi: float = 1e15) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:  # also refuses nan and inf
        raise MoesimError(f"{path}: {name} must be a number between {lo:g} and {hi:g} (got {v!r:.80})")
    return float(v)


def _flag(v, name: str, path: Path) -> bool:
    if not isinstance(v, bool):
        raise MoesimError(f"{path}: {name} must be true or false (got {v!r:.80})")
    return v


def _text(v, name: str, path: Path) -> str:
    if not isinstance(v, str):
        raise MoesimError(f"{path}: {name} must be a string (got {v!r:.80})")
    return v


def _table(v, name: str, path: Path) -> dict:
    if not isinstance(v, dict):
        raise MoesimError(f"{path}: [{name}] must be a table")
    return v


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
    doc = read_toml(path, "model file")
    try:
        _check_keys(doc, _TOP_KEYS, "", path)
        moe, dense = _table(doc["moe"], "moe", path), _table(doc["dense"], "dense", path)
        _check_keys(moe, _MOE_KEYS, "moe.", path)
        _check_keys(dense, _DENSE_KEYS, "dense.", path)
        attention = dict(_table(doc.get("attention", {}), "attention", path))
        _check_keys(attention, _ATTN_KEYS, "attention.", path)
        for key, value in attention.items():
            if key in _ATTN_INTS:
                attention[key] = _whole(value, f"attention.{key}", path, *_ATTN_INTS[key])
            elif key in _ATTN_BOOLS:
                _flag(value, f"attention.{key}", path)
            else:
                _text(value, f"attention.{key}", path)

        def size(table: dict, where: str, key: str, default=None) -> int:
            if key not in table:
                if default is None:
                    raise KeyError(key)
                return default
            return _whole(table[key], f"{where}{key}", path, *SIZE_BOUNDS[key])

        n_layers = size(moe, "moe.", "n_layers")
        m = ModelPreset(
            name=_text(doc["name"], "name", path), hf_id=_text(doc.get("hf_id", ""), "hf_id", path),
            family=_text(doc["family"], "family", path), source=_text(doc.get("source", ""), "source", path),
            n_layers=n_layers, moe_layers=_layers(moe.get("moe_layers", "all"), n_layers, path),
            n_experts=size(moe, "moe.", "n_experts"), top_k=size(moe, "moe.", "top_k"),
            gating=_text(moe["gating"], "moe.gating", path),
            norm_topk_prob=_flag(moe.get("norm_topk_prob", True), "moe.norm_topk_prob", path),
            moe_intermediate_size=size(moe, "moe.", "moe_intermediate_size"),
            hidden_size=size(dense, "dense.", "hidden_size"), vocab_size=size(dense, "dense.", "vocab_size"),
            n_shared_experts=size(moe, "moe.", "n_shared_experts", 0),
            shared_expert_intermediate_size=size(moe, "moe.", "shared_expert_intermediate_size", 0),
            dense_intermediate_size=size(moe, "moe.", "dense_intermediate_size", 0),
            routed_scaling_factor=_real(moe.get("routed_scaling_factor", 1.0), "moe.routed_scaling_factor", path,
                                        1e-9, 1e6),
            n_group=size(moe, "moe.", "n_group", 1), topk_group=size(moe, "moe.", "topk_group", 1),
            glu=_flag(moe.get("glu", True), "moe.glu", path),
            tie_word_embeddings=_flag(dense.get("tie_word_embeddings", False), "dense.tie_word_embeddings", path),
            total_params_b=_real(doc.get("total_params_b", 0.0), "total_params_b", path, 0.0, 1e6),
            attention=attention,
            active_params_b=_real(doc.get("active_params_b", 0.0), "active_params_b", path, 0.0, 1e6),
            active_params_convention=_text(doc.get("active_params_convention", "with_embeddings"),
                                           "active_params_convention", path),
            active_params_source=_text(doc.get("active_params_source", ""), "active_params_source", path),
            native_quant=_text(doc.get("native_quant", "bf16"), "native_quant", path),
            expert_bias=_flag(moe.get("expert_bias", False), "moe.expert_bias", path),
            router_bias=_flag(moe.get("router_bias", False), "moe.router_bias", path),
            shared_expert_gate=_flag(moe.get("shared_expert_gate", False), "moe.shared_expert_gate", path),
            quants=_model_quants(doc.get("quant", {}), path), path=str(path),
        )
    except KeyError as exc:
        raise MoesimError(f"{path}: model preset is missing required key {exc.args[0]!r}") from None
    _validate_model(m, path)
    return m


def _model_quants(tables: dict, path: Path) -> dict[str, dict[str, float]]:
    """A model file's own [quant.NAME] tables: bits per group, unset groups taken from the named mix of the same
    name (or from ``base = "q4_k_m"``)."""
    out = {}
    if not isinstance(tables, dict):
        raise MoesimError(f"{path}: [quant] must hold tables [quant.NAME]")
    for name, t in tables.items():
        if not isinstance(t, dict):
            raise MoesimError(f"{path}: [quant.{name}] must be a table of bits per group")
        unknown = sorted(set(t) - set(_G) - {"base", "source"})
        if unknown:
            raise MoesimError(f"{path}: unknown key 'quant.{name}.{unknown[0]}' "
                              f"(groups: {', '.join(_G)}, base, source)")
        base = t.get("base", name if name in QUANT_SCHEMES else None)
        if base is not None and base not in QUANT_SCHEMES:
            raise MoesimError(f"{path}: quant.{name}.base {base!r} is not one of {', '.join(QUANT_SCHEMES)}")
        bits = dict(QUANT_SCHEMES[base]) if base else {}
        for g in _G:
            if g in t:
                v = t[g]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 64:
                    raise MoesimError(f"{path}: quant.{name}.{g} must be bits per weight in (0, 64] (got {v!r})")
                bits[g] = float(v)
        missing = [g for g in _G if g not in bits]
        if missing:
            raise MoesimError(f"{path}: quant.{name} needs bits for {', '.join(missing)} (or a base mix)")
        out[name] = bits
    return out


def check_sizes(m: ModelPreset, path) -> None:
    """Every size within SIZE_BOUNDS (a model file or a GGUF header alike)."""
    for name, (lo, hi) in SIZE_BOUNDS.items():
        v = getattr(m, name)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise MoesimError(f"{path}: {name} must be a whole number between {lo} and {hi} (got {v!r})")


def _validate_model(m: ModelPreset, path: Path) -> None:
    def bad(msg):
        raise MoesimError(f"{path}: {msg}")

    check_sizes(m, path)
    if m.top_k > m.n_experts:
        bad(f"top_k ({m.top_k}) exceeds n_experts ({m.n_experts})")
    if not m.moe_layers or min(m.moe_layers) < 0 or max(m.moe_layers) >= m.n_layers:
        bad(f"moe_layers must be indices in 0..{m.n_layers - 1}")
    if m.dense_layers and m.dense_intermediate_size <= 0:
        bad("dense layers need moe.dense_intermediate_size > 0")
    if m.n_shared_experts and m.shared_expert_intermediate_size <= 0:
        bad("shared experts need moe.shared_expert_intermediate_size > 0")
    if m.gating not in GATINGS:
        bad(f"moe.gating {m.gating!r} is not one of {', '.join(GATINGS)}")
    if 0 < m.total_params_b < m.active_params_b:
        bad(f"active_params_b ({m.active_params_b:g}) exceeds total_params_b ({m.total_params_b:g})")
    if m.topk_group > m.n_group or m.n_experts % m.n_group:
        bad(f"moe.n_group ({m.n_group}) must divide n_experts ({m.n_experts}) and be at least topk_group "
            f"({m.topk_group})")
    if m.native_quant not in m.quant_names():
        bad(f"native_quant {m.native_quant!r} is not one of {', '.join(m.quant_names())}")
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
    heads, kv = a.get("n_heads"), a.get("n_kv_heads")
    if heads is not None and kv is not None and (kv > heads or heads % kv):
        bad(f"attention.n_kv_heads ({kv}) must divide n_heads ({heads}): each KV head serves a whole group of "
            "query heads")
    if a.get("qk_norm", "none") not in ("none", "head", "full"):
        bad("attention.qk_norm must be 'none', 'head' or 'full'")
    if a.get("sliding_every") and "sliding_window" not in a:
        bad("attention.sliding_every needs attention.sliding_window")
