"""Replay results: counters per layer and per token, totals and rates."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from moesim.simulator.config import SimConfig
from moesim.simulator.kernel import COUNTER_NAMES

COUNTERS = COUNTER_NAMES + ("mass",)


def rates(c: dict, steps: int) -> dict:
    req = c["requests"]
    return {
        "hit_rate": c["hits"] / req if req else float("nan"),
        "miss_rate": c["misses"] / req if req else float("nan"),
        "substitution_rate": c["substitutions"] / req if req else float("nan"),
        "drop_rate": c["drops"] / req if req else float("nan"),
        "mass_per_step": c["mass"] / steps if steps else float("nan"),
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
    extra: dict = field(default_factory=dict)

    def totals(self) -> dict:
        c = {name: int(v) for name, v in zip(COUNTER_NAMES, self.counts.sum(axis=0))}
        c["mass"] = float(self.mass.sum())
        steps = self.counted_tokens * len(self.layer_ids)
        return {**c, **rates(c, steps)}

    def layer_rows(self) -> list[dict]:
        rows = []
        for i, layer in enumerate(self.layer_ids):
            c = {name: int(v) for name, v in zip(COUNTER_NAMES, self.counts[i])}
            c["mass"] = float(self.mass[i])
            rows.append({"layer": int(layer), **c, **rates(c, self.counted_tokens)})
        return rows

    def to_dict(self) -> dict:
        return {
            "config": {**self.config.to_dict(), "key": self.config.key(), "label": self.config.label()},
            "trace": {"digest": self.trace_digest, "synthetic": self.synthetic},
            "slots_per_layer": self.slots_per_layer,
            "counted_tokens": self.counted_tokens,
            "totals": self.totals(),
            "layers": self.layer_rows(),
            "replay_seconds": self.replay_seconds,
            **self.extra,
        }

    def layers_frame(self):
        import polars as pl

        return pl.DataFrame(self.layer_rows())

    def tokens_frame(self):
        """Per-token series (every replayed token, warm-up included)."""
        import polars as pl

        cols = {name: self.token_counts[:, i] for i, name in enumerate(COUNTER_NAMES)}
        return pl.DataFrame({"token_index": np.arange(len(self.token_mass)), **cols, "mass": self.token_mass})
