"""Confidence intervals of sweep rows, derived like the speed-up and the rank (sweeps/ranking.py).

A row replayed with ``--ci`` keeps its replay's sums per resampling unit (``ci_unit_sums``,
simulator/units.py), the cold-start offset added to every resample (``ci_offset_sums``,
simulator/rotation.py) and how they were taken (``ci_level``, ``ci_resamples``, ``ci_rule``,
``ci_method``, ``ci_unit``, ``ci_units``, ``ci_block_steps``). From them, every time the rows are ranked:

- ``<statistic>_low`` / ``_high`` for the hit, miss, substitution and drop rates, mass per step and
  time per token (s, ms, tokens per second): the percentile bootstrap of simulator/bootstrap.py;
- ``speedup_low`` / ``_high``: paired. Every row of a group resamples the same units with the same
  draws, so resample b's speed-up is the baseline's time in resample b over the row's time in
  resample b (the baseline row's interval is exactly [1, 1]). Rows whose units differ (another
  ``--ci-unit``) get none;
- ``overlaps_best``: the row's time interval (hit-rate interval when unpriced) overlaps the one of
  the best row of its ranking class in the group, so this trace does not resolve the difference
  (True for the best row itself; null without intervals).

Rows without unit sums (replayed without ``--ci``, or written by older versions) get nulls.
"""

from __future__ import annotations

import numpy as np

from moesim.simulator.bootstrap import percentile_interval, ratio, resampled_sums
from moesim.simulator.units import RATIOS, STATISTICS, SUM_NAMES, derived_intervals, replay_statistics
from moesim.sweeps.schema import INTERVAL_STATISTICS

INTERVAL_COLUMNS = tuple(f"{s}_{side}" for s in INTERVAL_STATISTICS for side in ("low", "high"))
SETTING_COLUMNS = ("ci_level", "ci_resamples", "ci_rule", "ci_method", "ci_unit", "ci_units", "ci_block_steps")
_PAIRING = ("ci_resamples", "ci_rule", "ci_method", "ci_unit", "ci_units", "ci_block_steps")


def _sums(r: dict) -> np.ndarray | None:
    s, n = r.get("ci_unit_sums"), r.get("ci_units")
    if s is None or not n or r.get("ci_level") is None or r.get("ci_resamples") is None:
        return None
    a = np.asarray(s, np.float64)
    return a.reshape(int(n), len(SUM_NAMES)) if a.size == int(n) * len(SUM_NAMES) else None


def _offset(r: dict) -> np.ndarray:
    o = r.get("ci_offset_sums")
    return np.asarray(o, np.float64) if o is not None and len(o) == len(SUM_NAMES) else np.zeros(len(SUM_NAMES))


def _overlap(a: tuple | None, b: tuple | None) -> bool | None:
    if a is None or b is None:
        return None
    return bool(a[0] <= b[1] and b[0] <= a[1])


def annotate_group(members: list[dict], base: dict | None, priced: bool, klass) -> None:
    """Set the interval columns of one group's rows (in place); ``members`` carry their ``rank``,
    ``klass(row)`` is the row's ranking class (the best row of each class is the reference)."""
    times: dict[int, np.ndarray] = {}
    for r in members:
        for c in INTERVAL_COLUMNS:
            r[c] = None
        r["overlaps_best"] = None
        sums = _sums(r)
        if sums is None or sums.shape[0] < 2:
            continue
        reps = replay_statistics(resampled_sums(sums, int(r["ci_resamples"])) + _offset(r))
        iv: dict = {}
        for name in RATIOS:
            if name == "s_per_token" and not priced:
                continue
            iv[name] = percentile_interval(reps[name], float(r["ci_level"]))
        derived_intervals(iv)
        for name in STATISTICS:
            if iv.get(name) is not None:
                r[f"{name}_low"], r[f"{name}_high"] = iv[name]
        if priced:
            times[id(r)] = reps["s_per_token"]
    if base is not None and id(base) in times:
        for r in members:
            if id(r) in times and all(r.get(c) == base.get(c) for c in _PAIRING):
                paired = percentile_interval(ratio(times[id(base)], times[id(r)]), float(r["ci_level"]))
                if paired is not None:
                    r["speedup_low"], r["speedup_high"] = paired
    key = "s_per_token" if priced else "hit_rate"
    best: dict = {}
    for r in sorted(members, key=lambda r: r["rank"]):
        best.setdefault(klass(r), r)
    for r in members:
        b = best[klass(r)]
        r["overlaps_best"] = _overlap(_interval(r, key), _interval(b, key))


def _interval(r: dict, name: str) -> tuple | None:
    lo, hi = r.get(f"{name}_low"), r.get(f"{name}_high")
    return None if lo is None or hi is None else (lo, hi)


__all__ = ["annotate_group", "INTERVAL_STATISTICS", "INTERVAL_COLUMNS", "SETTING_COLUMNS"]
