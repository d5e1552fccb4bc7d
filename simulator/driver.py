"""The public replay entry point: validate, build the kernel's arguments, run the kernel."""

from __future__ import annotations

import os
import time

import numpy as np

from moesim.errors import MoesimError
from moesim.policies import registry
from moesim.simulator import kernels
from moesim.simulator.args import NO_MEMBERS, Out, Steps, build, policy_state, step_scores, variant_of
from moesim.simulator.config import SimConfig
from moesim.simulator.counters import N_COUNTERS
from moesim.simulator.result import Decisions, SimResult, TimedSums
from moesim.traces.meta import TraceMeta
from moesim.traces.reader import TraceFile
from moesim.traces.routing import Routing, load_routing
from moesim.traces.stream import DecodedStore, decoded_bytes


def simulate(routing: Routing | DecodedStore | str | os.PathLike, config: SimConfig | None = None, *, cost=None,
             record: bool = False, stream: bool | None = None, chunk_tokens: int | None = None, tokens: bool = True,
             generic: bool = False, **kwargs) -> SimResult:
    """Replay ``routing`` (a decoded trace, a streamed traces.stream.DecodedStore, or a path) under one
    policy config.

    ``simulate(r, SimConfig(eviction="lru", miss="threshold:0.15", budget=0.25))`` or
    ``simulate(r, eviction="lru", miss="fetch-all", slots=16)``. With ``cost`` (a
    ``moesim.costmodel.timing.CostParams``) the replay keeps a clock: it prices every
    step, background copies occupy the host-to-GPU link and are admitted when they
    complete, and host RAM is a second (LRU) tier in front of NVMe. Without it, copies
    take no time (admitted at the layer's next step) and every expert is in host RAM.
    ``record=True`` keeps every request's outcome and substitute (``SimResult.decisions``).

    ``stream``: replay a chunk of tokens at a time (``chunk_tokens``, default MOESIM_STREAM_TOKENS or
    about 32 MB of decoded arrays a chunk) with the cache state carried across chunks, so memory does
    not grow with the trace. None (default): a path is streamed when decoding it whole would take more
    than MOESIM_STREAM_MB (default 512) MB; a Routing replays in memory. ``tokens=False`` keeps no
    per-token series (a streamed replay then holds nothing of size T but the token keys). ``generic``:
    replay on the kernel that serves every config (a sweep's; simulator/kernels.py), same counts. A config with
    ``speculative`` = G replays steps that verify G + 1 tokens per sequence (simulator/speculative.py)."""
    if config is None:
        try:
            config = SimConfig(**kwargs)
        except TypeError as exc:
            raise MoesimError(f"bad simulation option ({exc})") from None
    elif kwargs:
        raise MoesimError("give either a SimConfig or keyword options, not both")
    if config.speculative:
        return _simulate_speculative(routing, config, cost, record, stream)
    if isinstance(routing, DecodedStore):
        return _simulate_stream(routing, config, cost, record, chunk_tokens, tokens, generic)
    if not isinstance(routing, Routing):
        tf = TraceFile(routing)
        if stream or (stream is None and should_stream(tf)):
            with DecodedStore.from_file(tf, candidates=config.substitutes or config.reroute is not None,
                                        logits=config.reroute is not None) as store:
                return _simulate_stream(store, config, cost, record, chunk_tokens, tokens, generic)
        routing = load_routing(tf)
    elif stream:
        with DecodedStore.from_routing(routing) as store:
            return _simulate_stream(store, config, cost, record, chunk_tokens, tokens, generic)
    _check_warmup(config, routing.n_tokens)
    prep = build(routing, config, cost, record, generic)
    kernels.ensure((prep.variant,))
    t0 = time.perf_counter()
    kernels.run(prep.variant, prep.args)
    seconds = time.perf_counter() - t0
    out = prep.args.out
    members = prep.members
    members_per_step = np.ones(prep.run.n_tokens, np.int64) if members is None else (members >= 0).sum(axis=1)
    result = SimResult(
        config=config, layer_ids=tuple(routing.meta.moe_layers), counts=out.layer_counts, mass=out.layer_mass,
        token_counts=out.tok_counts.T, token_mass=out.tok_mass,
        counted_tokens=int(members_per_step[prep.warmup_steps:].sum()), slots_per_layer=prep.slots,
        n_experts=routing.n_experts, trace_digest=routing.digest, synthetic=routing.synthetic,
        replay_seconds=seconds, token_seconds=out.tok_seconds, token_stall=out.tok_stall,
        displaced=out.layer_displaced, token_displaced=out.tok_displaced,
        step_members=members_per_step, step_decode=prep.run.phase == 1, warmup_steps=prep.warmup_steps,
        decisions=Decisions(out.outcome, out.substitute, out.selected) if record else None,
    )
    if not tokens:
        _drop_series(result)
    if cost is not None:
        result.attach_timing(cost, ram_cap=prep.ram_cap if prep.ram_cap >= 0 else None)
    return result


def _simulate_speculative(routing, config: SimConfig, cost, record: bool, stream: bool | None) -> SimResult:
    """Speculative steps (simulator/speculative.py): each verifies G + 1 tokens per sequence, in memory."""
    from moesim.simulator.speculative import simulate_speculative

    if stream or isinstance(routing, DecodedStore):
        raise MoesimError("--speculative replays in memory only: use --no-stream, or a shorter trace")
    if not isinstance(routing, Routing):
        routing = load_routing(routing)
    res = simulate_speculative(routing, config, config.speculative, config.accept, cost=cost)
    if not record:
        res.decisions = None
    return res


def should_stream(tf: TraceFile) -> bool:
    """Decoding the whole trace would take more than MOESIM_STREAM_MB (default 512) MB."""
    raw = os.environ.get("MOESIM_STREAM_MB", "").strip()
    try:
        limit = float(raw) if raw else 512.0
    except ValueError:
        raise MoesimError(f"MOESIM_STREAM_MB must be a number of megabytes, got {raw!r}") from None
    return not tf.meta.frequency_only and decoded_bytes(tf.meta, tf.num_rows) > limit * 1e6


def _check_warmup(config: SimConfig, n_tokens: int) -> None:
    if config.warmup_tokens >= n_tokens:
        raise MoesimError(f"warmup_tokens={config.warmup_tokens} leaves none of the trace's "
                          f"{n_tokens} tokens to count")


def _drop_series(result: SimResult) -> None:
    """Keep the timing sums, drop the O(T) per-token series."""
    sums = TimedSums()
    counted = np.arange(len(result.token_seconds)) >= result.warmup_steps
    sums.add(result.token_counts, result.token_seconds, result.token_stall, result.step_members,
             result.step_decode, counted)
    result.sums = sums
    result.token_counts = np.zeros((0, N_COUNTERS), np.int64)
    result.token_mass = result.token_seconds = result.token_stall = np.zeros(0)
    result.step_members = np.zeros(0, np.int64)
    result.step_decode = np.zeros(0, np.bool_)


def _simulate_stream(store: DecodedStore, config: SimConfig, cost, record: bool, chunk_tokens: int | None,
                     tokens: bool, generic: bool = False) -> SimResult:
    """Replay a stored trace a chunk of tokens at a time, the state carried from chunk to chunk."""
    if record:
        raise MoesimError("the decision record (record=True) needs an in-memory replay (stream=False)")
    if config.batch > 1:
        raise MoesimError("--batch replays in memory only; this trace is streamed (too large to decode whole, "
                          "or --stream): use --no-stream, or a shorter trace")
    if config.prefetch == "lookahead":
        raise MoesimError("--prefetch lookahead replays in memory only; this trace is streamed (too large to decode "
                          "whole, or --stream): use --no-stream, or a shorter trace")
    T, L = store.n_tokens, store.n_layers
    _check_warmup(config, T)
    no_look = np.zeros((0, 0, 0), np.int16)
    no_scores = np.zeros((0, 0, 0), np.float32)
    policy, setup, state, slots, ram_cap = policy_state(store, config, cost, config.warmup_tokens)
    ev = registry.get(config.eviction_name)
    n = store.chunk_tokens(chunk_tokens)
    first = store.first_requests() if ev.uses_next_request else np.zeros(L * store.n_experts, np.int64)
    layer_counts, layer_mass = np.zeros((L, N_COUNTERS), np.int64), np.zeros(L, np.float64)
    no_rec = np.full((0, 0, 0), -1, np.int16)
    bufs = Out(layer_counts=layer_counts, layer_mass=layer_mass, tok_counts=np.zeros((N_COUNTERS, 0), np.int64),
               tok_mass=np.zeros(n), tok_seconds=np.zeros(n), tok_stall=np.zeros(n),
               outcome=np.full((0, 0, 0), -1, np.int8), substitute=no_rec, selected=no_rec,
               layer_displaced=np.zeros(L, np.float64), tok_displaced=np.zeros(n))
    keep = tokens
    series = {name: np.zeros((T, N_COUNTERS) if name == "tok_counts" else T, np.int64 if name == "tok_counts"
                             else np.float64)
              for name in ("tok_counts", "tok_mass", "tok_seconds", "tok_stall", "tok_displaced")} if keep else {}
    decode = store.phase == 1
    ones = np.ones(n, np.int64)
    sums = TimedSums()
    v = variant_of(config, cost, generic=generic)
    kernels.ensure((v,))
    seconds = 0.0
    rerouting = config.reroute is not None
    what: tuple[str, ...] = ("sel", "w", "cand") if config.substitutes or rerouting else ("sel", "w")
    what += ("logits",) if rerouting else ()
    for c in store.chunks(n, what=what, next_req=ev.uses_next_request):
        m = len(c.seq)
        cand, logits, score = step_scores(c, config, c.sel, c.cand, store.meta) if rerouting else \
            (c.cand, no_scores, no_scores)
        steps = Steps(sel=c.sel, w=c.w, wm=c.w, cand=cand, next_req=c.next_req, first_req=first, tok_seq=c.seq,
                      t0=c.t0, look=no_look, logits=logits, score=score, **NO_MEMBERS)
        # the kernel adds into tok_counts: fresh zeros a chunk (counter-major; untouched pages cost nothing)
        bufs.tok_displaced[:m] = 0.0
        out = bufs._replace(tok_counts=np.zeros((N_COUNTERS, m), np.int64), tok_mass=bufs.tok_mass[:m],
                            tok_seconds=bufs.tok_seconds[:m], tok_stall=bufs.tok_stall[:m],
                            tok_displaced=bufs.tok_displaced[:m])
        t1 = time.perf_counter()
        kernels.run(v, (steps, policy, setup, state, out))
        seconds += time.perf_counter() - t1
        counted = np.arange(c.t0, c.t0 + m) >= config.warmup_tokens
        sums.add(out.tok_counts.T, out.tok_seconds, out.tok_stall, ones[:m], decode[c.t0:c.t0 + m], counted)
        for name, arr in series.items():
            arr[c.t0:c.t0 + m] = out.tok_counts.T if name == "tok_counts" else getattr(out, name)
    empty = np.zeros(0)
    result = SimResult(
        config=config, layer_ids=tuple(store.meta.moe_layers), counts=layer_counts, mass=layer_mass,
        token_counts=series.get("tok_counts", np.zeros((0, N_COUNTERS), np.int64)),
        token_mass=series.get("tok_mass", empty), counted_tokens=T - config.warmup_tokens, slots_per_layer=slots,
        n_experts=store.n_experts, trace_digest=store.digest, synthetic=store.synthetic, replay_seconds=seconds,
        token_seconds=series.get("tok_seconds", empty), token_stall=series.get("tok_stall", empty),
        displaced=bufs.layer_displaced, token_displaced=series.get("tok_displaced", empty),
        step_members=np.ones(T, np.int64) if keep else np.zeros(0, np.int64),
        step_decode=decode if keep else np.zeros(0, np.bool_), warmup_steps=config.warmup_tokens, sums=sums,
        extra={"streamed": {"chunk_tokens": n, "chunks": -(-T // n)}},
    )
    if cost is not None:
        result.attach_timing(cost, ram_cap=ram_cap if ram_cap >= 0 else None)
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
