"""Resampling units of a trace or a replay, and a replay's sums per unit (docs/uncertainty.md).

Units are the trace's sequences; a batched replay's lock-step groups (each group of B sequences
shares every step); or, when there is only one of those (or ``rule="block"``), contiguous blocks
of the counted steps: n = floor(S / b) blocks of nearly equal length for S counted steps, with
b = max(64, ceil(S / 50)) (so at most 50 blocks, each at least 64 steps; a step is a token at
batch 1). Steps replayed but not counted (--warmup-tokens) belong to no unit.

``unit_sums`` adds a SimResult's per-step series (its counters, gate mass, tokens and seconds)
per unit: everything a ratio statistic of the replay needs, so intervals need no replay per
resample (simulator/rotation.py adds one replay so that every unit is counted with a warm cache).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from moesim.errors import MoesimError
from moesim.simulator.bootstrap import CI, percentile_interval, ratio, resampled_sums
from moesim.simulator.config import SimConfig
from moesim.simulator.counters import COUNTER_NAMES

MIN_BLOCK = 64     # steps: a block shorter than this is mostly cache warm-up
MAX_BLOCKS = 50    # blocks: enough for a stable percentile interval, few enough to stay long
# The sums kept per unit, in this order (``unit_sums`` columns; the results' ci_unit_sums, row-major).
# steps = counted (token, layer) steps: counted tokens x MoE layers, the denominator of mass per step.
SUM_NAMES = ("requests", "hits", "substitutions", "drops", "mass", "steps", "seconds", "timed_tokens")
_COUNTER = {name: COUNTER_NAMES.index(name) for name in ("requests", "hits", "substitutions", "drops")}
_COL = {name: i for i, name in enumerate(SUM_NAMES)}
# Ratio statistics of a replay: (numerator sum, denominator sum).
RATIOS = {"hit_rate": ("hits", "requests"), "substitution_rate": ("substitutions", "requests"),
          "drop_rate": ("drops", "requests"), "mass_per_step": ("mass", "steps"),
          "s_per_token": ("seconds", "timed_tokens")}
# Every statistic with an interval in a sweep row (the last four follow from the first five).
STATISTICS = ("hit_rate", "miss_rate", "substitution_rate", "drop_rate", "mass_per_step", "s_per_token",
              "ms_per_token", "tok_per_s")
TIMED = ("s_per_token", "ms_per_token", "tok_per_s")


@dataclass(frozen=True)
class Units:
    kind: str                 # "sequence", "batch group" or "block"
    ids: np.ndarray           # [steps] int64: the unit of each step, -1 for a step not counted
    n: int                    # number of units
    block_steps: int | None   # blocks: the shorter block length in steps (the others are one longer)
    step: str = "token"       # what a step is: a token (batch 1) or a lock-step batch step

    def describe(self) -> str:
        return describe(self.kind, self.n, self.block_steps, self.step)


def describe(kind: str, n: int, block_steps: int | None = None, step: str = "token") -> str:
    """"4 sequences", "31 blocks of 64 tokens" (the others one step longer), "2 batch groups"."""
    if kind == "block":
        return f"{n} block{'s' if n != 1 else ''} of {block_steps} {step}s"
    return f"{n} {kind}{'s' if n != 1 else ''}"


def block_length(n_steps: int) -> int:
    """The shortest block: max(64, ceil(S / 50)) steps."""
    return max(MIN_BLOCK, math.ceil(n_steps / MAX_BLOCKS))


def assign(step_seq: np.ndarray, first_counted: int, rule: str = "auto", word: str = "sequence",
           step: str = "token") -> Units:
    """Units of steps ``first_counted``.. whose sequences (or batch groups) are ``step_seq``."""
    step_seq = np.asarray(step_seq)
    S = len(step_seq)
    n_steps = S - first_counted
    if n_steps < 1:
        raise MoesimError("no counted steps to resample")
    ids = np.full(S, -1, np.int64)
    if rule in ("auto", "sequence"):
        uniq, inv = np.unique(step_seq[first_counted:], return_inverse=True)
        if rule == "sequence" or len(uniq) >= 2:
            ids[first_counted:] = inv.reshape(-1)
            return Units(word, ids, len(uniq), None, step)
    elif rule != "block":
        raise MoesimError(f"unknown resampling unit {rule!r}")
    n = max(1, n_steps // block_length(n_steps))
    ids[first_counted:] = np.arange(n_steps, dtype=np.int64) * n // n_steps
    return Units("block", ids, n, n_steps // n, step)


def replay_units(routing, config: SimConfig, rule: str = "auto") -> Units:
    """The units of ``config`` replayed on ``routing``, over the replay's own steps (simulator/args.py):
    tokens at batch 1, lock-step steps of B sequences otherwise."""
    if config.batch == 1:
        return assign(routing.seq, int(config.warmup_tokens), rule)
    from moesim.simulator.batch import batch_routing

    run, _, members = batch_routing(routing, config.batch)
    warmup = int((members.max(axis=1) < config.warmup_tokens).sum())
    return assign(run.seq, warmup, rule, "batch group", "batch step")


def unit_sums(result, units: Units) -> np.ndarray:
    """[units, len(SUM_NAMES)] float64: the replay's counted requests, hits, substitutions, drops,
    gate mass and (token, layer) steps per unit, and its timed seconds and tokens (decode steps, or every counted
    step when none is a decode step: as SimResult.attach_timing times them)."""
    ids = units.ids
    if len(ids) != len(result.token_mass) or (ids[result.warmup_steps:] < 0).any() \
            or (ids[:result.warmup_steps] >= 0).any():
        raise MoesimError("internal: resampling units do not match the replay's steps")
    return sums_by_unit(result, ids, units.n)


def sums_by_unit(result, ids: np.ndarray, n_units: int) -> np.ndarray:
    """``unit_sums`` with the unit of every replayed step given (-1: a step no unit counts)."""
    if len(ids) != len(result.token_mass):
        raise MoesimError("internal: resampling units do not match the replay's steps")
    counted = ids >= 0
    timed = counted & np.asarray(result.step_decode, bool)
    if not timed.any():
        timed = counted
    members = np.asarray(result.step_members, np.float64)

    def per_unit(values, mask):
        return np.bincount(ids[mask], weights=np.asarray(values, np.float64)[mask], minlength=n_units)

    cols = {name: per_unit(result.token_counts[:, i], counted) for name, i in _COUNTER.items()}
    cols["mass"] = per_unit(result.token_mass, counted)
    cols["steps"] = per_unit(members, counted) * len(result.layer_ids)
    seconds = result.token_seconds if len(result.token_seconds) == len(ids) else np.zeros(len(ids))
    cols["seconds"] = per_unit(seconds, timed)
    cols["timed_tokens"] = per_unit(members, timed)
    return np.stack([cols[name] for name in SUM_NAMES], axis=1)


def replay_statistics(sums: np.ndarray) -> dict[str, np.ndarray]:
    """The ratio statistics of sums [..., len(SUM_NAMES)] (one sample or every resample)."""
    s = np.asarray(sums, np.float64)
    return {name: ratio(s[..., _COL[num]], s[..., _COL[den]]) for name, (num, den) in RATIOS.items()}


def replay_intervals(sums: np.ndarray, ci: CI, timed: bool = True,
                     offset: np.ndarray | None = None) -> dict[str, tuple | None]:
    """LEVEL% percentile intervals of every statistic in STATISTICS (None without one: a single unit,
    or the time statistics of an unpriced replay). ``offset`` [len(SUM_NAMES)] is added to every
    resample's sums (the cold start, simulator/rotation.py)."""
    sums = np.asarray(sums, np.float64)
    out: dict[str, tuple | None] = dict.fromkeys(STATISTICS)
    if sums.shape[0] < 2:
        return out
    resampled = resampled_sums(sums, ci.resamples)
    if offset is not None:
        resampled += np.asarray(offset, np.float64)
    reps = replay_statistics(resampled)
    for name in RATIOS:
        if name == "s_per_token" and not timed:
            continue
        out[name] = percentile_interval(reps[name], ci.level)
    return derived_intervals(out)


def derived_intervals(iv: dict) -> dict:
    """Miss rate, ms and tokens per second from the hit rate's and the time's intervals: monotone
    maps of each resampled value, so the order statistics map exactly."""
    h, s = iv.get("hit_rate"), iv.get("s_per_token")
    iv["miss_rate"] = (1.0 - h[1], 1.0 - h[0]) if h else None
    iv["ms_per_token"] = (1e3 * s[0], 1e3 * s[1]) if s else None
    iv["tok_per_s"] = ((1.0 / s[1] if s[1] > 0 else float("inf")), (1.0 / s[0] if s[0] > 0 else float("inf"))) \
        if s else None
    return iv


__all__ = ["Units", "describe", "SUM_NAMES", "RATIOS", "STATISTICS", "TIMED", "MIN_BLOCK", "MAX_BLOCKS",
           "block_length", "assign", "replay_units", "unit_sums", "sums_by_unit", "replay_statistics",
           "replay_intervals", "derived_intervals"]
