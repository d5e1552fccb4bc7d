"""Quality results: one row per (emulation setup, policy config), keyed to join sweep rows.

A row's ``config_key`` is ``SimConfig.key()``, the key of the sweep's row for the same policy and
cache size: a sweep of a trace of the same model joins its rows on (``model_id``, ``config_key``).
``setup_key`` names what else the perplexity depends on (text tokens, dtype, window, candidates,
drop mode); ``row_key`` = ``setup_key:config_key``.

The mass fit: among policies that always run the router's first choice (fetch-all, threshold,
first-choice, cpu), the perplexity increase is fitted as dppl% = b x mass per step through the
origin (zero substituted mass changes no output), over the emulated configs with nonzero mass;
Pearson r and n are reported with it. Sweep rows of that class without a measurement get the fit's
value, labelled an estimate; policies that may substitute the first choice get none.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moesim.errors import MoesimError
from moesim.simulator import SimConfig

QUALITY_COLUMNS = ("row_key", "setup_key", "config_key", "ppl", "ppl_baseline", "dppl_pct", "fetches_first")
MIN_FIT = 3  # fewest nonzero-mass measurements a fit is made from


def configs_from_grid(spec: str, budgets: list[float], slots: list[int], **scalars) -> list[SimConfig]:
    """The sweep's grid as configs: ``default`` (every eviction x miss x admission and the presets),
    ``presets`` (the named presets only) or a sweep TOML file; --budget/--slots replace its sizes."""
    import dataclasses

    from moesim.sweeps.grid import Grid, expand, load_toml

    if spec == "default":
        grid = Grid()
    elif spec == "presets":
        grid = Grid(evictions=[], misses=[], admits=[None])
    elif spec.endswith(".toml") or os.path.exists(spec):
        grid = load_toml(spec)
    else:
        raise MoesimError(f"--grid takes default, presets or a sweep TOML file, got {spec!r}")
    grid = grid.override(budgets=budgets or None, slots=slots or None)
    grid = dataclasses.replace(grid, hws=[None], quants=[None], warm=scalars.get("warm") or grid.warm,
                               warmup_tokens=scalars.get("warmup_tokens") or grid.warmup_tokens,
                               reset_per_sequence=scalars.get("reset_per_sequence") or grid.reset_per_sequence)
    out: dict[str, SimConfig] = {}
    for p in expand(grid):
        out.setdefault(p.config.key(), p.config)
    bad = [c for c in out.values() if c.allocation != "per-layer" or c.batch != 1]
    if bad:
        from moesim.emulator.policy import check_config

        check_config(bad[0])
    return list(out.values())


def _policy_names(config: SimConfig) -> tuple[str, str]:
    from moesim.sweeps.run import policy_label, preset_names

    return policy_label(config), preset_names(config)


def quality_rows(setup, runs) -> list[dict]:
    from moesim.emulator.run import always_fetches_first

    rows = []
    for run in runs:
        c = run.config
        t, o = run.result.totals(), run.open_loop.totals()
        policy, preset = _policy_names(c)
        rows.append({
            "row_key": f"{setup.key}:{c.key()}", "setup_key": setup.key, "config_key": c.key(),
            "model_id": setup.model_id, "family": setup.family, "text_digest": setup.text_digest,
            "dtype": setup.dtype, "device": setup.device, "window": setup.window, "layout": setup.layout,
            "candidates": setup.candidates, "drop": setup.drop, "tokens": len(run.nll),
            "label": c.label(), "policy": policy, "preset": preset, "eviction": c.eviction, "miss": c.miss,
            "admit": c.admit, "budget": c.budget, "slots": c.slots, "slots_per_layer": run.result.slots_per_layer,
            "allocation": c.allocation, "warm": c.warm, "warmup_tokens": c.warmup_tokens,
            "reset_per_sequence": c.reset_per_sequence, "batch": c.batch,
            "ppl": run.ppl, "ppl_baseline": run.ppl_baseline, "dppl_pct": run.dppl_pct,
            "fetches_first": always_fetches_first(c), "emulated": run.emulated, "seconds": run.seconds,
            **{k: v for k, v in t.items()},
            "open_mass_per_step": o["mass_per_step"], "open_hit_rate": o["hit_rate"],
            "open_substitution_rate": o["substitution_rate"], "open_substitutions": o["substitutions"],
            "open_drops": o["drops"], "routing_drift": run.drift,
        })
    return rows


def quality_frame(setup, runs):
    import polars as pl

    return pl.DataFrame(quality_rows(setup, runs), infer_schema_length=None)


def read_quality(path: str | os.PathLike):
    import polars as pl

    p = Path(path)
    if not p.is_file():
        raise MoesimError(f"{path}: no such quality results file (write one with moesim emulate MODEL --grid ... "
                          f"-o {p.name})")
    try:
        df = pl.read_parquet(p)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is one error line
        raise MoesimError(f"{path}: not a readable Parquet file ({exc})") from None
    missing = [c for c in QUALITY_COLUMNS if c not in df.columns]
    if missing:
        raise MoesimError(f"{path}: not moesim quality results (missing columns: {', '.join(missing)})")
    return df


def existing_keys(path) -> set[str] | None:
    if path is None or not Path(path).exists():
        return None
    return set(read_quality(path)["row_key"].to_list())


def write_quality(df, path) -> int:
    """Add rows to a quality results file (atomically; rows already there are kept). Returns the row count."""
    import polars as pl

    from moesim.files import write_table

    if Path(path).suffix != ".parquet":
        raise MoesimError(f"{path}: quality results are written as .parquet")
    if Path(path).exists():
        old = read_quality(path)
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

    def estimate(self, mass_per_step: float) -> float:
        return self.slope * mass_per_step

    def label(self) -> str:
        return f"estimate: {self.slope:.3g} x mass/step, fit on n={self.n} measured configs (r={self.r:.2f})"


def pearson(x, y) -> float:
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 2 or x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def class_stats(df) -> dict[bool, dict]:
    """Pearson r and n of (mass per step, dppl %) per class (fetches first: True / False), over the
    configs with nonzero substituted mass."""
    out = {}
    for cls in (True, False):
        part = df.filter((df["fetches_first"] == cls) & (df["mass_per_step"] > 0))
        out[cls] = {"n": part.height, "r": pearson(part["mass_per_step"], part["dppl_pct"])}
    return out


def mass_fit(df, model_id: str) -> MassFit | None:
    part = df.filter((df["model_id"] == model_id) & df["fetches_first"] & (df["mass_per_step"] > 0))
    if part.height < MIN_FIT:
        return None
    x, y = part["mass_per_step"].to_numpy(), part["dppl_pct"].to_numpy()
    slope = float((x * y).sum() / (x * x).sum())
    return MassFit(model_id, slope, pearson(x, y), part.height)


def attach_quality(rows, quality):
    """Sweep rows + ``dppl_pct`` (measured where the config was emulated for the trace's model; for
    the always-fetch-first class otherwise the mass fit's estimate), ``dppl_source`` ("measured",
    the fit's label, or null) and ``dppl_shown`` (the table cell: "~" marks an estimate). Rows of a
    model the quality results do not cover stay empty."""
    import polars as pl

    from moesim.emulator.run import FETCHES_FIRST

    setups = quality.group_by("model_id").agg(pl.col("setup_key").n_unique().alias("n"))
    many = setups.filter(pl.col("n") > 1)
    if many.height:
        raise MoesimError(f"the quality results hold several emulation setups (texts, dtype, window...) for model "
                          f"{many['model_id'][0]}; keep one per model")
    measured = {(r["model_id"], r["config_key"]): r["dppl_pct"] for r in quality.iter_rows(named=True)}
    fits = {m: mass_fit(quality, m) for m in quality["model_id"].unique().to_list()}
    vals, srcs, shown = [], [], []
    for r in rows.iter_rows(named=True):
        v = measured.get((r["model_id"], r["config_key"]))
        fit = fits.get(r["model_id"])
        if v is not None:
            vals.append(v), srcs.append("measured"), shown.append(f"{v:+.2f}")
        elif fit is not None and r["miss"].split(":")[0] in FETCHES_FIRST and r["mass_per_step"] is not None \
                and math.isfinite(r["mass_per_step"]):
            e = fit.estimate(r["mass_per_step"])
            vals.append(e), srcs.append(fit.label()), shown.append(f"~{e:+.2f}")
        else:
            vals.append(None), srcs.append(None), shown.append(None)
    return rows.with_columns(pl.Series("dppl_pct", vals, dtype=pl.Float64),
                             pl.Series("dppl_source", srcs, dtype=pl.Utf8),
                             pl.Series("dppl_shown", shown, dtype=pl.Utf8))


def within(rows, max_dppl: float):
    """Only the rows whose dppl % (measured or estimated) is at most ``max_dppl``, re-ranked."""
    import polars as pl

    from moesim.sweeps.ranking import annotate

    kept = rows.filter(pl.col("dppl_pct").is_not_null() & (pl.col("dppl_pct") <= max_dppl))
    return annotate(kept)
