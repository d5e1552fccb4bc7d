"""Quality results: one row per (emulation setup, policy config), keyed to join sweep rows.

A row's ``config_key`` is ``SimConfig.key()``, the key of the sweep's row for the same policy and
cache size: a sweep of a trace of the same model joins its rows on (``model_id``, ``config_key``).
``setup_key`` names what else the perplexity depends on (text tokens, dtype, window, candidates,
drop mode); ``row_key`` = ``setup_key:config_key``. Besides perplexity a row holds ``kl`` (mean KL
divergence of the next-token distribution from the unmodified model's, nats) and ``top1_agreement``
(share of scored positions whose most likely next token is the unmodified model's); files written
before those existed read with them null.

The mass fit: among policies that always run the router's first choice (fetch-all, threshold,
first-choice, cpu), the perplexity increase is fitted as dppl% = b x mass per step through the
origin (zero substituted mass changes no output), over the emulated configs with nonzero mass at
the same cache size (all of the model's sizes when that one has fewer than 3);
Pearson r and n are reported with it (sweeps/quality.py gives sweep rows of that class without a
measurement the fit's value, labelled an estimate; policies that may substitute the first choice get none).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moesim.errors import MoesimError
from moesim.simulator import SimConfig

QUALITY_COLUMNS = ("row_key", "setup_key", "config_key", "ppl", "ppl_baseline", "dppl_pct", "fetches_first")
MIN_FIT = 3  # fewest nonzero-mass measurements a fit is made from


def policy_label(config: SimConfig) -> str:
    """eviction / miss [/ admit β] [/ reroute ...]: the sweep's policy column."""
    parts = [config.eviction, config.miss] + ([f"admit {config.admit:g}"] if config.admit is not None else [])
    if config.reroute is not None:
        parts.append(config.reroute_label())
    return " / ".join(parts)


def quality_rows(setup, runs) -> list[dict]:
    from moesim.emulator.run import always_fetches_first

    rows = []
    for run in runs:
        c = run.config
        t, o = run.result.totals(), run.open_loop.totals()
        steps = run.result.counted_tokens * len(run.result.layer_ids)
        rows.append({
            "row_key": f"{setup.key}:{c.key()}", "setup_key": setup.key, "config_key": c.key(),
            "model_id": setup.model_id, "family": setup.family, "text_digest": setup.text_digest,
            "dtype": setup.dtype, "device": setup.device, "window": setup.window, "layout": setup.layout,
            "candidates": setup.candidates, "drop": setup.drop, "tokens": len(run.nll),
            "label": c.label(), "policy": policy_label(c), "eviction": c.eviction, "miss": c.miss,
            "admit": c.admit, "budget": c.budget, "slots": c.slots, "slots_per_layer": run.result.slots_per_layer,
            "allocation": c.allocation, "warm": c.warm, "warmup_tokens": c.warmup_tokens,
            "reset_per_sequence": c.reset_per_sequence, "batch": c.batch,
            "ppl": run.ppl, "ppl_baseline": run.ppl_baseline, "dppl_pct": run.dppl_pct,
            "kl": run.kl, "top1_agreement": run.top1_agreement,
            "fetches_first": always_fetches_first(c), "emulated": run.emulated, "seconds": run.seconds,
            "reroute": c.reroute, "reroute_pool": c.reroute_pool, "reroute_resident": c.reroute_resident,
            "reroute_weights": c.reroute_weights,
            **{k: v for k, v in t.items()}, "steps": steps,
            "open_mass_per_step": o["mass_per_step"], "open_hit_rate": o["hit_rate"],
            "open_substitution_rate": o["substitution_rate"], "open_substitutions": o["substitutions"],
            "open_drops": o["drops"], "routing_drift": run.drift,
        })
    return rows


def quality_frame(setup, runs):
    import polars as pl

    text = {c: pl.Utf8 for c in ("reroute", "reroute_resident", "reroute_weights")}
    return pl.DataFrame(quality_rows(setup, runs), infer_schema_length=None,
                        schema_overrides={**text, "reroute_pool": pl.Int64})


# columns the readers use besides the key ones (the mass fit, the sweep's join, the report's chart)
_READ_COLUMNS = ("model_id", "policy", "budget", "slots", "mass_per_step", "hit_rate")
# columns a quality file's rows are checked for (types; then values, see read_quality)
_TYPES = {"row_key": "String", "setup_key": "String", "config_key": "String", "model_id": "String", "ppl": "Float64",
          "ppl_baseline": "Float64", "dppl_pct": "Float64", "fetches_first": "Boolean", "mass_per_step": "Float64",
          "budget": "Float64", "slots": "Int64", "hit_rate": "Float64", "open_mass_per_step": "Float64",
          "kl": "Float64", "top1_agreement": "Float64", "displaced_mass_per_step": "Float64"}
# columns later versions added: a file written before them reads with them null (not measured then)
_ADDED = ("kl", "top1_agreement", "displaced_mass_per_step")


def read_quality(path: str | os.PathLike, *, note: bool = True):
    """Quality results, checked: the columns moesim writes with their types, perplexities finite and >= 1,
    dppl % finite and equal to them, masses and rates in range. ``note``: an input of the command (no
    output may replace it); not for the file ``emulate --grid -o`` extends."""
    import polars as pl

    from moesim.table_checks import check_equal, check_values, read_parquet, typed

    p = Path(path)
    if not p.exists():
        raise MoesimError(f"{path}: no such quality results file (write one with moesim emulate MODEL --grid ... "
                          f"-o {p.name})")
    df = read_parquet(p, "quality results file", note=note)
    missing = [c for c in (*QUALITY_COLUMNS, *_READ_COLUMNS) if c not in df.columns]
    if missing:
        raise MoesimError(f"{path}: not moesim quality results (missing columns: {', '.join(missing)})")
    if df.height == 0:
        raise MoesimError(f"{path}: holds no quality results")
    df = df.with_columns([pl.lit(None, dtype=pl.Float64).alias(c) for c in _ADDED if c not in df.columns])
    df = typed(df, path, {name: getattr(pl, t) for name, t in _TYPES.items()})
    for name in ("row_key", "config_key", "model_id", "fetches_first"):
        if df[name].null_count():
            raise MoesimError(f"{path}: row {df[name].is_null().arg_true()[0]} has no {name}: not a file moesim "
                              "wrote, or damaged")
    check_values(df, path, ("ppl", "ppl_baseline"), lo=1, nulls=False)
    check_values(df, path, ("dppl_pct",), lo=-100, nulls=False)
    check_values(df, path, ("mass_per_step", "open_mass_per_step"), lo=0, nulls=False)
    check_values(df, path, ("hit_rate", "top1_agreement"), lo=0, hi=1)
    check_values(df, path, ("kl", "displaced_mass_per_step"), lo=0)
    check_equal(df, path, "dppl_pct", 100 * (pl.col("ppl") / pl.col("ppl_baseline") - 1), "its ppl and ppl_baseline")
    return df


def existing_keys(path) -> set[str] | None:
    if path is None or not Path(path).exists():
        return None
    return set(read_quality(path, note=False)["row_key"].to_list())


def write_quality(df, path) -> int:
    """Add rows to a quality results file (atomically; rows already there are kept). Returns the row count."""
    import polars as pl

    from moesim.files import write_table

    if Path(path).suffix != ".parquet":
        raise MoesimError(f"{path}: quality results are written as .parquet")
    if Path(path).exists():
        old = read_quality(path, note=False)
        df = pl.concat([old.filter(~pl.col("row_key").is_in(df["row_key"].to_list())), df], how="diagonal_relaxed")
    write_table(df, path)
    return df.height


# ---------------------------------------------------------------------------------------------- the mass fit


@dataclass
class MassFit:
    model_id: str
    slope: float        # dppl % per unit of mass per step
    r: float            # Pearson r of (mass per step, dppl %) over the points
    n: int
    size: str = "all cache sizes"   # the cache size the points share, or all of the model's

    def estimate(self, mass_per_step: float) -> float:
        return self.slope * mass_per_step

    def label(self) -> str:
        return (f"estimate: {self.slope:.3g} x mass/step, fit on n={self.n} measured configs at {self.size} "
                f"(r={self.r:.2f})")


def pearson(x, y) -> float:
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 2 or x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def class_stats(df, x: str = "mass_per_step", y: str = "dppl_pct") -> dict[bool, dict]:
    """Pearson r and n of (``x``, ``y``) per class (fetches first: True / False), over the configs with
    nonzero ``x`` (substituted mass by default) and a measured ``y``."""
    import polars as pl

    out = {}
    for cls in (True, False):
        part = df.filter((pl.col("fetches_first") == cls) & (pl.col(x) > 0) & pl.col(y).is_not_null())
        out[cls] = {"n": part.height, "r": pearson(part[x], part[y])}
    return out


def moved_mass(df):
    """``df`` + ``moved_per_step``: the gate mass per step a policy moved off the router's choice, i.e. its
    mass per step (substituted and dropped, plus what rerouting displaced: the replay counts both in
    ``mass``), and the name of what it sums: "substituted" when no row displaced any (no config reroutes,
    or the results were written before rerouting existed), else "displaced + substituted"."""
    import polars as pl

    col = "displaced_mass_per_step"
    rerouted = col in df.columns and bool((df[col].fill_null(0.0) > 0).any())
    return (df.with_columns(pl.col("mass_per_step").alias("moved_per_step")),
            "displaced + substituted" if rerouted else "substituted")


def size_label(budget, slots) -> str:
    return f"budget {budget:g}" if budget is not None else f"{slots} slots per layer"


def mass_fit(df, model_id: str, budget: float | None = None, slots: int | None = None) -> MassFit | None:
    """The fit for a model at one cache size (the slope depends on it: a smaller cache substitutes
    more often in the same layers); from all the model's sizes when that size has too few points."""
    import polars as pl

    part = df.filter((pl.col("model_id") == model_id) & pl.col("fetches_first") & (pl.col("mass_per_step") > 0))
    size = "all cache sizes"
    if budget is not None or slots is not None:
        same = part.filter(pl.col("budget") == budget) if budget is not None else \
            part.filter(pl.col("budget").is_null() & (pl.col("slots") == slots))
        if same.height >= MIN_FIT:
            part, size = same, size_label(budget, slots)
    if part.height < MIN_FIT:
        return None
    x, y = part["mass_per_step"].to_numpy(), part["dppl_pct"].to_numpy()
    slope = float((x * y).sum() / (x * x).sum())
    return MassFit(model_id, slope, pearson(x, y), part.height, size)
