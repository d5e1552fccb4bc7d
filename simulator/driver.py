"""The public replay entry point: validate, convert to plain arrays, run the kernel."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moesim.errors import MoesimError
from moesim.policies import miss as miss_mod
from moesim.policies.registry import STRUCTURES, eviction_code, module, move_on_access, structure_code, uses
from moesim.policies.static import most_requested
from moesim.simulator import kernel
from moesim.simulator.batch import batch_routing
from moesim.simulator.config import SimConfig
from moesim.simulator.result import SimResult
from moesim.simulator.structures import new_state
from moesim.traces.routing import Routing, load_routing


def arrays(routing: Routing) -> dict:
    """The kernel's view of a trace, computed once per Routing and shared by every config."""
    c = routing._cache
    if "next_tick" not in c:
        sel = np.ascontiguousarray(routing.sel, dtype=np.int16)
        nxt, first = kernel.next_use_ticks(sel, routing.n_experts)
        w = np.ascontiguousarray(routing.w, dtype=np.float32)
        c.update(
            sel=sel, w=w, wm=w,
            cand=np.ascontiguousarray(routing.cand, dtype=np.int16),
            next_tick=nxt,
            first_tick=first,
            tok_seq=np.ascontiguousarray(routing.seq, dtype=np.int32),
        )
    return c


def request_counts(routing: Routing, n_tokens: int | None = None) -> np.ndarray:
    """Router requests per (layer, expert) over the first n_tokens (default all), shape [L, E]."""
    a = arrays(routing)
    T = routing.n_tokens if n_tokens is None else min(int(n_tokens), routing.n_tokens)
    key = ("request_counts", T)  # every config of a sweep asks for the whole trace's counts
    if key not in routing._cache:
        counts = kernel.request_counts(a["sel"], routing.n_experts, T)
        routing._cache[key] = counts.reshape(routing.n_layers, routing.n_experts)
    return routing._cache[key]


def _pools(config: SimConfig, L: int, slots: int) -> tuple[np.ndarray, np.ndarray]:
    if config.allocation == "global":
        return np.zeros(L, np.int64), np.array([slots * L], np.int64)
    return np.arange(L, dtype=np.int64), np.full(L, slots, np.int64)


def kernel_costs(cost, n_layers: int, batch: int) -> np.ndarray:
    """The kernel's seconds-per-operation vector from a CostParams (zeros without one)."""
    c = np.zeros(kernel.N_COSTS, np.float64)
    if cost is None:
        return c
    c[kernel.S_DENSE_LAYER] = (cost.s_dense + (batch - 1) * cost.s_dense_per_seq) / n_layers
    c[kernel.S_EXPERT_VRAM] = cost.s_expert_vram
    c[kernel.S_FETCH_RAM] = cost.s_fetch_ram
    c[kernel.S_FETCH_NVME] = cost.s_fetch_nvme
    c[kernel.S_CPU_RAM] = cost.s_expert_cpu
    c[kernel.S_CPU_NVME] = cost.s_expert_cpu_nvme
    c[kernel.S_COPY_RAM] = cost.s_copy_link
    c[kernel.S_COPY_NVME] = cost.s_copy_nvme
    return c


def simulate(routing: Routing | str | os.PathLike, config: SimConfig | None = None, *, cost=None,
             record: bool = False, **kwargs) -> SimResult:
    """Replay ``routing`` (a decoded trace or a path) under one policy config.

    ``simulate(r, SimConfig(eviction="lru", miss="threshold:0.15", budget=0.25))`` or
    ``simulate(r, eviction="lru", miss="fetch-all", slots=16)``. With ``cost`` (a
    ``moesim.costmodel.timing.CostParams``) the replay keeps a clock: it prices every
    step, background copies occupy the host-to-GPU link and are admitted when they
    complete, and host RAM is a second (LRU) tier in front of NVMe. Without it, copies
    take no time (admitted at the layer's next step) and every expert is in host RAM.
    ``record``: the result's ``decisions`` holds each request's outcome (``outcome`` int8
    [T, L, k], codes policies.miss.OUTCOME_*, -1 for padding) and the expert run in place of a
    substituted one (``substitute`` int16 [T, L, k], -1 otherwise)."""
    if config is None:
        try:
            config = SimConfig(**kwargs)
        except TypeError as exc:
            raise MoesimError(f"bad simulation option ({exc})") from None
    elif kwargs:
        raise MoesimError("give either a SimConfig or keyword options, not both")
    if isinstance(routing, (str, Path)):
        routing = load_routing(routing)
    T0, L, E = routing.n_tokens, routing.n_layers, routing.n_experts
    if config.warmup_tokens >= T0:
        raise MoesimError(f"warmup_tokens={config.warmup_tokens} leaves none of the trace's {T0} tokens to count")
    slots = config.slots_per_layer(E)
    pool_of_layer, pool_cap = _pools(config, L, slots)
    counts_all = request_counts(routing)

    run = routing
    members = None
    wm = None
    if config.batch > 1:
        run, wm, members = batch_routing(routing, config.batch)
    a = arrays(run)
    if wm is None:
        wm = a["wm"]
    T = run.n_tokens
    warmup = config.warmup_tokens if members is None else int((members.max(axis=1) < config.warmup_tokens).sum())

    name, param = config.eviction_name, config.eviction_param
    code = eviction_code(name)
    pinned = np.zeros(L * E, np.bool_)
    warm_objs = np.zeros(0, np.int64)
    if structure_code(code) == STRUCTURES["none"]:
        prefix_counts = counts_all if param is None else request_counts(routing, int(param))
        pinned[module(code).pinned(prefix_counts, slots, config.allocation)] = True
    elif config.warm:
        # least popular first, so the most popular experts are the most recently inserted
        warm_objs = most_requested(counts_all, slots, config.allocation)[::-1].copy()
        if config.allocation == "per-layer":
            warm_objs = np.concatenate([warm_objs[warm_objs // E == l] for l in range(L)])
    ram_cap, ram_warm = _ram_tier(cost, counts_all)
    half_life = float(param) if (name == "freq" and param is not None) else 0.0
    miss_code = miss_mod.MISS_POLICIES[config.miss_name][0]

    counts = np.zeros((L, kernel.N_COUNTERS), np.int64)
    mass = np.zeros(L, np.float64)
    tok_counts = np.zeros((T, kernel.N_COUNTERS), np.int64)
    tok_mass = np.zeros(T, np.float64)
    tok_seconds = np.zeros(T, np.float64)
    tok_stall = np.zeros(T, np.float64)
    rec_shape = (T, L, run.top_k) if record else (0, 0, 0)
    rec_outcome = np.full(rec_shape, -1, np.int8)
    rec_sub = np.full(rec_shape, -1, np.int16)
    args = (a["sel"], a["w"], wm, a["cand"], a["next_tick"], a["first_tick"], a["tok_seq"],
            code, structure_code(code), move_on_access(code), uses(code, "SCORE"), uses(code, "NEXT_REQUEST"),
            miss_code, float(config.theta),
            float(config.admit or 0.0), pool_of_layer, pinned, warm_objs, ram_warm,
            kernel_costs(cost, L, config.batch), half_life, warmup, bool(config.reset_per_sequence),
            *new_state(pool_cap, L, E, run.top_k, ram_cap),
            counts, mass, tok_counts, tok_mass, tok_seconds, tok_stall, bool(record), rec_outcome, rec_sub)
    ensure_compiled()
    t0 = time.perf_counter()
    kernel.replay(*args)
    seconds = time.perf_counter() - t0
    if members is None:
        members_per_step = np.ones(T, np.int64)
    else:
        members_per_step = (members >= 0).sum(axis=1)
    result = SimResult(
        config=config, layer_ids=tuple(routing.meta.moe_layers), counts=counts, mass=mass,
        token_counts=tok_counts, token_mass=tok_mass, counted_tokens=int(members_per_step[warmup:].sum()),
        slots_per_layer=slots, n_experts=E, trace_digest=routing.digest, synthetic=routing.synthetic,
        replay_seconds=seconds, token_seconds=tok_seconds, token_stall=tok_stall,
        step_members=members_per_step, step_decode=run.phase == 1, warmup_steps=warmup,
    )
    if record:
        result.decisions = Decisions(outcome=rec_outcome, substitute=rec_sub)
    if cost is not None:
        result.attach_timing(cost, ram_cap=max(ram_cap, 0) if ram_cap >= 0 else None)
    return result


@dataclass
class Decisions:
    """What the replay did with each request: ``outcome`` [T, L, k] (policies.miss.OUTCOME_*,
    -1 for padding) and ``substitute`` [T, L, k] (the expert run instead, -1 unless substituted)."""

    outcome: np.ndarray
    substitute: np.ndarray


def _ram_tier(cost, counts: np.ndarray) -> tuple[int, np.ndarray]:
    """Host-RAM tier capacity (-1: all experts fit) and its initial content: the most
    requested experts that fit, least popular first (a warm page cache)."""
    L, E = counts.shape
    if cost is None or cost.ram_expert_capacity >= L * E or cost.unified:
        return -1, np.zeros(0, np.int64)
    cap = int(cost.ram_expert_capacity)
    top = np.lexsort((np.arange(L * E), -counts.reshape(-1)))[:cap]
    return cap, top[::-1].astype(np.int64).copy()


_compiled = False


def ensure_compiled() -> None:
    """Compile (or load from the on-disk cache) the kernel on a one-request problem
    with the real argument types, so replay timings never include compilation."""
    global _compiled
    if _compiled:
        return
    sel = np.zeros((1, 1, 1), np.int16)
    nxt, first = kernel.next_use_ticks(sel, 1)
    kernel.request_counts(sel, 1, 1)
    w = np.ones((1, 1, 1), np.float32)
    kernel.replay(sel, w, w, np.zeros((1, 1, 1), np.int16), nxt, first,
                  np.zeros(1, np.int32), 0, 0, True, True, True, 0, 0.0, 0.0, np.zeros(1, np.int64),
                  np.zeros(1, np.bool_),
                  np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(kernel.N_COSTS), 0.0, 0, False,
                  *new_state(np.ones(1, np.int64), 1, 1, 1),
                  np.zeros((1, kernel.N_COUNTERS), np.int64), np.zeros(1), np.zeros((1, kernel.N_COUNTERS), np.int64),
                  np.zeros(1), np.zeros(1), np.zeros(1), False, np.zeros((0, 0, 0), np.int8),
                  np.zeros((0, 0, 0), np.int16))
    _compiled = True
