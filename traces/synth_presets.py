"""Routing knobs of the synthetic-trace presets (the geometry comes from the model presets).

Every knob is explained in docs/synthetic.md. The values of ``qwen3-30b-a3b`` and
``qwen3-next-80b-a3b`` are calibrated against published measurements (docs/synthetic.md,
"Calibration"); the other presets reuse them, scaled to their expert counts, and are
not calibrated against anything.
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
    burst_frac: float = 0.0  # fraction of time an expert spends in a burst
    burst_len: float = 50.0  # mean burst length in tokens
    burst_boost: float = 0.0  # logit boost while bursting
    noise: float = 1.0  # scale of the per-token Gumbel noise (the unit of every other score knob)
    temperature: float = 1.0  # stored logits = score / temperature: spreads or flattens the gate weights
    offset: float = 0.0  # added to stored logits (sets where sigmoid gating saturates)
    grid: float = 1.0 / 32  # stored logits are multiples of this (power of two: exact, compresses well)
    candidates: int = 32  # M, scored experts stored per row (capped at E)
    default_domains: tuple[str, ...] = ("code", "prose", "math", "medical")

    def domain(self, name: str) -> DomainKnobs:
        return self.domains.get(name, self.default_domain)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["default_domains"] = list(self.default_domains)
        return d

    def replace(self, **changes) -> RoutingKnobs:
        return replace(self, **changes)


_QWEN3_30B = RoutingKnobs(
    zipf_shared=1.0,
    domains={
        "code": DomainKnobs(zipf=1.5, shared=0.3, weight=0.5),
        "prose": DomainKnobs(zipf=1.0),
        "math": DomainKnobs(zipf=1.0),
        "medical": DomainKnobs(zipf=1.0),
    },
    default_domain=DomainKnobs(zipf=1.0),
    topic_len=100.0, rho=0.9, drift=0.7,
    temperature=1.0,
)

PRESETS: dict[str, RoutingKnobs] = {
    "qwen3-30b-a3b": _QWEN3_30B,
    "qwen3-235b-a22b": _QWEN3_30B,
    "qwen3-next-80b-a3b": _QWEN3_30B,
    "mixtral-8x7b": _QWEN3_30B.replace(candidates=8),
    "deepseek-v3": _QWEN3_30B.replace(offset=-2.0),
    "olmoe-1b-7b": _QWEN3_30B,
    "gpt-oss-120b": _QWEN3_30B,
}


def preset_names() -> list[str]:
    return sorted(PRESETS)
