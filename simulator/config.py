"""Policy configurations: frozen, validated, hashable, keyed by a stable hash."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass

from moesim.costmodel.models import QUANT_SCHEMES
from moesim.errors import MoesimError
from moesim.policies import miss as miss_mod
from moesim.policies import prefetch as prefetch_mod
from moesim.policies import registry
from moesim.policies import reroute as reroute_mod
from moesim.policies.admission import UNBOUNDED_WINDOW, parse_admission
from moesim.policies.miss import parse_miss
from moesim.policies.registry import parse_eviction

ALLOCATIONS = ("per-layer", "global")
# evictions that are neither list nor heap policies (ARC, S3-FIFO, SIEVE, CLOCK: their victim search moves experts
# between lists or clears bits on the way): --step-pin is refused for them (docs/replay-semantics.md)
STEP_PIN_REFUSED = tuple(e.name for e in registry.EVICTIONS if e.pin_mode == registry.PIN_NONE)
# fields added after results were first keyed, and their defaults (left out of to_dict at the default, so earlier
# configs keep their keys)
_LATER_DEFAULTS = {"prefetch": "none", "prefetch_depth": 1, "prefetch_train": None, "overlap": None,
                   "step_pin": False, "max_uploads": None, "lowbit_share": None, "lowbit_quant": None,
                   "speculative": 0, "accept": None, "reroute": None, "reroute_pool": None,
                   "reroute_resident": "cache", "reroute_weights": "original", "admission": "always"}
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
    step_pin: bool = False  # engine step semantics: a step's experts are pinned for it, its misses fetched together
    max_uploads: int | None = None  # at most this many fetched experts admitted per layer per step
    lowbit_share: float | None = None  # share of the slots holding low-bit copies of the most requested experts
    lowbit_quant: str | None = None  # the quantization of those copies (default: lowbit:Q's)
    speculative: int = 0  # drafted tokens a step verifies per sequence, besides one (simulator/speculative.py)
    accept: float | None = None  # the fraction of them accepted (with speculative > 0)
    reroute: str | None = None  # a step policy: bias:λ | keep:J (policies/reroute.py, docs/replay-semantics.md)
    reroute_pool: int | None = None  # candidates it considers (None: every candidate the trace stores)
    reroute_resident: str = "cache"  # what counts as resident: cache | recent:W
    reroute_weights: str = "original"  # the rerouted set's gate weights: original (unbiased) | biased
    admission: str = "always"  # always | second-touch[:W]: which fetched experts are admitted (parse_admission)

    def __post_init__(self):
        ev, ev_arg = parse_eviction(self.eviction)
        ms, theta = parse_miss(self.miss)
        quant = miss_mod.miss_quant(self.miss)
        if quant is not None and quant not in QUANT_SCHEMES:
            raise MoesimError(f"unknown quantization {quant!r} in {self.miss!r} (known: {', '.join(QUANT_SCHEMES)})")
        # canonical spellings so equal configs hash equally
        object.__setattr__(self, "eviction", registry.canonical_eviction(self.eviction))
        evp = registry.get(ev)
        if evp.param_required and ev_arg is None:
            raise MoesimError(f"eviction {ev} needs its parameter: {evp.spec}")
        if evp.schedules and (self.reset_per_sequence or self.batch > 1 or self.speculative):
            raise MoesimError(f"{ev} re-pins along the trace's tokens: --reset-per-sequence, --batch > 1 and "
                              "--speculative are not modelled with it")
        object.__setattr__(self, "miss", f"{ms}:{quant}" if quant else (
            ms if ms != "threshold" else f"threshold:{theta:g}"))
        if not isinstance(self.step_pin, (bool, int)) or self.step_pin not in (0, 1):
            raise MoesimError(f"step_pin must be true or false, got {self.step_pin!r}")
        object.__setattr__(self, "step_pin", bool(self.step_pin))
        if self.step_pin and self.prefetch != "none":
            raise MoesimError("--step-pin with --prefetch is not modelled: a prefetch admits experts outside the "
                              "step's order, past its pins (use one or the other)")
        if self.step_pin and registry.get(ev).name in STEP_PIN_REFUSED:
            raise MoesimError(f"--step-pin is not defined for the {ev} eviction: its victim search moves experts "
                              "between its lists, so skipping the step's pinned experts has no exact meaning "
                              "(use lru, fifo, lfu, freq, belady, static or static-layers)")
        if self.max_uploads is not None:
            if isinstance(self.max_uploads, bool) or int(self.max_uploads) != self.max_uploads \
                    or self.max_uploads < 1:
                raise MoesimError(f"max_uploads must be a positive whole number, got {self.max_uploads!r}")
            object.__setattr__(self, "max_uploads", int(self.max_uploads))
        if self.lowbit_quant is not None:
            lq = str(self.lowbit_quant).strip().lower()
            if lq not in QUANT_SCHEMES:
                raise MoesimError(f"unknown quantization {self.lowbit_quant!r} for --lowbit-quant "
                                  f"(known: {', '.join(QUANT_SCHEMES)})")
            if quant is not None and lq != quant:
                raise MoesimError(f"--lowbit-quant {lq} differs from the miss policy's {self.miss}: low-bit runs "
                                  "use one quantization")
            object.__setattr__(self, "lowbit_quant", lq)
        if self.lowbit_share is not None:
            f = float(self.lowbit_share)
            if not (math.isfinite(f) and 0.0 < f < 1.0):
                raise MoesimError(f"lowbit_share must be a fraction in (0, 1), got {self.lowbit_share!r}")
            if self.low_quant is None:
                raise MoesimError("--lowbit-share needs the copies' quantization: --lowbit-quant Q (or -m lowbit:Q)")
            object.__setattr__(self, "lowbit_share", f)
        elif self.lowbit_quant is not None and quant is None:
            raise MoesimError("--lowbit-quant sets the low-bit tier's quantization: give --lowbit-share F too")
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
        w = parse_admission(self.admission)
        # canonical: a pinned placement admits nothing whatever the rule, so it replays as "always"
        object.__setattr__(self, "admission", "always" if w == 0 or registry.get(ev).pinned else (
            "second-touch" if w == UNBOUNDED_WINDOW else f"second-touch:{w}"))
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
        if isinstance(self.speculative, bool) or int(self.speculative) != self.speculative or self.speculative < 0:
            raise MoesimError(f"--speculative must be a whole number of drafted tokens >= 0, got {self.speculative!r}")
        object.__setattr__(self, "speculative", int(self.speculative))
        if self.speculative:
            if self.accept is None:
                raise MoesimError("--speculative G needs --accept A, the fraction of drafted tokens accepted")
            a = float(self.accept)
            if not (math.isfinite(a) and 0.0 <= a <= 1.0):
                raise MoesimError(f"--accept must be a fraction in [0, 1], got {self.accept!r}")
            if self.prefetch != "none":
                raise MoesimError("--speculative with --prefetch is not modelled (a prefetch predicts one token's "
                                  "layer, a speculative step verifies several)")
            object.__setattr__(self, "accept", a)
        elif self.accept is not None:
            raise MoesimError("--accept is the acceptance of --speculative G drafts: give --speculative too")
        self._check_reroute()

    def _check_reroute(self) -> None:
        if self.reroute is None:
            if self.reroute_pool is not None or self.reroute_resident != "cache" or self.reroute_weights != "original":
                raise MoesimError("--reroute-pool, --reroute-resident and --reroute-weights qualify --reroute: give "
                                  "--reroute bias:λ or keep:J too")
            return
        name, value = reroute_mod.parse_reroute(self.reroute)
        object.__setattr__(self, "reroute", f"{name}:{value:g}")
        mode, window = reroute_mod.parse_resident(self.reroute_resident)
        resident = "cache" if mode == reroute_mod.RESIDENT_CACHE else f"recent:{window}"
        object.__setattr__(self, "reroute_resident", resident)
        if self.reroute_weights not in reroute_mod.WEIGHTS:
            raise MoesimError(f"--reroute-weights must be one of {', '.join(reroute_mod.WEIGHTS)}, got "
                              f"{self.reroute_weights!r}")
        if self.reroute_pool is not None:
            if isinstance(self.reroute_pool, bool) or int(self.reroute_pool) != self.reroute_pool \
                    or self.reroute_pool < 1:
                raise MoesimError(f"--reroute-pool must be a whole number of candidates >= k, got "
                                  f"{self.reroute_pool!r}")
            object.__setattr__(self, "reroute_pool", int(self.reroute_pool))
        if self.speculative:
            raise MoesimError("--reroute with --speculative is not modelled (a speculative step is the union of "
                              "several tokens' selections)")

    @property
    def eviction_name(self) -> str:
        return parse_eviction(self.eviction)[0]

    @property
    def eviction_param(self) -> float | None:
        return parse_eviction(self.eviction)[1]

    @property
    def eviction_values(self) -> tuple[float, ...] | None:
        """All of the eviction's values (repin:N,G -> (N, G)); None without a parameter."""
        return registry.eviction_values(self.eviction)

    @property
    def admit_window(self) -> int:
        """The kernels' second-touch window in requests of the pool (0: every fetched expert is admitted)."""
        return parse_admission(self.admission)

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

    @property
    def low_quant(self) -> str | None:
        """The quantization every low-bit run uses: lowbit:Q's, or the low-bit tier's (None: neither)."""
        return miss_mod.miss_quant(self.miss) or self.lowbit_quant

    def lowbit_tier(self, slots: int, n_experts: int, bytes_full: float | None, bytes_low: float | None
                    ) -> tuple[int, int]:
        """(full-expert slots per layer, low-bit copies per layer) of a budget of ``slots`` per layer: the share
        ``lowbit_share`` of the slots, floor(F·slots), holds low-bit copies instead, as many as its bytes take
        (floor(reserved · bytes_full / bytes_low), at most E). (slots, 0) without a tier."""
        if self.lowbit_share is None:
            return slots, 0
        if bytes_full is None or bytes_low is None:
            raise MoesimError("--lowbit-share sizes the low-bit tier by bytes per expert: it needs a priced replay "
                              "(a model preset: --model, or the trace's)")
        reserved = math.floor(self.lowbit_share * slots + 1e-9)  # < slots, as the share is below 1
        return slots - reserved, min(n_experts, math.floor(reserved * bytes_full / bytes_low + 1e-9))

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
        if self.admission != "always":
            parts.append(self.admission)
        parts.append(f"{self.budget:g} budget" if self.budget is not None else f"{self.slots} slots")
        if self.allocation != "per-layer":
            parts.append(self.allocation)
        if self.batch > 1:
            parts.append(f"batch {self.batch}")
        if self.prefetch != "none":
            parts.append(self.prefetch_label())
        if self.overlap is not None:
            parts.append(f"overlap {self.overlap}")
        if self.step_pin:
            parts.append("step-pin")
        if self.max_uploads is not None:
            parts.append(f"max-uploads {self.max_uploads}")
        if self.lowbit_share is not None:
            parts.append(f"lowbit {self.lowbit_share:g} {self.low_quant}")
        if self.speculative:
            parts.append(f"spec {self.speculative} accept {self.accept:g}")
        if self.reroute is not None:
            parts.append(self.reroute_label())
        return " / ".join(parts)

    def reroute_label(self) -> str:
        """'reroute bias:0.25' (with its pool, residency and weights when not the defaults); '' without one."""
        if self.reroute is None:
            return ""
        extra = [f"pool {self.reroute_pool}"] * (self.reroute_pool is not None) \
            + [self.reroute_resident] * (self.reroute_resident != "cache") \
            + ["biased weights"] * (self.reroute_weights != "original")
        return f"reroute {self.reroute}" + (f" ({', '.join(extra)})" if extra else "")

    def prefetch_label(self) -> str:
        """'pf oracle' (prefetch oracle), 'pf next-layer:2' (depth 2), '' without prefetch: short, so that
        the sweep's policy column stays narrow."""
        if self.prefetch == "none":
            return ""
        return f"pf {self.prefetch}" + (f":{self.prefetch_depth}" if self.prefetch_depth != 1 else "")
