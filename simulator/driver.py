"""The public replay entry point: validate, build the kernel's arguments, run the kernel."""

from __future__ import annotations

import os
import time

import numpy as np

from moesim.errors import MoesimError
from moesim.simulator import kernel
from moesim.simulator.args import build
from moesim.simulator.config import SimConfig
from moesim.simulator.result import Decisions, SimResult
from moesim.traces.meta import TraceMeta
from moesim.traces.routing import Routing, load_routing


def simulate(routing: Routing | str | os.PathLike, config: SimConfig | None = None, *, cost=None,
             record: bool = False, **kwargs) -> SimResult:
    """Replay ``routing`` (a decoded trace or a path) under one policy config.

    ``simulate(r, SimConfig(eviction="lru", miss="threshold:0.15", budget=0.25))`` or
    ``simulate(r, eviction="lru", miss="fetch-all", slots=16)``. With ``cost`` (a
    ``moesim.costmodel.timing.CostParams``) the replay keeps a clock: it prices every
    step, background copies occupy the host-to-GPU link and are admitted when they
    complete, and host RAM is a second (LRU) tier in front of NVMe. Without it, copies
    take no time (admitted at the layer's next step) and every expert is in host RAM.
    ``record=True`` keeps every request's outcome and substitute (``SimResult.decisions``)."""
    if config is None:
        try:
            config = SimConfig(**kwargs)
        except TypeError as exc:
            raise MoesimError(f"bad simulation option ({exc})") from None
    elif kwargs:
        raise MoesimError("give either a SimConfig or keyword options, not both")
    if not isinstance(routing, Routing):
        routing = load_routing(routing)
    if config.warmup_tokens >= routing.n_tokens:
        raise MoesimError(f"warmup_tokens={config.warmup_tokens} leaves none of the trace's "
                          f"{routing.n_tokens} tokens to count")
    prep = build(routing, config, cost, record)
    ensure_compiled()
    t0 = time.perf_counter()
    kernel.replay(*prep.args)
    seconds = time.perf_counter() - t0
    out = prep.args.out
    members = prep.members
    members_per_step = np.ones(prep.run.n_tokens, np.int64) if members is None else (members >= 0).sum(axis=1)
    result = SimResult(
        config=config, layer_ids=tuple(routing.meta.moe_layers), counts=out.layer_counts, mass=out.layer_mass,
        token_counts=out.tok_counts, token_mass=out.tok_mass,
        counted_tokens=int(members_per_step[prep.warmup_steps:].sum()), slots_per_layer=prep.slots,
        n_experts=routing.n_experts, trace_digest=routing.digest, synthetic=routing.synthetic,
        replay_seconds=seconds, token_seconds=out.tok_seconds, token_stall=out.tok_stall,
        step_members=members_per_step, step_decode=prep.run.phase == 1, warmup_steps=prep.warmup_steps,
        decisions=Decisions(out.outcome, out.substitute) if record else None,
    )
    if cost is not None:
        result.attach_timing(cost, ram_cap=prep.ram_cap if prep.ram_cap >= 0 else None)
    return result


def tiny_routing(n_experts: int = 2, top_k: int = 1) -> Routing:
    """A one-token, one-layer routing: the smallest problem with the real argument types."""
    meta = TraceMeta(model_id="warm-up", family="none", n_experts=n_experts, top_k=top_k, moe_layers=(0,),
                     layout="sparse", n_candidates=n_experts, synthetic=True)
    sel = np.arange(top_k, dtype=np.int16).reshape(1, 1, top_k)
    return Routing(meta=meta, seq=np.zeros(1, np.int32), pos=np.zeros(1, np.int32), phase=np.ones(1, np.int8),
                   domain=np.full(1, -1, np.int16), domain_names=[], token=None, sel=sel,
                   w=np.full((1, 1, top_k), 1.0 / top_k, np.float32),
                   cand=np.arange(n_experts, dtype=np.int16).reshape(1, 1, n_experts), digest="warm-up")


_compiled = False


def ensure_compiled() -> None:
    """Compile (or load from the on-disk cache) the kernel once with the real argument types, so
    replay timings never include compilation. The arguments come from the same builder."""
    global _compiled
    if _compiled:
        return
    kernel.replay(*build(tiny_routing(), SimConfig(slots=1), record=False).args)
    _compiled = True
