"""Percentile-bootstrap confidence intervals of ratio statistics over resampling units.

A trace is a sample: its sequences (or blocks of tokens, simulator/units.py) are the units. A
statistic such as the hit rate is a ratio of sums over units (hits / requests), so one replay's
per-unit sums give every resample's value without replaying: resample b draws U units uniformly
with replacement, and its sums are ``weights[b] @ per_unit_sums`` with ``weights[b, u]`` = how
often unit u was drawn. The interval is the percentile interval of the B resampled values.

What this does not do: the replay ran once, with the units in their order, so each unit's counts
carry the cache state the units before it left. A resample re-weights those contributions; it does
not replay the resampled units in a new order (which would change the cache state each one meets).
docs/uncertainty.md says how much that matters on the shipped trace.

Every draw comes from one generator seeded with ``SEED`` (zlib.crc32 of a fixed name): the same
units and resamples give the same intervals on every machine, and every config of a sweep sees the
same resamples (so their intervals are paired: ``sweeps/intervals.py`` uses that for speed-ups).
"""

from __future__ import annotations

import functools
import math
import zlib
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from moesim.errors import MoesimError

SEED = zlib.crc32(b"moesim bootstrap")
DEFAULT_RESAMPLES = 1000
# Bounds checked before anything is drawn: B resamples are drawn one at a time (10^5 take about a second), and
# their weights hold B x units counts.
MAX_RESAMPLES = 100_000
MAX_WEIGHTS = 1 << 28
UNIT_RULES = ("auto", "sequence", "block")
METHODS = ("rotated", "single")  # how a unit's counts are taken (simulator/rotation.py)
ASSUMPTION = ("percentile bootstrap over units of the replay: units are re-weighted, not re-replayed in a new "
              "order, so each keeps the cache state it was counted with (method rotated: after half the trace, "
              "the cold start a fixed offset; single: as the one replay gave it)")


@dataclass(frozen=True)
class CI:
    """What ``--ci LEVEL`` asks for: a two-sided LEVEL% interval from ``resamples`` bootstrap
    resamples of units chosen by ``unit`` (auto: sequences, or blocks of tokens when the replay
    has a single sequence), each unit counted with a warm cache and the cold start as a fixed offset
    (``method="rotated"``, one more replay) or as the replay gave it (``"single"``); docs/uncertainty.md."""

    level: float = 95.0
    resamples: int = DEFAULT_RESAMPLES
    unit: str = "auto"
    method: str = "rotated"

    def __post_init__(self):
        level = float(self.level)
        if not (math.isfinite(level) and 0.0 < level < 100.0):
            raise MoesimError(f"--ci must be a confidence level in percent between 0 and 100, got {self.level!r}")
        if int(self.resamples) != self.resamples or self.resamples < 1:
            raise MoesimError(f"--ci-resamples must be a positive whole number, got {self.resamples!r}")
        if self.resamples > MAX_RESAMPLES:
            raise MoesimError(f"--ci-resamples must be at most {MAX_RESAMPLES:,} (the limit; percentile intervals "
                              f"settle long before), got {self.resamples!r}")
        if self.unit not in UNIT_RULES:
            raise MoesimError(f"--ci-unit must be one of {', '.join(UNIT_RULES)}, got {self.unit!r}")
        if self.method not in METHODS:
            raise MoesimError(f"--ci-method must be one of {', '.join(METHODS)}, got {self.method!r}")
        object.__setattr__(self, "level", level)
        object.__setattr__(self, "resamples", int(self.resamples))
        tail_rank(level, int(self.resamples))  # refuse a level the resamples cannot resolve


def method_note(method: str | None) -> str:
    """How the units of an interval were counted, for table notes and captions."""
    if method == "single":
        return "each unit counted as the one replay met it (the first carries the cold start)"
    return "each unit counted with a warm cache, the cold start a fixed offset"


def tail_rank(level: float, resamples: int) -> int:
    """j such that the interval is [r_(j), r_(B+1-j)] of the B sorted resampled values: j = ceil(B x
    (100 - level) / 200), computed exactly (95% of 1000 resamples: the 25th and the 976th)."""
    j = _rank(level, resamples)
    if j is None:
        need = math.ceil(1 / _tail(level))
        raise MoesimError(f"a {level:g}% interval needs at least {need} resamples (--ci-resamples), got {resamples}")
    return j


def _tail(level: float) -> Fraction:
    return (100 - Fraction(str(float(level)))) / 200


def _rank(level: float, n: int) -> int | None:
    """None when the tail holds less than one resample (the interval would be [min, max], whose level is
    lower than asked) or the two order statistics would cross."""
    x = n * _tail(level)
    j = math.ceil(x)
    return j if x >= 1 and 2 * j <= n else None


@functools.lru_cache(maxsize=4)
def weights(n_units: int, resamples: int, seed: int = SEED) -> np.ndarray:
    """[resamples, n_units]: how often each unit is drawn in each resample (each row sums to n_units).
    Resample b is ``rng.integers(0, n_units, size=n_units)`` drawn in order from one generator seeded
    with ``seed``; tests/test_uncertainty.py redraws them one unit at a time in pure Python."""
    if resamples * n_units > MAX_WEIGHTS:
        raise MoesimError(f"{resamples:,} resamples of {n_units:,} units would hold {resamples * n_units:,} weights, "
                          f"more than the limit of {MAX_WEIGHTS:,}: use fewer --ci-resamples or larger units "
                          "(--ci-unit block)")
    rng = np.random.default_rng(seed)
    out = np.empty((resamples, n_units), np.uint16 if n_units < 2**16 else np.uint32)
    for b in range(resamples):
        out[b] = np.bincount(rng.integers(0, n_units, size=n_units), minlength=n_units)
    out.setflags(write=False)
    return out


def resampled_sums(sums: np.ndarray, resamples: int, seed: int = SEED) -> np.ndarray:
    """[resamples, m]: the column sums of ``sums`` [U, m] under every resample. The weights are whole
    numbers, so sums of whole numbers (counters) come out exact."""
    sums = np.asarray(sums, np.float64)
    w = weights(sums.shape[0], resamples, seed)
    out = np.empty((resamples, sums.shape[1]), np.float64)
    step = max(1, (1 << 22) // max(1, sums.shape[0]))  # bound the float64 copy of the weights to ~32 MB
    for i in range(0, resamples, step):
        out[i:i + step] = w[i:i + step].astype(np.float64) @ sums
    return out


def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den elementwise, NaN where den is 0 (a resample that drew no unit with any requests)."""
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    out = np.full(np.broadcast(num, den).shape, np.nan)
    np.divide(num, den, out=out, where=den != 0)
    return out


def percentile_interval(values: np.ndarray, level: float) -> tuple[float, float] | None:
    """(low, high): the j-th smallest and j-th largest of the finite resampled values (``tail_rank``);
    None when too few are finite for the level."""
    v = np.asarray(values, np.float64)
    v = np.sort(v[np.isfinite(v)])
    j = _rank(level, len(v))
    if j is None:
        return None
    return float(v[j - 1]), float(v[len(v) - j])


def percentile_intervals(values: np.ndarray, level: float) -> np.ndarray:
    """[n, 2]: ``percentile_interval`` of every column of values [B, n] (NaN rows where there is none)."""
    v = np.asarray(values, np.float64)
    out = np.full((v.shape[1], 2), np.nan)
    finite = np.isfinite(v).all(axis=0)
    j = _rank(level, v.shape[0])
    if j is not None and finite.any():
        srt = np.sort(v[:, finite], axis=0)
        out[finite, 0], out[finite, 1] = srt[j - 1], srt[v.shape[0] - j]
    for i in np.flatnonzero(~finite):
        iv = percentile_interval(v[:, i], level)
        if iv is not None:
            out[i] = iv
    return out


__all__ = ["method_note", "CI", "SEED", "DEFAULT_RESAMPLES", "UNIT_RULES", "METHODS", "ASSUMPTION", "tail_rank",
           "weights", "resampled_sums", "ratio", "percentile_interval", "percentile_intervals"]
