"""Static placements learned out of sample in a sweep.

A placement learned from the trace's request counts (``static``, ``static-domain``: registry ``learns``) and scored
on the same tokens flatters itself: it was chosen knowing every request it is scored on (a hot set learned on one
part of a workload may cover little of another: issue 31). A sweep that ranks such a placement
therefore learns it from a holdout prefix the replay does not count: the first floor(F x T) tokens of each trace
(F = DEFAULT_HOLDOUT unless the grid or --holdout says otherwise; 0 learns in sample, as before). Every row of the
sweep, the baseline too, replays the prefix and counts only the tokens after it, so the rows stay comparable; the
placements become ``static:H`` / ``static-domain:H`` (learned from the first H tokens) and the tables' titles say
that the first H tokens were not counted. A placement given its own prefix (``static:W``) keeps it."""

from __future__ import annotations

import dataclasses
import math

from moesim.policies import registry
from moesim.simulator.config import SimConfig

DEFAULT_HOLDOUT = 0.25  # a quarter of each trace: three quarters counted


def learns(config: SimConfig) -> bool:
    """The config's placement is learned from the whole trace it is scored on (static without :W, ...)."""
    return registry.get(config.eviction_name).learns and config.eviction_param is None


def fraction(holdout: float | None, configs) -> float:
    """The sweep's holdout fraction: ``holdout`` when given, else DEFAULT_HOLDOUT when a config learns its
    placement, else 0."""
    if holdout is not None:
        return float(holdout)
    return DEFAULT_HOLDOUT if any(learns(c) for c in configs) else 0.0


def tokens(f: float, n_tokens: int) -> int:
    """The holdout prefix of an n-token trace: floor(f x n) tokens (at least one token is left to count)."""
    return min(int(math.floor(f * n_tokens + 1e-9)), max(0, n_tokens - 1))


def apply(config: SimConfig, held: int) -> SimConfig:
    """``config`` replayed with the first ``held`` tokens not counted, its learned placement learned from them."""
    if held <= 0:
        return config
    change: dict = {"warmup_tokens": max(config.warmup_tokens, held)}
    if learns(config):
        change["eviction"] = f"{config.eviction_name}:{held}"
    return dataclasses.replace(config, **change)
