"""Columns derived over a table of sweep rows: speed-up over the baseline, quality class, rank, Pareto flag.

Rows compete within a group (``group_key``: same trace, machine/model/quantization, cache size,
allocation, warm start, warm-up, reset and batch): the question a group answers is "which policy for
this much memory on this machine".

- **Speed-up**: the time per token of the group's *baseline* config divided by the row's. The baseline
  is one named config for every row of every table, chart and file (default: the ``fetch-all`` preset,
  LRU + fetch every miss, what an offloading engine without a policy runs); ``baseline`` names it. Rows
  that replay identically get identical speed-ups.
- **Quality class** (``keeps_first_choice``): whether the miss policy always runs the router's first
  choice (fetch-all, threshold:θ, first-choice, cpu). The substitution study found substituted gate mass
  tracks the perplexity increase only among such policies, so mass compares rows within a class, not
  across classes.
- **Rank**: by default the class that keeps the first choice comes first, then time per token (then
  mass, then hit rate); ``rank_by="time"`` ranks by time alone. Unpriced groups rank by hit rate.
- **Pareto**: no other row of the same group and class is at least as fast with at most as much
  substituted mass and strictly better on one of them (unpriced: hit rate instead of time).
- **Intervals** (rows replayed with ``--ci``): low/high of every rate, the mass and the time, the paired
  speed-up interval and ``overlaps_best`` (sweeps/intervals.py).
"""

from __future__ import annotations

import math

from moesim.policies import miss as miss_mod
from moesim.sweeps.grid import DEFAULT_BASELINE, baseline_label, baseline_policy
from moesim.sweeps.intervals import annotate_group
from moesim.sweeps.schema import ROW_SCHEMA, frame

RANK_BY = ("class", "time")
BY_TIME = "time per token"
BY_HIT_RATE = "hit rate (not priced)"
CLASS_FIRST = "1st-choice class, then "


def _num(x) -> float:
    return float("nan") if x is None else float(x)


def keeps_first_choice(miss: str, reroute: str | None = None) -> bool:
    """The policy always runs the router's first choice: its miss policy never substitutes or drops rank 0, and no
    reroute may replace it (bias:λ can; keep:J with J >= 1 keeps it)."""
    if reroute and reroute != "none" and not (reroute.startswith("keep:") and float(reroute.partition(":")[2]) >= 1):
        return False
    return miss_mod.get(miss_mod.parse_miss(miss)[0]).keeps_first


def pareto_front(points: list[tuple[float, float]]) -> list[bool]:
    """Minimize both coordinates. A point is on the front unless another is <= on both and < on one.
    Equal points are all on the front (or all off). NaN points are never on it."""
    idx = [i for i, (x, y) in enumerate(points) if not (math.isnan(x) or math.isnan(y))]
    idx.sort(key=lambda i: points[i])
    flags = [False] * len(points)
    best_y = math.inf
    last = None
    for i in idx:
        p = points[i]
        if p[1] < best_y or p == last:
            flags[i] = True
            last = p
        best_y = min(best_y, p[1])
    return flags


def _baseline_row(members: list[dict], policy: tuple) -> dict | None:
    found = [r for r in members if (r["eviction"], r["miss"], r["admit"]) == policy and r["s_per_token"] is not None
             and r.get("prefetch") in (None, "none") and r.get("reroute") in (None, "none")  # nor reroutes
             and r.get("admission") in (None, "always")]  # the baseline admits every fetch (older files: null)
    # one per group unless a results file mixes engine profiles for the same config: take a stable one
    return min(found, key=lambda r: r["row_key"]) if found else None


def annotate(df, baseline: str = DEFAULT_BASELINE, rank_by: str = "class"):
    """Add keeps_first_choice, speedup, baseline, rank, pareto, ranked_by and, for rows with unit sums,
    the confidence intervals (recomputed from scratch), sorted by (group, rank)."""
    import polars as pl

    if rank_by not in RANK_BY:
        raise ValueError(f"rank_by must be one of {RANK_BY}")
    if df.height == 0:
        return frame([], ROW_SCHEMA)
    policy = baseline_policy(baseline)
    label = baseline_label(baseline)
    rows = df.to_dicts()
    groups: dict[str, list[dict]] = {}
    for r in rows:
        r["keeps_first_choice"] = keeps_first_choice(r["miss"], r.get("reroute"))
        groups.setdefault(r["group_key"], []).append(r)
    for members in groups.values():
        priced = all(r["priced"] for r in members)
        base = _baseline_row(members, policy) if priced else None
        b = base["s_per_token"] if base is not None else None
        by = BY_TIME if priced else BY_HIT_RATE
        for r in members:
            s = r["s_per_token"]
            r["speedup"] = b / s if (b is not None and s) else None
            r["baseline"] = label if priced else None
            r["ranked_by"] = (CLASS_FIRST + by) if rank_by == "class" else by

        def klass(r):
            return 0 if (rank_by == "time" or r["keeps_first_choice"]) else 1

        if priced:
            order = sorted(members, key=lambda r: (klass(r), _num(r["s_per_token"]), r["mass_per_step"],
                                                   -r["hit_rate"], r["config_key"]))
        else:
            order = sorted(members, key=lambda r: (klass(r), -_num(r["hit_rate"]), r["mass_per_step"],
                                                   r["config_key"]))
        for i, r in enumerate(order):
            r["rank"] = i + 1
        for keeps in (True, False):
            part = [r for r in members if r["keeps_first_choice"] == keeps]
            x = "s_per_token" if priced else "hit_rate"
            sign = 1.0 if priced else -1.0
            pts = [(sign * _num(r[x]), _num(r["mass_per_step"])) for r in part]
            for r, flag in zip(part, pareto_front(pts)):
                r["pareto"] = flag
        annotate_group(members, base, priced, klass)
    out = frame(rows, ROW_SCHEMA)
    extra = [c for c in df.columns if c not in out.columns]
    if extra:
        out = pl.concat([out, df.select(extra)], how="horizontal")
    return out.sort(["trace", "trace_digest", "hw", "model", "quant", "allocation", "batch", "budget",
                     "slots", "group_key", "rank"], nulls_last=True)


def select_rows(df, top: int | None, max_mass: float | None):
    """The rows to print: within --max-mass substituted mass per step, the best --top of each group.
    Returns (rows, {group_key: rows left out by --max-mass})."""
    import polars as pl

    dropped: dict[str, int] = {}
    if max_mass is not None:
        over = df.filter(pl.col("mass_per_step") > max_mass + 1e-12)
        dropped = dict(over.group_by("group_key").len().iter_rows())
        df = df.filter(pl.col("mass_per_step") <= max_mass + 1e-12)  # ranks stay those of the whole group
    if top:
        df = df.filter(pl.col("rank").rank("ordinal").over("group_key") <= top)
    return df, dropped
