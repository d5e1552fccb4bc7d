"""Columns derived over a table of sweep rows: speed-up vs fetch-all, rank, Pareto flag.

Rows compete within a group (``group_key``: same trace, machine/model/quantization, cache size,
allocation, warm start, warm-up, reset and batch): the question a group answers is "which policy for
this much memory on this machine". Priced groups rank by time per token (then substituted mass, then
hit rate); unpriced groups rank by hit rate (then mass). The Pareto flag marks rows no other row of
the group beats on both time per token and mass per step (both lower is better; unpriced: hit rate
higher and mass lower). The speed-up divides the time per token of fetch-all with the same eviction
(and everything else equal) by the row's.
"""

from __future__ import annotations

import math

from moesim.sweeps.schema import ROW_SCHEMA, frame

BY_TIME = "time per token"
BY_HIT_RATE = "hit rate (not priced)"


def _num(x) -> float:
    return float("nan") if x is None else float(x)


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


def annotate(df):
    """Add speedup_vs_fetch_all, rank, pareto and ranked_by (recomputed from scratch), sorted by
    (group, rank)."""
    import polars as pl

    if df.height == 0:
        return frame([], ROW_SCHEMA)
    rows = df.to_dicts()
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["group_key"], []).append(r)
    for members in groups.values():
        base = {r["eviction"]: r["s_per_token"] for r in members
                if r["miss"] == "fetch-all" and r["admit"] is None and r["s_per_token"] is not None}
        priced = all(r["priced"] for r in members)
        for r in members:
            b = base.get(r["eviction"])
            s = r["s_per_token"]
            r["speedup_vs_fetch_all"] = b / s if (priced and b is not None and s) else None
            r["ranked_by"] = BY_TIME if priced else BY_HIT_RATE
        if priced:
            order = sorted(members, key=lambda r: (_num(r["s_per_token"]), r["mass_per_step"], -r["hit_rate"],
                                                   r["config_key"]))
            pts = [(_num(r["s_per_token"]), _num(r["mass_per_step"])) for r in members]
        else:
            order = sorted(members, key=lambda r: (-_num(r["hit_rate"]), r["mass_per_step"], r["config_key"]))
            pts = [(-_num(r["hit_rate"]), _num(r["mass_per_step"])) for r in members]
        for i, r in enumerate(order):
            r["rank"] = i + 1
        for r, flag in zip(members, pareto_front(pts)):
            r["pareto"] = flag
    out = frame(rows, ROW_SCHEMA)
    extra = [c for c in df.columns if c not in out.columns]
    if extra:
        out = pl.concat([out, df.select(extra)], how="horizontal")
    return out.sort(["trace", "trace_digest", "hw", "model", "quant", "cost_key", "allocation", "batch", "budget",
                     "slots", "group_key", "rank"], nulls_last=True)
