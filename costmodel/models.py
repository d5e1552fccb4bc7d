"""Model presets: architecture geometry read from the TOML files in presets/models/."""

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

    @property
    def dense_layers(self) -> tuple[int, ...]:
        moe = set(self.moe_layers)
        return tuple(i for i in range(self.n_layers) if i not in moe)

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


def load_model(name_or_path: str) -> ModelPreset:
    """A model preset by name (``moesim models list``) or from a TOML file path."""
    path = Path(name_or_path)
    if not (path.suffix == ".toml" and path.exists()):
        path = _preset_dir() / f"{name_or_path}.toml"
        if not path.exists():
            raise MoesimError(f"unknown model preset {name_or_path!r} (known: {', '.join(model_names())})")
    try:
        doc = tomllib.loads(path.read_text())
        moe, dense = doc["moe"], doc["dense"]
        return ModelPreset(
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
            total_params_b=float(doc.get("total_params_b", 0.0)), attention=dict(doc.get("attention", {})),
        )
    except (KeyError, ValueError, TypeError, tomllib.TOMLDecodeError) as exc:
        raise MoesimError(f"{path}: not a valid model preset ({exc!r})") from None
