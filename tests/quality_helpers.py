"""Quality results made by hand (the columns moesim emulate --grid writes that the readers use), for the
tests that need a quality file without torch."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from moesim.simulator import SimConfig

MODEL = "Qwen/Qwen3-30B-A3B"  # the model id of sweep_helpers.small_trace


def quality_frame(model_id: str = MODEL, budget: float = 0.25) -> pl.DataFrame:
    rows = []
    for i, miss in enumerate(["fetch-all", "threshold:0.15", "first-choice", "threshold:0.3", "substitute"]):
        c = SimConfig(eviction="lru", miss=miss, budget=budget)
        ppl = 10.0 * (1 + 0.01 * i)
        rows.append({"row_key": f"s:{c.key()}", "setup_key": "s", "config_key": c.key(), "model_id": model_id,
                     "policy": f"lru / {miss}", "miss": miss, "budget": budget, "slots": None, "ppl": ppl,
                     "ppl_baseline": 10.0, "dppl_pct": 100 * (ppl / 10.0 - 1), "fetches_first": miss != "substitute",
                     "mass_per_step": 0.02 * i, "open_mass_per_step": 0.02 * i, "hit_rate": 0.5})
    return pl.DataFrame(rows, schema_overrides={"slots": pl.Int64})


def write_quality(path: Path, frame: pl.DataFrame | None = None) -> Path:
    (quality_frame() if frame is None else frame).write_parquet(path)
    return path
