"""Routing knobs of the synthetic-trace presets (the geometry comes from the model presets).

Every knob is explained in docs/synthetic.md. The values of ``qwen3-30b-a3b`` and
``qwen3-next-80b-a3b`` are calibrated against published measurements (docs/synthetic.md,
"Calibration"); the other presets reuse the Qwen3-30B-A3B knobs (the tail cutoff is
relative to E) and are not calibrated against anything: they have the right geometry and
plausible, not measured, routing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace


@dataclass(frozen=True)
class DomainKnobs:
    """How one domain routes: its own popularity ranking over the experts of each layer."""

    zipf: float = 1.0  # exponent of the domain's own Zipf popularity
    shared: float = 1.0  # multiplier of the layer's shared popularity inside this domain
    weight: float = 1.0  # relative share of topic segments drawn from this domain


@dataclass(frozen=True)
class RoutingKnobs:
    zipf_shared: float = 1.0  # exponent of the per-layer popularity shared by all domains
    cutoff: float = 0.0  # exponential cutoff of the popularity tail: score -= cutoff * rank / E
    domains: dict[str, DomainKnobs] = field(default_factory=dict)  # known domains; others get `default_domain`
    default_domain: DomainKnobs = DomainKnobs()
    topic_len: float = 100.0  # mean tokens per topic segment (geometric lengths)
    rho: float = 0.5  # AR(1) coefficient per token of the sticky drift
    drift: float = 0.5  # stationary standard deviation of the drift (logit units; per-token noise is 1)
    noise: float = 1.0  # scale of the per-token Gumbel noise (the unit of every other score knob)
    temperature: float = 1.0  # stored logits = score / temperature: spreads or flattens the gate weights
    offset: float = 0.0  # added to stored logits (sets where sigmoid gating saturates)
    grid: float = 1.0 / 32  # stored logits are multiples of this (power of two: exact, compresses well)
    candidates: int = 32  # M, scored experts stored per row (capped at E)
    # layer coupling: probability that an expert's random draws at layer l+1 (drift innovation and noise)
    # are its predecessor's at layer l, this token (generator 2 only; 0: layers independent)
    couple: float = 0.0
    # --lookahead: Gumbel noise (logit units) on the next layer's candidates before taking their top-k
    lookahead_noise: float = 0.25
    default_domains: tuple[str, ...] = ("code", "prose", "math", "medical")

    def domain(self, name: str) -> DomainKnobs:
        return self.domains.get(name, self.default_domain)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["default_domains"] = list(self.default_domains)
        return d

    def replace(self, **changes) -> RoutingKnobs:
        return replace(self, **changes)


# Calibrated (docs/synthetic.md, "Calibration") against the published Qwen3-30B-A3B routing profile.
_QWEN3_30B = RoutingKnobs(
    zipf_shared=1.09,
    cutoff=1.57,
    domains={
        "code": DomainKnobs(zipf=1.83, shared=0.70, weight=0.46),
        "prose": DomainKnobs(zipf=0.88),
        "math": DomainKnobs(zipf=0.88),
        "medical": DomainKnobs(zipf=0.88),
    },
    default_domain=DomainKnobs(zipf=0.88),
    topic_len=22.0, rho=0.81, drift=1.04,
    candidates=32,
    # layer coupling, calibrated to the real FLAME-MoE-290M routing (docs/coupling.md)
    couple=0.9,
)


def _concentrated(knobs: RoutingKnobs, factor: float, **changes) -> RoutingKnobs:
    """The same routing with every popularity exponent multiplied by ``factor``."""
    doms = {n: replace(d, zipf=round(d.zipf * factor, 4)) for n, d in knobs.domains.items()}
    return knobs.replace(zipf_shared=round(knobs.zipf_shared * factor, 4), domains=doms,
                         default_domain=replace(knobs.default_domain,
                                                zipf=round(knobs.default_domain.zipf * factor, 4)),
                         **changes)


PRESETS: dict[str, RoutingKnobs] = {
    "qwen3-30b-a3b": _QWEN3_30B,
    "qwen3-235b-a22b": _QWEN3_30B,
    # Calibrated against the substitution study's hit rates (25% of experts resident, freq eviction).
    "qwen3-next-80b-a3b": _concentrated(_QWEN3_30B, 1.17, candidates=24),
    "mixtral-8x7b": _QWEN3_30B.replace(candidates=8),
    # Sigmoid gating saturates for large scores: shift the logits so the selected experts' sigmoids spread.
    "deepseek-v3": _QWEN3_30B.replace(offset=-8.0, candidates=32),
    "olmoe-1b-7b": _QWEN3_30B,
    "gpt-oss-120b": _QWEN3_30B.replace(candidates=16),
}


def preset_names() -> list[str]:
    return sorted(PRESETS)
