"""Policy configurations: frozen, validated, hashable, keyed by a stable hash."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass

from moesim.errors import MoesimError
from moesim.policies import miss as miss_mod
from moesim.policies import prefetch as prefetch_mod
from moesim.policies import registry
from moesim.policies.miss import parse_miss
from moesim.policies.registry import parse_eviction

ALLOCATIONS = ("per-layer", "global")
_LATER_DEFAULTS = {"prefetch": "none", "prefetch_depth": 1, "prefetch_train": None, "overlap": None}


def slots_for_budget(budget: float, n_experts: int) -> int:
    """Cache slots per layer for a budget (a fraction of each layer's E experts): floor(budget x E),
    to within float noise."""
    return math.floor(budget * n_experts + 1e-9)


@dataclass(frozen=True)
class SimConfig:
    """One replay configuration. Give exactly one of ``budget`` (fraction of the
    routed experts, floor(budget * E) slots per layer) or ``slots`` (per layer)."""

    eviction: str = "lru"
    miss: str = "fetch-all"
    admit: float | None = None
    budget: float | None = None
    slots: int | None = None
    allocation: str = "per-layer"
    warm: bool = False
    warmup_tokens: int = 0
    reset_per_sequence: bool = False
    batch: int = 1
    prefetch: str = "none"
    prefetch_depth: int = 1
    prefetch_train: str | None = None
    overlap: str | None = None  # none | layer | cross-layer; None: the engine profile's (docs/replay-semantics.md)

    def __post_init__(self):
        ev, ev_arg = parse_eviction(self.eviction)
        ms, theta = parse_miss(self.miss)
        # canonical spellings so equal configs hash equally
        object.__setattr__(self, "eviction", ev if ev_arg is None else f"{ev}:{ev_arg:g}")
        object.__setattr__(self, "miss", ms if ms != "threshold" else f"threshold:{theta:g}")
        if (self.budget is None) == (self.slots is None):
            raise MoesimError("give exactly one of budget (fraction of experts) or slots (per layer)")
        if self.budget is not None:
            b = float(self.budget)
            if not (math.isfinite(b) and 0.0 < b <= 1.0):
                raise MoesimError(f"budget must be a fraction in (0, 1], got {self.budget!r}")
            object.__setattr__(self, "budget", b)
        if self.slots is not None:
            if int(self.slots) != self.slots or self.slots < 1:
                raise MoesimError(f"slots must be a positive whole number, got {self.slots!r}")
            object.__setattr__(self, "slots", int(self.slots))
        if self.admit is not None:
            a = float(self.admit)
            if not (math.isfinite(a) and a > 0.0):
                raise MoesimError(f"admission threshold beta must be positive, got {self.admit!r}")
            object.__setattr__(self, "admit", a)
        if self.allocation not in ALLOCATIONS:
            raise MoesimError(f"allocation must be per-layer or global, got {self.allocation!r}")
        if int(self.warmup_tokens) != self.warmup_tokens or self.warmup_tokens < 0:
            raise MoesimError(f"warmup_tokens must be a non-negative whole number, got {self.warmup_tokens!r}")
        object.__setattr__(self, "warmup_tokens", int(self.warmup_tokens))
        if int(self.batch) != self.batch or self.batch < 1:
            raise MoesimError(f"batch must be a positive whole number, got {self.batch!r}")
        object.__setattr__(self, "batch", int(self.batch))
        prefetch_mod.get(self.prefetch)
        if int(self.prefetch_depth) != self.prefetch_depth or self.prefetch_depth < 1:
            raise MoesimError(f"prefetch depth must be a positive whole number of layers, got {self.prefetch_depth!r}")
        object.__setattr__(self, "prefetch_depth", int(self.prefetch_depth))
        if self.prefetch_train is not None:
            if self.prefetch != "next-layer":
                raise MoesimError("--prefetch-train trains the next-layer prefetch: give --prefetch next-layer")
            object.__setattr__(self, "prefetch_train", str(self.prefetch_train))
        if self.overlap is not None:
            prefetch_mod.overlap_code(self.overlap)

    @property
    def eviction_name(self) -> str:
        return parse_eviction(self.eviction)[0]

    @property
    def eviction_param(self) -> float | None:
        return parse_eviction(self.eviction)[1]

    @property
    def pinned(self) -> bool:
        """A fixed pinned set (static, static-layers): nothing is ever evicted or admitted."""
        return registry.get(self.eviction_name).pinned

    @property
    def substitutes(self) -> bool:
        """Its miss policy may substitute or drop (so background admission can act)."""
        return miss_mod.get(self.miss_name).substitutes

    @property
    def miss_name(self) -> str:
        return parse_miss(self.miss)[0]

    @property
    def theta(self) -> float:
        return parse_miss(self.miss)[1]

    def slots_per_layer(self, n_experts: int) -> int:
        if self.slots is not None:
            if self.slots > n_experts:
                raise MoesimError(f"slots per layer must be at most E={n_experts}, got {self.slots}")
            return self.slots
        assert self.budget is not None  # exactly one of slots and budget (checked on construction)
        n = slots_for_budget(self.budget, n_experts)
        if n < 1:
            raise MoesimError(f"budget {self.budget:g} of E={n_experts} experts gives {n} slots per layer; "
                              f"the smallest budget is {1 / n_experts:.4g}")
        return n

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        # fields added later are left out at their defaults, so earlier configs keep their keys
        for name, default in _LATER_DEFAULTS.items():
            if d[name] == default:
                del d[name]
        return d

    def key(self) -> str:
        """Stable hash of the config: results are stored under it."""
        doc = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.blake2b(doc.encode(), digest_size=8).hexdigest()

    def label(self) -> str:
        parts = [self.eviction, self.miss]
        if self.admit is not None:
            parts.append(f"admit {self.admit:g}")
        parts.append(f"{self.budget:g} budget" if self.budget is not None else f"{self.slots} slots")
        if self.allocation != "per-layer":
            parts.append(self.allocation)
        if self.batch > 1:
            parts.append(f"batch {self.batch}")
        if self.prefetch != "none":
            parts.append(self.prefetch_label())
        if self.overlap is not None:
            parts.append(f"overlap {self.overlap}")
        return " / ".join(parts)

    def prefetch_label(self) -> str:
        """'pf oracle' (prefetch oracle), 'pf next-layer:2' (depth 2), '' without prefetch: short, so that
        the sweep's policy column stays narrow."""
        if self.prefetch == "none":
            return ""
        return f"pf {self.prefetch}" + (f":{self.prefetch_depth}" if self.prefetch_depth != 1 else "")
