"""Every unit counted with a warm cache: the replay plus one replay of the trace rotated by half.

A replay starts cold, so the unit that opens the trace carries the cold start: with a policy that
warms slowly (frequency eviction with background admission fills the cache over hundreds of
tokens) its hit rate is far below the others'. Resampling that unit's counts as if it were any
unit turns one cold start into zero to U cold starts per resample, and the interval measures the
cold start rather than the trace (on the shipped trace, quality-first's hit-rate interval was 17x
wider than replaying each resample; benchmarks/ci_rereplay.py, docs/uncertainty.md).

So the trace is replayed a second time rotated by half: units h = U // 2 .. U-1 first, then units
0 .. h-1. Units 0 .. h-1 are counted from the rotated replay (where units h.. precede them) and
units h.. from the replay itself (where units 0 .. h-1 precede them): every unit is counted after
half the trace. The cold start is the difference between the replay's totals and the sum of these
warm units: a fixed ``offset`` added to every resample (a trace starts cold once, whatever units it
holds), so resampling all units once each gives the replay's value exactly.

Not done (the unit keeps the cold start it met, method "single") for batched replays (rotating
lock-step groups can regroup the sequences) and for static:W, whose pinned set comes from the first
W tokens; nor when asked for (``CI.method == "single"``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from moesim.simulator.bootstrap import METHODS
from moesim.simulator.config import SimConfig
from moesim.simulator.units import Units, sums_by_unit, unit_sums
from moesim.traces.routing import Routing


def unsupported(config: SimConfig) -> str | None:
    """Why ``config`` cannot be counted from a rotated replay (None: it can)."""
    if config.batch > 1:
        return "batched replays keep the cold start in their first group"
    if config.pinned and config.eviction_param is not None:
        return f"{config.eviction} pins from the first tokens, which a rotation changes"
    return None


def method_for(config: SimConfig, method: str) -> str:
    """The method a replay of ``config`` is counted with when ``method`` is asked for."""
    return "single" if method == "rotated" and unsupported(config) else method


def rotation(units: Units) -> tuple[np.ndarray, int]:
    """(the replayed steps in rotated order, h): the trace starting at unit h = U // 2's first step."""
    h = units.n // 2
    start = int(np.flatnonzero(units.ids == h)[0])
    S = len(units.ids)
    return np.concatenate([np.arange(start, S), np.arange(0, start)]), h


def rotated_routing(routing: Routing, order: np.ndarray) -> Routing:
    """``routing``'s tokens in ``order`` (sequence ids kept: a cache reset per sequence still happens at
    every sequence start)."""
    def take(a):
        return None if a is None else np.ascontiguousarray(np.asarray(a)[order])

    return Routing(meta=routing.meta, seq=take(routing.seq), pos=take(routing.pos), phase=take(routing.phase),
                   domain=take(routing.domain), domain_names=routing.domain_names, token=take(routing.token),
                   sel=take(routing.sel), w=take(routing.w), cand=take(routing.cand), logits=take(routing.logits),
                   lookahead=take(routing.lookahead), digest=f"{routing.digest}:rotated{int(order[0])}",
                   path=routing.path)


def warm_unit_sums(routing: Routing, config: SimConfig, units: Units, result, cost=None,
                   method: str = "rotated") -> tuple[np.ndarray, np.ndarray, str]:
    """(per-unit sums, offset, method used): with "rotated", every unit's sums counted warm and the cold
    start as the offset (one more replay); with "single" (or where rotation does not apply), the
    replay's own per-unit sums and a zero offset."""
    cold = unit_sums(result, units)
    used = method_for(config, method)
    if used == "single" or units.n < 2:
        return cold, np.zeros(cold.shape[1]), used
    from moesim.simulator.driver import simulate

    order, h = rotation(units)
    # every config of a sweep rotates the same way: one rotated routing (and its derived arrays) per trace
    rotated = routing.derived(("rotated", int(order[0]), len(order)), lambda: rotated_routing(routing, order))
    again = simulate(rotated, dataclasses.replace(config, warmup_tokens=0), cost=cost)
    warm = cold.copy()
    warm[:h] = sums_by_unit(again, units.ids[order], units.n)[:h]
    return warm, cold.sum(axis=0) - warm.sum(axis=0), used


__all__ = ["METHODS", "unsupported", "method_for", "rotation", "rotated_routing", "warm_unit_sums"]
