"""Replay results: counters per layer and per token, totals and rates."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from moesim.simulator.config import SimConfig
from moesim.simulator.counters import COUNTER_NAMES


@dataclass
class Decisions:
    """Every request's outcome in a replay recorded with ``simulate(..., record=True)``."""

    outcome: np.ndarray     # int8 [steps, L, k]: policies.miss.OUTCOME_* (hit, fetch, substitute, drop, cpu); -1 pad
    substitute: np.ndarray  # int16 [steps, L, k]: the expert run in place of a substituted request, else -1
    selected: np.ndarray | None = None  # int16 [steps, L, k]: the experts each position requested (rerouted or not)


class TimedSums:
    """What timing needs from the per-token series, summed over the counted decode steps and over all
    counted steps (timing falls back to those when the trace has no decode step): seconds, stall,
    tokens, steps and counters. A streamed replay adds chunk after chunk and keeps no series."""

    def __init__(self):
        self.sums = {phase: {"seconds": 0.0, "stall": 0.0, "tokens": 0, "steps": 0,
                             "counts": np.zeros(len(COUNTER_NAMES), np.int64)} for phase in ("decode", "all")}

    def add(self, counts, seconds, stall, members, decode, counted) -> None:
        """Add steps (``counted`` and ``decode`` are their masks)."""
        for phase, mask in (("decode", counted & decode), ("all", counted)):
            d = self.sums[phase]
            d["seconds"] += float(seconds[mask].sum())
            d["stall"] += float(stall[mask].sum())
            d["tokens"] += int(members[mask].sum())
            d["steps"] += int(mask.sum())
            d["counts"] += counts[mask].sum(axis=0)


PREFETCH_RATES = ("prefetch_precision", "prefetch_recall", "prefetch_timeliness")
_NAN = float("nan")  # one object, so that equal totals compare equal (dict equality tries identity first)


def prefetch_rates(c: dict) -> dict:
    """precision = used / issued; recall = prefetch-served requests / (those + misses), the share of the
    requests that found their expert absent from the cache that a prefetch served; timeliness = 1 - late /
    used. NaN where the denominator is 0 (no prefetch)."""
    used, issued, late = c["prefetch_used"], c["prefetches"], c["prefetch_late"]
    nan = _NAN
    return {"prefetch_precision": used / issued if issued else nan,
            "prefetch_recall": used / (used + c["misses"]) if issued and used + c["misses"] else nan,
            "prefetch_timeliness": 1.0 - late / used if used else nan}


def rates(c: dict, steps: int) -> dict:
    req = c["requests"]
    return {**_rates(c, req, steps), **prefetch_rates(c)}


def _rates(c: dict, req: int, steps: int) -> dict:
    return {
        "hit_rate": c["hits"] / req if req else float("nan"),
        "miss_rate": c["misses"] / req if req else float("nan"),
        "substitution_rate": c["substitutions"] / req if req else float("nan"),
        "drop_rate": c["drops"] / req if req else float("nan"),
        "mass_per_step": c["mass"] / steps if steps else float("nan"),
        "displaced_mass_per_step": c.get("displaced_mass", 0.0) / steps if steps else float("nan"),
    }


@dataclass
class SimResult:
    config: SimConfig
    layer_ids: tuple[int, ...]          # original layer indices
    counts: np.ndarray                  # [L, N_COUNTERS] int64, counted tokens only
    mass: np.ndarray                    # [L] float64
    token_counts: np.ndarray            # [T, N_COUNTERS] int64, every token (warm-up included)
    token_mass: np.ndarray              # [T] float64
    counted_tokens: int
    slots_per_layer: int
    n_experts: int
    trace_digest: str = ""
    synthetic: bool = False
    replay_seconds: float = 0.0
    token_seconds: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [steps] simulated seconds per step
    token_stall: np.ndarray = field(default_factory=lambda: np.zeros(0))    # [steps] seconds waiting for the link
    step_members: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [steps] tokens per step
    step_decode: np.ndarray = field(default_factory=lambda: np.zeros(0, np.bool_))   # [steps] a decode step
    warmup_steps: int = 0
    timing: dict | None = None
    decisions: Decisions | None = None
    extra: dict = field(default_factory=dict)
    sums: TimedSums | None = None  # a streamed replay's timing sums (its per-token series may be empty)
    displaced: np.ndarray | None = None        # [L] float64: the router's gate mass rerouted away (counted tokens)
    token_displaced: np.ndarray | None = None  # [steps] float64: ... per step

    def attach_timing(self, cost, ram_cap: int | None = None) -> None:
        """Seconds per token and bytes moved, from the kernel's clock and counters."""
        sums = self.sums
        if sums is None:
            sums = TimedSums()
            counted = np.arange(len(self.token_seconds)) >= self.warmup_steps
            sums.add(self.token_counts, self.token_seconds, self.token_stall, self.step_members, self.step_decode,
                     counted)
        phase = "decode"
        d = sums.sums["decode"]
        if d["steps"] == 0:
            phase, d = "all", sums.sums["all"]
        secs, toks, n_steps = d["seconds"], d["tokens"], d["steps"]
        c = {name: int(v) for name, v in zip(COUNTER_NAMES, d["counts"])}
        bpe = cost.bytes_per_expert
        low = self.config.low_quant
        bpe_low = float(cost.expert_bytes_by_quant[low]) if low and low in cost.expert_bytes_by_quant else 0.0
        per_tok = 1.0 / toks if toks else float("nan")
        self.timing = {
            "model": cost.model, "quant": cost.quant, "hw": cost.hw, "batch": self.config.batch,
            "timed_steps": phase,
            "s_per_token": secs / toks if toks else float("nan"),
            "tok_per_s": toks / secs if secs > 0 else float("inf"),
            "s_per_step": secs / n_steps if n_steps else float("nan"),
            "stall_per_token": d["stall"] * per_tok,
            "bytes_per_token": {
                "dense": cost.dense_bytes,
                "experts_vram": ((c["hits"] + c["substitutions"] + c["fetches"]) * bpe
                                 + c["lowbit"] * bpe_low) * per_tok,
                # low-bit copies fetched on a miss (the low-bit tier's runs move nothing)
                "link_sync": (c["fetches"] * bpe + (c["lowbit"] - c["lowbit_tier"]) * bpe_low) * per_tok,
                "link_background": c["copies"] * bpe * per_tok,
                "link_prefetch": c["prefetches"] * bpe * per_tok,
                "nvme": (c["fetches_nvme"] + c["cpu_nvme"] + c["copies_nvme"] + c["prefetches_nvme"]) * bpe * per_tok,
                "cpu": c["cpu"] * bpe * per_tok,
            },
            "vram_bytes_for_cache": self.slots_per_layer * len(self.layer_ids) * bpe,
            "vram_bytes_free_for_experts": cost.vram_expert_slots * bpe,
            "fits_in_vram": self.slots_per_layer * len(self.layer_ids) <= cost.vram_expert_slots,
            "host_ram_tier_experts": ram_cap,  # None: every expert fits in host RAM
            "bytes_per_expert": bpe,
            "overlap": self.config.overlap or getattr(cost, "overlap", "none"),
        }

    def totals(self) -> dict:
        c: dict[str, float] = {name: int(v) for name, v in zip(COUNTER_NAMES, self.counts.sum(axis=0))}
        c["mass"] = float(self.mass.sum())
        c["displaced_mass"] = float(self.displaced.sum()) if self.displaced is not None else 0.0
        steps = self.counted_tokens * len(self.layer_ids)
        return {**c, **rates(c, steps)}

    def layer_rows(self) -> list[dict]:
        rows = []
        for i, layer in enumerate(self.layer_ids):
            c: dict[str, float] = {name: int(v) for name, v in zip(COUNTER_NAMES, self.counts[i])}
            c["mass"] = float(self.mass[i])
            c["displaced_mass"] = float(self.displaced[i]) if self.displaced is not None else 0.0
            rows.append({"layer": int(layer), **c, **rates(c, self.counted_tokens)})
        return rows

    def to_dict(self) -> dict:
        timing = {}
        if self.timing is not None:
            timing = {k: self.timing[k] for k in ("s_per_token", "tok_per_s")}
            timing["timing"] = self.timing
        totals = self.totals()
        if self.timing is not None:  # bytes need a model's bytes per expert
            totals["prefetch_bytes"] = totals["prefetches"] * self.timing["bytes_per_expert"]
        return {
            "config": {**self.config.to_dict(), "key": self.config.key(), "label": self.config.label()},
            "trace": {"digest": self.trace_digest, "synthetic": self.synthetic},
            "slots_per_layer": self.slots_per_layer,
            "counted_tokens": self.counted_tokens,
            "totals": totals,
            "layers": self.layer_rows(),
            "replay_seconds": self.replay_seconds,
            **timing,
            **self.extra,
        }

    def tokens_frame(self):
        """Per-token series (every replayed token, warm-up included)."""
        import polars as pl

        cols = {name: self.token_counts[:, i] for i, name in enumerate(COUNTER_NAMES)}
        extra = {}
        if self.timing is not None:
            extra = {"seconds": self.token_seconds, "stall_seconds": self.token_stall}
        return pl.DataFrame({"step": np.arange(len(self.token_mass)), "tokens": self.step_members, **cols,
                             "mass": self.token_mass, **extra})
