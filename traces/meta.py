"""Trace metadata: one JSON document under the Parquet key-value key ``moesim``."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from moesim.errors import MoesimError

SCHEMA_VERSION = 1
METADATA_KEY = b"moesim"

GATINGS = ("softmax", "softmax_topk", "sigmoid")
LAYOUTS = ("dense", "sparse")
PHASES = ("prefill", "decode")


@dataclass(frozen=True)
class TraceMeta:
    """Everything a reader needs to interpret the rows of a trace.

    ``moe_layers`` are the model's original layer indices of the MoE layers, in
    order; the ``layer`` column holds these original indices. ``n_candidates``
    is M, the number of scored experts per row (E for the dense layout).
    ``gating``: ``softmax`` (softmax over all E, then top-k; ``norm_topk_prob``
    says whether the model renormalizes the k weights), ``softmax_topk`` (top-k
    of the logits, softmax over those k: Mixtral, gpt-oss) or ``sigmoid``
    (DeepSeek-V3: selection by sigmoid + ``selection_bias``, optionally
    group-limited by ``n_group``/``topk_group``).
    """

    model_id: str
    family: str
    n_experts: int
    top_k: int
    moe_layers: tuple[int, ...]
    gating: str = "softmax"
    norm_topk_prob: bool = True
    layout: str = "sparse"
    n_candidates: int = 0
    routed_scaling_factor: float = 1.0
    n_shared_experts: int = 0
    dense_layers: tuple[int, ...] = ()
    bytes_per_expert: dict[str, int] = field(default_factory=dict)
    selection_bias: tuple[tuple[float, ...], ...] | None = None
    n_group: int = 1
    topk_group: int = 1
    synthetic: bool = False
    frequency_only: bool = False
    tracer: dict[str, Any] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self):
        if self.layout == "dense" and self.n_candidates == 0:
            object.__setattr__(self, "n_candidates", self.n_experts)
        object.__setattr__(self, "moe_layers", tuple(int(x) for x in self.moe_layers))
        object.__setattr__(self, "dense_layers", tuple(int(x) for x in self.dense_layers))
        if self.selection_bias is not None:
            object.__setattr__(
                self, "selection_bias", tuple(tuple(float(v) for v in row) for row in self.selection_bias)
            )
        self.check()

    @property
    def n_layers(self) -> int:
        return len(self.moe_layers)

    def check(self) -> None:
        """Raise MoesimError on metadata that cannot describe a valid trace."""
        if self.schema_version != SCHEMA_VERSION:
            raise MoesimError(
                f"unsupported trace schema version {self.schema_version!r} (this moesim reads version {SCHEMA_VERSION})"
            )
        if not isinstance(self.n_experts, int) or self.n_experts < 1 or self.n_experts > 32767:
            raise MoesimError(f"number of experts E must be an integer in 1..32767, got {self.n_experts!r}")
        if not isinstance(self.top_k, int) or self.top_k < 1 or self.top_k > self.n_experts:
            raise MoesimError(f"top-k must be an integer in 1..E={self.n_experts}, got k={self.top_k!r}")
        if self.gating not in GATINGS:
            raise MoesimError(f"unknown gating function {self.gating!r} (expected one of {', '.join(GATINGS)})")
        if self.layout not in LAYOUTS:
            raise MoesimError(f"unknown score layout {self.layout!r} (expected dense or sparse)")
        if not self.moe_layers:
            raise MoesimError("trace metadata lists no MoE layers")
        if len(set(self.moe_layers)) != len(self.moe_layers) or any(x < 0 for x in self.moe_layers):
            raise MoesimError("MoE layer indices must be distinct and non-negative")
        if self.layout == "dense" and self.n_candidates != self.n_experts:
            raise MoesimError("a dense trace scores all E experts (n_candidates must equal E)")
        if self.layout == "sparse" and not (self.top_k <= self.n_candidates <= self.n_experts):
            raise MoesimError(
                f"a sparse trace needs k <= M <= E candidates per row, got M={self.n_candidates}, "
                f"k={self.top_k}, E={self.n_experts}"
            )
        if self.selection_bias is not None:
            if len(self.selection_bias) != self.n_layers or any(len(r) != self.n_experts for r in self.selection_bias):
                raise MoesimError("selection_bias must hold E values for each MoE layer")
            if not all(math.isfinite(v) for r in self.selection_bias for v in r):
                raise MoesimError("selection_bias holds NaN or infinite values")
        if self.n_group < 1 or self.n_experts % self.n_group or not (1 <= self.topk_group <= self.n_group):
            raise MoesimError("n_group must divide E and 1 <= topk_group <= n_group")
        if not math.isfinite(self.routed_scaling_factor):
            raise MoesimError("routed_scaling_factor must be finite")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> TraceMeta:
        try:
            doc = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise MoesimError(f"trace metadata is not valid JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise MoesimError("trace metadata is not a JSON object")
        version = doc.get("schema_version")
        if version != SCHEMA_VERSION:
            raise MoesimError(
                f"unsupported trace schema version {version!r} (this moesim reads version {SCHEMA_VERSION})"
            )
        names = {f.name for f in dataclasses.fields(cls)}
        required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING]
        missing = [n for n in required if n not in doc]
        if missing:
            raise MoesimError(f"trace metadata lacks {', '.join(missing)}")
        unknown = sorted(set(doc) - names)
        kwargs = {k: v for k, v in doc.items() if k in names}
        if unknown:
            src = dict(kwargs.get("source") or {})
            src["unknown_metadata"] = {k: doc[k] for k in unknown}
            kwargs["source"] = src
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as exc:
            raise MoesimError(f"trace metadata is malformed ({exc})") from None

    def replace(self, **changes) -> TraceMeta:
        return dataclasses.replace(self, **changes)
