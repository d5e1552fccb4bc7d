"""Model geometry for imports whose files do not say it all: from a model preset or from flags."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from moesim.errors import MoesimError
from moesim.traces.importers.common import preset_for, preset_meta
from moesim.traces.meta import GATINGS, TraceMeta


@dataclass
class Geometry:
    """What the metadata needs beyond the rows: E, k, the gating and the preset's fields."""

    model_id: str
    n_experts: int
    top_k: int
    preset: Any = None
    known: dict = field(default_factory=dict)

    def check_layers(self, layers, where: str, fix: str = "give the original layer indices with --layers") -> None:
        """Every imported layer must be an MoE layer of the preset (a 1-based layer field would not be)."""
        if self.preset is None:
            return
        bad = sorted(set(layers) - set(self.preset.moe_layers))
        if bad:
            raise MoesimError(f"{where}: layer {bad[0]} is not an MoE layer of {self.preset.name} (MoE layers "
                              f"{_span(self.preset.moe_layers)}); {fix}")

    def meta(self, layers, *, tracer: dict, source: dict, gating: str | None = None,
             norm_topk_prob: bool | None = None, layout: str = "sparse", **more) -> TraceMeta:
        known = dict(self.known)
        family = known.pop("family", "unknown")
        if gating is not None:
            known["gating"] = gating
        if norm_topk_prob is not None:
            known["norm_topk_prob"] = norm_topk_prob
        if self.preset is not None:
            source = {**source, "preset": self.preset.name}
            if len(set(layers)) < self.preset.n_moe_layers:
                source["partial_layers"] = f"{len(set(layers))} of the model's {self.preset.n_moe_layers} MoE layers"
        n_candidates = self.n_experts if layout == "dense" else self.top_k
        return TraceMeta(model_id=self.model_id, family=family, n_experts=self.n_experts, top_k=self.top_k,
                         moe_layers=tuple(int(x) for x in layers), layout=layout, n_candidates=n_candidates,
                         synthetic=False, tracer=tracer, source=source, **known, **more)


def geometry(model_id: str | None, *, n_experts: int | None = None, top_k: int | None = None,
             file_experts: int | None = None, file_top_k: int | None = None, where: str,
             need_top_k: str = "--top-k K") -> Geometry:
    """E and k from the file (``file_*``, which flags and presets must agree with), the flags, or the
    model preset that ``model_id`` names (by name or Hugging Face id)."""
    preset = preset_for(model_id) if model_id else None
    for flag, val in (("--experts", n_experts), ("--top-k", top_k)):
        if val is not None and (isinstance(val, bool) or int(val) != val or val < 1):
            raise MoesimError(f"{flag} must be a positive whole number, got {val!r}")
    E = file_experts
    if n_experts is not None and E is not None and n_experts != E:
        raise MoesimError(f"{where}: the file holds {E} experts per layer, --experts says {n_experts}")
    E = E or n_experts
    if preset is not None:
        if E is not None and E != preset.n_experts:
            raise MoesimError(f"{where}: {E} experts per layer, but {preset.name} has {preset.n_experts}; is "
                              f"--model right?")
        E = E or preset.n_experts
    if E is None:
        raise MoesimError("give the number of routed experts per layer with --experts E (or a --model that names a "
                          "moesim model preset: moesim models list)")
    k = file_top_k
    if top_k is not None and k is not None and top_k != k:
        raise MoesimError(f"{where}: the file selects {k} experts per token, --top-k says {top_k}")
    k = k or top_k
    if preset is not None:
        if k is not None and k != preset.top_k and top_k is None:
            raise MoesimError(f"{where}: {k} experts per token, but {preset.name} selects {preset.top_k}")
        k = k or preset.top_k
    if k is None:
        raise MoesimError(f"give the experts each token selects with {need_top_k} (the file does not say it; or "
                          "a --model that names a moesim model preset)")
    if not 1 <= k <= E:
        raise MoesimError(f"top-k must be in 1..E={E}, got {k}")
    model = model_id or "unknown"
    return Geometry(model_id=model, n_experts=int(E), top_k=int(k), preset=preset, known=preset_meta(preset))


def check_gating(gating: str | None) -> str | None:
    if gating is not None and gating not in GATINGS:
        raise MoesimError(f"unknown gating {gating!r} (expected one of {', '.join(GATINGS)})")
    return gating


def _span(xs) -> str:
    xs = list(xs)
    return f"{xs[0]}..{xs[-1]}" if xs == list(range(xs[0], xs[-1] + 1)) else ", ".join(map(str, xs))
