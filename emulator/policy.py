"""The emulator's one call into the replay: decide every request of one MoE layer.

With per-layer pools and no clock, layer l's cache decisions depend only on layer l's requests,
so a one-layer Routing of layer l's requests over all tokens replays layer l alone. Everything
else in the emulator goes through this module, never the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moesim.emulator.quantize import RECIPES
from moesim.errors import MoesimError
from moesim.policies.miss import (
    OUTCOME_CPU,
    OUTCOME_DROP,
    OUTCOME_FETCH,
    OUTCOME_HIT,
    OUTCOME_LOWBIT,
    OUTCOME_SUBSTITUTE,
)
from moesim.simulator import SimConfig, SimResult, simulate
from moesim.traces.routing import Routing

__all__ = ["OUTCOME_HIT", "OUTCOME_FETCH", "OUTCOME_SUBSTITUTE", "OUTCOME_DROP", "OUTCOME_CPU", "OUTCOME_LOWBIT",
           "LayerDecisions", "check_config", "decide_layer", "combine", "replay"]


@dataclass
class LayerDecisions:
    outcome: np.ndarray      # [T, k] int8, rank order (OUTCOME_*)
    substitute: np.ndarray   # [T, k] int16, the expert run instead of a substituted one, else -1
    result: SimResult        # the layer's counters
    selected: np.ndarray | None = None   # [T, k] int16, the row each step ran (rerouted or not), rank order;
    #                                      None without a step policy


def check_config(config: SimConfig) -> None:
    """Refuse what the emulator cannot run exactly layer by layer (one line, MoesimError)."""
    if config.allocation != "per-layer":
        raise MoesimError("the emulator needs per-layer pools: with --allocation global a layer's decisions depend "
                          "on the other layers' requests of earlier tokens, which a teacher-forced pass computes "
                          "only after it (emulate with per-layer pools)")
    if config.low_quant is not None and config.low_quant not in RECIPES:
        raise MoesimError(f"the emulator computes low-bit experts as {', '.join(RECIPES)} (GGUF block formats); "
                          f"{config.miss} is not one of them")
    if config.lowbit_share is not None:
        raise MoesimError("the emulator replays each layer unpriced, and --lowbit-share sizes its tier by bytes per "
                          "expert: emulate lowbit:Q without a tier")
    if config.prefetch != "none":
        raise MoesimError("the emulator replays one layer at a time; a prefetch fills a layer's cache from "
                          "another layer's step, so emulate without --prefetch")
    if config.batch != 1:
        raise MoesimError("the emulator runs one sequence at a time (batch 1); batched decoding is a time-model "
                          "question, not a quality one")
    if config.reroute is not None and config.reroute_weights != "original":
        from moesim.emulator.rerouted import BIASED_NEEDS

        raise MoesimError(BIASED_NEEDS)


def decide_layer(routing: Routing, config: SimConfig) -> LayerDecisions:
    """Replay a one-layer routing under ``config``; each request's outcome in rank order."""
    if routing.n_layers != 1:
        raise MoesimError("decide_layer takes the routing of one MoE layer")
    res = simulate(routing, config, record=True)
    d = res.decisions
    assert d is not None  # record=True always keeps them
    selected = np.asarray(d.selected)[:, 0, :] if config.reroute is not None and d.selected is not None else None
    return LayerDecisions(np.asarray(d.outcome)[:, 0, :], np.asarray(d.substitute)[:, 0, :], res, selected)


def replay(routing: Routing, config: SimConfig) -> SimResult:
    """Counters of ``config`` on a whole (all-layer) routing: the open loop, and the check that a
    closed-loop trace replays to the emulator's own counters."""
    return simulate(routing, config)


def combine(results: list[SimResult], layer_ids: tuple[int, ...]) -> SimResult:
    """One SimResult from per-layer replays (layer order), as one replay of all layers would give
    with per-layer pools."""
    first = results[0]
    return SimResult(
        config=first.config, layer_ids=tuple(layer_ids),
        counts=np.concatenate([r.counts for r in results], axis=0),
        mass=np.concatenate([r.mass for r in results]),
        token_counts=np.sum([r.token_counts for r in results], axis=0),
        token_mass=np.sum([r.token_mass for r in results], axis=0),
        counted_tokens=first.counted_tokens, slots_per_layer=first.slots_per_layer, n_experts=first.n_experts,
        trace_digest="", synthetic=False, replay_seconds=sum(r.replay_seconds for r in results),
        token_seconds=np.zeros_like(first.token_mass), token_stall=np.zeros_like(first.token_mass),
        step_members=first.step_members, step_decode=first.step_decode, warmup_steps=first.warmup_steps,
        displaced=np.concatenate([_zeros(r.displaced, 1) for r in results]),
        token_displaced=np.sum([_zeros(r.token_displaced, len(r.token_mass)) for r in results], axis=0),
    )


def _zeros(a: np.ndarray | None, n: int) -> np.ndarray:
    return np.zeros(n) if a is None or len(a) != n else np.asarray(a, dtype=np.float64)
