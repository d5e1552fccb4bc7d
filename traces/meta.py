"""Trace metadata: one JSON document under the Parquet key-value key ``moesim``."""

from __future__ import annotations

import dataclasses
import json
import math
import operator
from dataclasses import dataclass, field
from typing import Any

from moesim.errors import MoesimError

# Version 2 added the compact `ranked` layout (move-to-front ids, only the gate scores); version 3 is the
# ranked layout written today (plain ids and every candidate's logit). Version 2 files are still read
# (traces/ranked_v2.py), never written. Every other layout is written as version 1, so older readers keep
# reading them. A reader refuses versions it does not know.
SCHEMA_VERSION = 1
SCHEMA_VERSIONS = (1, 2, 3)
RANKED_SCHEMA_VERSION = 3
RANKED_SCHEMA_VERSIONS = (2, 3)
METADATA_KEY = b"moesim"

GATINGS = ("softmax", "softmax_topk", "sigmoid")
LAYOUTS = ("dense", "sparse", "counts", "ranked")
TIE_ORDERS = ("lower_id", "stored")
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

    ``layout``: ``dense`` (all E logits per row), ``sparse`` (the M best
    logits plus the log-sum-exp over all E), ``counts`` (a frequency-only
    trace: per (request, layer) row, how often each expert was selected, no
    time order; ``frequency_only`` must then be true) or ``ranked`` (schema
    version 3, compact: the M best experts in rank order and their logits;
    docs/trace-format.md). Ranked files of version 2 (move-to-front ids and
    only the gate scores) are still read; ``logit_scale`` (version 2 only, a
    power of two): their gate logits are integer gaps in these units.

    ``scores``: whether the candidates' scores are router logits (or, for
    softmax gatings, logits shifted by a per-row constant, e.g. log-probabilities),
    enough to re-select among the M candidates with the model's gating. False
    for sources without them (selected-only imports store placeholder scores, a
    sigmoid router's imported weights are no logits); ``has_scores`` is the test.

    ``tie_order``: how equal scores and equal gate weights are ranked.
    ``lower_id`` (the default, and every trace written before the field existed):
    the lower expert id first. ``stored``: the order of the row's ``selected`` /
    ``top_ids`` as stored, for sources that list each step's experts in the
    router's rank order but give no weights (their weights are exactly 1/k, so
    only the stored order can say which expert was the first choice).
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
    tie_order: str = "lower_id"
    logit_scale: float | None = None
    scores: bool = True
    tracer: dict[str, Any] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self):
        for name in _INT_FIELDS:
            object.__setattr__(self, name, _as_int(getattr(self, name), name))
        for name in ("moe_layers", "dense_layers"):
            value = getattr(self, name)
            if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
                raise MoesimError(f"trace metadata field {name} must be a list of layer indices, got {value!r}")
            object.__setattr__(self, name, tuple(_as_int(x, name) for x in value))
        if self.layout == "dense" and self.n_candidates == 0:
            object.__setattr__(self, "n_candidates", self.n_experts)
        if self.layout == "ranked" and self.schema_version == SCHEMA_VERSION:
            object.__setattr__(self, "schema_version", RANKED_SCHEMA_VERSION)
        if self.selection_bias is not None:
            try:
                rows = tuple(tuple(float(v) for v in row) for row in self.selection_bias)
            except (TypeError, ValueError):
                raise MoesimError("selection_bias must be a list of E numbers per MoE layer") from None
            object.__setattr__(self, "selection_bias", rows)
        self.check()

    @property
    def n_layers(self) -> int:
        return len(self.moe_layers)

    @property
    def has_scores(self) -> bool:
        """Do the rows carry candidate scores a step policy can re-select with (Routing.logits)? Not a
        counts trace, a version-2 ranked one (it kept only the gate scores of the selection) or one whose
        metadata says ``scores: false``. (A selected-only import written before that field existed is
        found when decoded: its placeholder scores are all equal, and Routing.logits is None.)"""
        return (self.scores and self.layout != "counts"
                and not (self.layout == "ranked" and self.schema_version == 2))

    def check(self) -> None:
        """Raise MoesimError on metadata that cannot describe a valid trace."""
        if self.schema_version not in SCHEMA_VERSIONS:
            raise MoesimError(_version_error(self.schema_version))
        if (self.layout == "ranked") != (self.schema_version in RANKED_SCHEMA_VERSIONS):
            raise MoesimError(f"schema version {self.schema_version} does not go with the {self.layout} layout "
                              f"(versions 2 and 3 are the ranked layout, version 1 the others)")
        for name in ("model_id", "family"):
            if not isinstance(getattr(self, name), str):
                raise MoesimError(f"trace metadata field {name} must be a string, got {getattr(self, name)!r}")
        for name in ("norm_topk_prob", "synthetic", "frequency_only", "scores"):
            if not isinstance(getattr(self, name), bool):
                raise MoesimError(f"trace metadata field {name} must be true or false, got {getattr(self, name)!r}")
        for name in ("tracer", "source", "bytes_per_expert"):
            if not isinstance(getattr(self, name), dict):
                raise MoesimError(f"trace metadata field {name} must be a JSON object, got {getattr(self, name)!r}")
        for quant, size in self.bytes_per_expert.items():
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise MoesimError(f"bytes_per_expert[{quant!r}] must be a non-negative integer, got {size!r}")
        if self.n_experts < 1 or self.n_experts > 32767:
            raise MoesimError(f"number of experts E must be an integer in 1..32767, got {self.n_experts!r}")
        if self.top_k < 1 or self.top_k > self.n_experts:
            raise MoesimError(f"top-k must be an integer in 1..E={self.n_experts}, got k={self.top_k!r}")
        if self.n_shared_experts < 0:
            raise MoesimError(f"n_shared_experts must be >= 0, got {self.n_shared_experts}")
        if self.gating not in GATINGS:
            raise MoesimError(f"unknown gating function {self.gating!r} (expected one of {', '.join(GATINGS)})")
        if self.tie_order not in TIE_ORDERS:
            raise MoesimError(f"unknown tie_order {self.tie_order!r} (expected one of {', '.join(TIE_ORDERS)})")
        if self.layout not in LAYOUTS:
            raise MoesimError(f"unknown score layout {self.layout!r} (expected dense or sparse)")
        if not self.moe_layers:
            raise MoesimError("trace metadata lists no MoE layers")
        if len(set(self.moe_layers)) != len(self.moe_layers) or any(x < 0 for x in self.moe_layers):
            raise MoesimError("MoE layer indices must be distinct and non-negative")
        if any(x > 32767 for x in self.moe_layers):
            raise MoesimError("MoE layer indices must fit the int16 layer column (<= 32767)")
        if len(set(self.dense_layers)) != len(self.dense_layers) or any(not 0 <= x <= 32767 for x in self.dense_layers):
            raise MoesimError("dense layer indices must be distinct integers in 0..32767")
        if set(self.dense_layers) & set(self.moe_layers):
            raise MoesimError("a layer cannot be both dense and MoE (dense_layers overlaps moe_layers)")
        if self.layout == "dense" and self.n_candidates != self.n_experts:
            raise MoesimError("a dense trace scores all E experts (n_candidates must equal E)")
        if self.logit_scale is not None:
            ls = self.logit_scale
            if (self.layout != "ranked" or self.schema_version != 2 or isinstance(ls, bool)
                    or not isinstance(ls, (int, float)) or not math.isfinite(ls) or ls <= 0
                    or math.frexp(ls)[0] != 0.5):
                raise MoesimError(f"logit_scale must be a power of two and only goes with the ranked layout of "
                                  f"schema version 2, got {ls!r}")
            if self.gating == "sigmoid" or self.top_k < 2:
                raise MoesimError("logit_scale (gate logits as gaps) needs softmax gating and top-k >= 2")
        if self.layout in ("sparse", "ranked") and not (self.top_k <= self.n_candidates <= self.n_experts):
            raise MoesimError(
                f"a sparse trace needs k <= M <= E candidates per row, got M={self.n_candidates}, "
                f"k={self.top_k}, E={self.n_experts}"
            )
        if (self.layout == "counts") != self.frequency_only:
            raise MoesimError("the counts layout and frequency_only: true go together (a frequency-only trace "
                              "stores expert counts, an ordered trace stores scores)")
        if self.layout == "counts" and self.n_candidates != 0:
            raise MoesimError("a counts trace scores no candidates (n_candidates must be 0)")
        if self.selection_bias is not None:
            if len(self.selection_bias) != self.n_layers or any(len(r) != self.n_experts for r in self.selection_bias):
                raise MoesimError("selection_bias must hold E values for each MoE layer")
            if not all(math.isfinite(v) for r in self.selection_bias for v in r):
                raise MoesimError("selection_bias holds NaN or infinite values")
        if self.n_group < 1 or self.n_experts % self.n_group or not (1 <= self.topk_group <= self.n_group):
            raise MoesimError("n_group must divide E and 1 <= topk_group <= n_group")
        if self.n_group > 1 and self.top_k > self.topk_group * (self.n_experts // self.n_group):
            raise MoesimError("group-limited routing keeps fewer experts (topk_group x E/n_group) than top-k")
        rsf = self.routed_scaling_factor
        if isinstance(rsf, bool) or not isinstance(rsf, (int, float)) or not math.isfinite(rsf):
            raise MoesimError(f"routed_scaling_factor must be a finite number, got {rsf!r}")

    def to_json(self) -> str:
        doc = dataclasses.asdict(self)
        if doc["tie_order"] == "lower_id":
            # the default is left out, so traces written without the field stay byte for byte the same
            del doc["tie_order"]
        if doc["logit_scale"] is None:
            del doc["logit_scale"]  # likewise
        if doc["scores"]:
            del doc["scores"]  # likewise
        return json.dumps(doc, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> TraceMeta:
        try:
            doc = json.loads(text)
        except RecursionError:
            raise MoesimError("trace metadata is JSON nested too deeply") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise MoesimError(f"trace metadata is not valid JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise MoesimError("trace metadata is not a JSON object")
        if _depth(doc) > MAX_DEPTH:
            # copying or printing it (info, sweep rows) would recurse once per level
            raise MoesimError(f"trace metadata is nested more than {MAX_DEPTH} levels deep")
        version = doc.get("schema_version")
        if isinstance(version, bool) or version not in SCHEMA_VERSIONS:
            raise MoesimError(_version_error(version))
        names = {f.name for f in dataclasses.fields(cls)}
        required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING]
        missing = [n for n in required if n not in doc]
        if missing:
            raise MoesimError(f"trace metadata lacks {', '.join(missing)}")
        unknown = sorted(set(doc) - names)
        kwargs = {k: v for k, v in doc.items() if k in names}
        if unknown:
            src = kwargs.get("source") or {}
            if not isinstance(src, dict):
                raise MoesimError(f"trace metadata field source must be a JSON object, got {src!r:.60}")
            kwargs["source"] = {**src, "unknown_metadata": {k: doc[k] for k in unknown}}
        try:
            return cls(**kwargs)
        except (TypeError, ValueError, OverflowError) as exc:
            raise MoesimError(f"trace metadata is malformed ({exc})") from None

    def replace(self, **changes) -> TraceMeta:
        return dataclasses.replace(self, **changes)


def _version_error(version) -> str:
    return (f"unsupported trace schema version {version!r} "
            f"(this moesim reads versions {', '.join(map(str, SCHEMA_VERSIONS))})")


MAX_DEPTH = 64  # levels of nesting a metadata document may have (real ones have 4)


def _depth(doc) -> int:
    """Nesting depth of a JSON document, without recursion."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if d > MAX_DEPTH:
            break
        if isinstance(node, dict):
            stack.extend((v, d + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, d + 1) for v in node)
    return deepest


_INT_FIELDS = ("n_experts", "top_k", "n_candidates", "n_shared_experts", "n_group", "topk_group", "schema_version")


def _as_int(value, name: str) -> int:
    """Accept Python and numpy integers; refuse bools, floats and strings (a 6.5-expert top-k is a bug)."""
    if isinstance(value, bool):
        raise MoesimError(f"trace metadata field {name} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise MoesimError(f"trace metadata field {name} must be an integer, got {value!r}") from None
