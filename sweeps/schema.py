"""The columns of a sweep's results: one row per (trace, config, cost) and one per config x MoE layer."""

from __future__ import annotations

from moesim.simulator.counters import COUNTER_NAMES
from moesim.simulator.result import PREFETCH_RATES
from moesim.simulator.units import STATISTICS

# Statistics with a confidence interval in a row (sweeps/intervals.py): <name>_low and <name>_high.
INTERVAL_STATISTICS = STATISTICS + ("speedup",)

# One row per (trace, config, cost). Column order is the file's column order.
ROW_SCHEMA: dict[str, str] = {
    "row_key": "str", "trace_digest": "str", "config_key": "str", "grid_key": "str", "cost_key": "str",
    "group_key": "str",
    "trace": "str", "model_id": "str", "synthetic": "bool",
    "label": "str", "policy": "str", "preset": "str",
    "eviction": "str", "miss": "str", "admit": "f64", "admission": "str", "budget": "f64", "slots": "i64",
    "slots_per_layer": "i64",
    "allocation": "str", "warm": "bool", "warmup_tokens": "i64", "holdout_tokens": "i64",
    "reset_per_sequence": "bool", "batch": "i64",
    "prefetch": "str", "prefetch_depth": "i64", "overlap": "str",
    "step_pin": "bool", "max_uploads": "i64", "lowbit_share": "f64", "lowbit_quant": "str",
    "reroute": "str", "reroute_pool": "i64", "reroute_resident": "str", "reroute_weights": "str",
    "priced": "bool", "priced_as": "str", "hw": "str", "model": "str", "quant": "str", "engine": "str",
    "quant_choice": "str",
    "counted_tokens": "i64",
    **{name: "i64" for name in COUNTER_NAMES},
    "mass": "f64", "hit_rate": "f64", "miss_rate": "f64", "substitution_rate": "f64", "drop_rate": "f64",
    "mass_per_step": "f64", "displaced_mass": "f64", "displaced_mass_per_step": "f64",
    **{name: "f64" for name in PREFETCH_RATES},
    "s_per_token": "f64", "ms_per_token": "f64", "tok_per_s": "f64", "stall_per_token": "f64",
    "gb_per_token_sync": "f64", "gb_per_token_background": "f64", "gb_per_token_nvme": "f64",
    "gb_per_token_cpu": "f64", "gb_per_token_vram_experts": "f64", "gb_per_token_prefetch": "f64",
    "vram_gib_for_cache": "f64",
    "vram_gib_free": "f64", "fits_in_vram": "bool", "timed_steps": "str",
    # derived over the rows of the same table (sweeps/ranking.py)
    "keeps_first_choice": "bool", "speedup": "f64", "baseline": "str", "rank": "i64", "pareto": "bool",
    "ranked_by": "str",
    # --ci (docs/uncertainty.md): how the intervals were taken, the replay's sums per resampling unit
    # (units x simulator/units.py SUM_NAMES, row-major) and the cold-start offset added to every
    # resample (SUM_NAMES; simulator/rotation.py); null for rows replayed without --ci
    "ci_level": "f64", "ci_resamples": "i64", "ci_rule": "str", "ci_method": "str", "ci_unit": "str",
    "ci_units": "i64", "ci_block_steps": "i64", "ci_unit_sums": "list_f64", "ci_offset_sums": "list_f64",
    # derived from the unit sums over the rows of the same table (sweeps/intervals.py)
    **{f"{name}_{side}": "f64" for name in INTERVAL_STATISTICS for side in ("low", "high")},
    "overlaps_best": "bool",
}
LAYER_SCHEMA: dict[str, str] = {
    "row_key": "str", "trace_digest": "str", "config_key": "str", "cost_key": "str", "label": "str",
    "layer": "i64", **{name: "i64" for name in COUNTER_NAMES}, "mass": "f64", "displaced_mass": "f64",
    "hit_rate": "f64", "miss_rate": "f64", "substitution_rate": "f64", "drop_rate": "f64", "mass_per_step": "f64",
    "displaced_mass_per_step": "f64",
    **{name: "f64" for name in PREFETCH_RATES},
}


def polars_schema(schema: dict[str, str]) -> dict:
    import polars as pl

    types = {"str": pl.String, "bool": pl.Boolean, "f64": pl.Float64, "i64": pl.Int64, "list_f64": pl.List(pl.Float64)}
    return {name: types[t] for name, t in schema.items()}


def frame(rows: list[dict], schema: dict[str, str]):
    """A polars frame with the store's column types (missing keys are null)."""
    import polars as pl

    return pl.DataFrame([{k: r.get(k) for k in schema} for r in rows], schema=polars_schema(schema), orient="row") \
        if rows else pl.DataFrame(schema=polars_schema(schema))
