"""The public replay entry point: validate, convert to plain arrays, run the kernel."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from moesim.errors import MoesimError
from moesim.policies import miss as miss_mod
from moesim.policies.registry import eviction_code, move_on_access, structure_code
from moesim.simulator import kernel
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
        c.update(
            sel=sel,
            w=np.ascontiguousarray(routing.w, dtype=np.float32),
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
    return kernel.request_counts(a["sel"], routing.n_experts, T).reshape(routing.n_layers, routing.n_experts)


def most_requested(counts: np.ndarray, slots: int, allocation: str) -> np.ndarray:
    """Object ids (layer * E + expert) of the most requested experts: the top ``slots``
    of each layer, or the top slots * L overall for a global pool. Equal counts: lower
    layer, then lower expert id first. Returned most popular first."""
    L, E = counts.shape
    flat = counts.reshape(-1)
    if allocation == "global":
        order = np.lexsort((np.arange(L * E), -flat))
        return order[: slots * L].astype(np.int64)
    out = []
    for l in range(L):
        c = counts[l]
        order = np.lexsort((np.arange(E), -c))[:slots]
        out.append(l * E + order)
    return np.concatenate(out).astype(np.int64)


def _pools(config: SimConfig, L: int, slots: int) -> tuple[np.ndarray, np.ndarray]:
    if config.allocation == "global":
        return np.zeros(L, np.int64), np.array([slots * L], np.int64)
    return np.arange(L, dtype=np.int64), np.full(L, slots, np.int64)


def simulate(routing: Routing | str | os.PathLike, config: SimConfig | None = None, **kwargs) -> SimResult:
    """Replay ``routing`` (a decoded trace or a path) under one policy config.

    ``simulate(r, SimConfig(eviction="lru", miss="threshold:0.15", budget=0.25))`` or
    ``simulate(r, eviction="lru", miss="fetch-all", slots=16)``."""
    if config is None:
        try:
            config = SimConfig(**kwargs)
        except TypeError as exc:
            raise MoesimError(f"bad simulation option ({exc})") from None
    elif kwargs:
        raise MoesimError("give either a SimConfig or keyword options, not both")
    if isinstance(routing, (str, Path)):
        routing = load_routing(routing)
    a = arrays(routing)
    T, L, E = routing.n_tokens, routing.n_layers, routing.n_experts
    slots = config.slots_per_layer(E)
    if config.warmup_tokens >= T:
        raise MoesimError(f"warmup_tokens={config.warmup_tokens} leaves none of the trace's {T} tokens to count")
    pool_of_layer, pool_cap = _pools(config, L, slots)

    name, param = config.eviction_name, config.eviction_param
    code = eviction_code(name)
    pinned = np.zeros(L * E, np.bool_)
    warm_objs = np.zeros(0, np.int64)
    if name == "static":
        prefix = T if param is None else int(param)
        pinned[most_requested(request_counts(routing, prefix), slots, config.allocation)] = True
    elif config.warm:
        # least popular first, so the most popular experts are the most recently inserted
        warm_objs = most_requested(request_counts(routing), slots, config.allocation)[::-1].copy()
        if config.allocation == "per-layer":
            warm_objs = np.concatenate([warm_objs[warm_objs // E == l] for l in range(L)])
    half_life = float(param) if (name == "freq" and param is not None) else 0.0
    miss_code = miss_mod.MISS_POLICIES[config.miss_name][0]

    counts = np.zeros((L, kernel.N_COUNTERS), np.int64)
    mass = np.zeros(L, np.float64)
    tok_counts = np.zeros((T, kernel.N_COUNTERS), np.int64)
    tok_mass = np.zeros(T, np.float64)
    args = (a["sel"], a["w"], a["cand"], a["next_tick"], a["first_tick"], a["tok_seq"],
            code, structure_code(code), move_on_access(code), miss_code, float(config.theta),
            float(config.admit or 0.0), pool_of_layer, pinned, warm_objs, half_life,
            config.warmup_tokens, bool(config.reset_per_sequence), *new_state(pool_cap, L, E, routing.top_k), counts, mass, tok_counts, tok_mass)
    ensure_compiled()
    t0 = time.perf_counter()
    kernel.replay(*args)
    seconds = time.perf_counter() - t0
    return SimResult(
        config=config, layer_ids=tuple(routing.meta.moe_layers), counts=counts, mass=mass,
        token_counts=tok_counts, token_mass=tok_mass, counted_tokens=T - config.warmup_tokens,
        slots_per_layer=slots, n_experts=E, trace_digest=routing.digest, synthetic=routing.synthetic,
        replay_seconds=seconds,
    )


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
    kernel.replay(sel, np.ones((1, 1, 1), np.float32), np.zeros((1, 1, 1), np.int16), nxt, first,
                  np.zeros(1, np.int32), 0, 0, True, 0, 0.0, 0.0, np.zeros(1, np.int64), np.zeros(1, np.bool_),
                  np.zeros(0, np.int64), 0.0, 0, False, *new_state(np.ones(1, np.int64), 1, 1, 1),
                  np.zeros((1, kernel.N_COUNTERS), np.int64), np.zeros(1), np.zeros((1, kernel.N_COUNTERS), np.int64),
                  np.zeros(1))
    _compiled = True
