"""The replay kernels' arguments: five named groups, built by one function for the replay and for the
compile with the real argument types alike (``tiny_args``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from moesim.errors import MoesimError
from moesim.policies import miss as miss_mod
from moesim.policies import prefetch as prefetch_mod
from moesim.policies import registry
from moesim.policies import reroute as reroute_mod
from moesim.policies.static import most_requested
from moesim.policies.structures import N_FO, N_OB, new_pools
from moesim.simulator.batch import batch_routing
from moesim.simulator.config import SimConfig
from moesim.simulator.counters import (
    N_CLOCK,
    N_COSTS,
    N_COUNTERS,
    N_SCAL,
    S_COPY_NVME,
    S_COPY_RAM,
    S_CPU_HANDOFF,
    S_CPU_NVME,
    S_CPU_RAM,
    S_DENSE_LAYER,
    S_EXPERT_VRAM,
    S_FETCH_LOWBIT,
    S_FETCH_NVME,
    S_FETCH_RAM,
    S_LOWBIT_VRAM,
    S_ROUTER_SYNC,
    S_WRITEBACK,
)
from moesim.simulator.kernels import Variant, variant
from moesim.simulator.prefetch_state import N_PF_SCAL
from moesim.traces.routing import Routing


class Steps(NamedTuple):
    """The routing being replayed (a trace, or a batch's lock-step union of one)."""

    sel: np.ndarray        # [T, L, k] int16: selected experts in rank order; -1 pads a batch's union
    w: np.ndarray          # [T, L, k] float32: the weights the miss policy reads
    wm: np.ndarray         # [T, L, k] float32: the gate mass a substitution or drop loses
    cand: np.ndarray       # [T, L, M] int16: scored experts, best first (substitution candidates)
    next_req: np.ndarray   # [T, L, k] int64: tick of the same expert's next request (traces/derived.py)
    first_req: np.ndarray  # [L * E] int64: each expert's first request tick
    tok_seq: np.ndarray    # [T] int32: sequence of each step
    t0: int                # the index of the first of these steps in the whole replay (chunks of a stream)
    look: np.ndarray       # [T, L, k] int16: the lookahead column (Routing.lookahead) for --prefetch lookahead,
                           # else empty
    logits: np.ndarray     # [T, L, M] float32: the candidates' logits (Routing.logits) for a step policy, else empty
    score: np.ndarray      # [T, L, M] float32: their selection scores (the gating's; for a step policy, else empty)
                           # (a batched step policy: logits and scores of the tokens, indexed as tok_sel)
    members: np.ndarray    # [T, B] int64: a batched step policy's member tokens of each step (-1: ended), else empty
    tok_sel: np.ndarray    # [tokens, L, k] int16: ... the members' own selections, else empty
    tok_w: np.ndarray      # [tokens, L, k] float32: ... their gate weights, else empty
    tok_cand: np.ndarray   # [tokens, L, M] int16: ... their candidates, else empty


NO_MEMBERS: dict[str, np.ndarray] = dict(members=np.zeros((0, 0), np.int64), tok_sel=np.zeros((0, 0, 0), np.int16),
                  tok_w=np.zeros((0, 0, 0), np.float32), tok_cand=np.zeros((0, 0, 0), np.int16))


class Policy(NamedTuple):
    evict: int             # eviction code (policies/registry.py)
    prm: np.ndarray        # [kinds.N_PRM] float64: the eviction's parameters, then its structure kind and variant
    miss: int              # miss policy code (policies/miss.py)
    theta: float           # threshold:θ
    beta: float            # background admission threshold (0: none)
    warmup_tokens: int     # steps replayed but not counted in layer_counts
    reset_per_seq: bool    # empty the cache at each new sequence
    overlap: int           # policies.prefetch.OVERLAP_*: the clock's copy/compute overlap
    prefetch: int          # policies.prefetch code (NONE: no prefetch)
    pf_depth: int          # prefetch for the layer this many ahead (same token)
    step_pin: bool         # --step-pin: hits first, the step's experts not evicted by its misses, fetches together
    max_uploads: int       # at most this many fetched experts admitted per layer per step (0: no cap)
    uses_next: bool        # the eviction reads each expert's next request (policies/registry.py)
    uses_score: bool       # ... its decayed request score
    admits: bool           # False for a pinned placement: nothing is ever admitted
    pin_mode: int          # how --step-pin keeps the step's experts (simulator/step_pin.py MODE_*)
    cpu_overlap: bool      # the engine runs a step's CPU experts beside its GPU work (CostParams.cpu_overlap)
    step: int              # the step policy (policies/reroute.py code; NONE: the router's rows as they are)
    step_value: float      # its λ (bias) or J (keep)
    step_pool: int         # the candidates it considers
    step_resident: int     # what counts as resident (policies/reroute.py RESIDENT_*)
    step_window: int       # recent:W's W
    step_biased: bool      # the rerouted set's weights from the biased scores
    gating_sigmoid: bool   # the trace's gating is sigmoid (gate weights are normalized sigmoids, not softmax)
    admit_window: int      # --admission second-touch:W: a fetched expert is admitted only when requested within the
                           # last W requests of its pool (SimConfig.admit_window; 0: always admitted)


class Setup(NamedTuple):
    pool_of_layer: np.ndarray  # [L] int64: the VRAM pool of each layer
    pinned: np.ndarray         # [L * E] bool: resident from the start, never evicted
    warm_objs: np.ndarray      # int64: inserted at each reset, least popular first
    ram_warm: np.ndarray       # int64: the host-RAM tier's initial content, least recently used first
    cost: np.ndarray           # [N_COSTS] float64: seconds per operation (counters.COST_NAMES); zeros: no clock
    pf_succ: np.ndarray        # [L, E, S] int16: next-layer prefetch successors (policies/prefetch.py), or empty
    pf_cnt: np.ndarray         # [L, E, S] int64: their counts
    lowbit_res: np.ndarray     # [L * E] bool: a low-bit copy is resident in VRAM (--lowbit-share)
    pin_events: np.ndarray     # int64 [n, 3]: a re-pinning placement's (token, object, -1 out | +1 in), by token,
                               # outs first (simulator/pin_events.py); empty for a fixed placement


class State(NamedTuple):
    objs: np.ndarray        # int32 [L * E, N_OB] (policies/structures.py)
    objf: np.ndarray        # float64 [L * E, N_FO]
    pools: np.ndarray       # int64 [pools + 1, N_PO]; the last row is the host-RAM tier
    heap: np.ndarray        # float64 [sum of capacities, 3]
    queue: np.ndarray       # int64 [L, E]: per-layer FIFO of background copies (objects) ...
    queue_t: np.ndarray     # float64 [L, E]: ... and their completion times
    queue_hl: np.ndarray    # int64 [L, 2]: queue head and length
    clock: np.ndarray       # float64 [counters.N_CLOCK]: the clock carried between kernel calls
    scal: np.ndarray        # int64 [counters.N_SCAL]: the other scalars carried between kernel calls
    pf: np.ndarray          # int32 [L * E] (or empty without prefetch): simulator/prefetch_state.py PF_* states
    pf_t: np.ndarray        # float64 [L * E]: completion time of an expert's prefetch in flight
    pf_prev: np.ndarray     # int16 [L, k]: prev-token prefetch: the last selection of each layer
    pf_scal: np.ndarray     # int64 [prefetch_state.N_PF_SCAL]: its token's sequence, and whether it is set
    pf_score: np.ndarray    # float64 [E]: next-layer prefetch scratch (zero between steps)
    pf_pick: np.ndarray     # int64 [E]: the predicted experts of a step (scratch)
    spin: np.ndarray        # float64 [L * E, 2]: --step-pin's step each expert is pinned at, its saved priority
    row: np.ndarray         # int16 [k]: the ext kernel's step row (the step's selection, as a step policy leaves
    row_w: np.ndarray       # float32 [k]  it), its weights the miss policy reads
    row_wm: np.ndarray      # float32 [k]  and the gate mass a substitution or drop loses,
    row_next: np.ndarray    # int64 [k]    and each request's next request tick (-1: an expert rerouted in)
    last_req: np.ndarray    # int64 [L * E]: the token each expert was last requested at (--reroute-resident recent)
    rr_b: np.ndarray        # float64 [M]: rerouting's scratch (residency of the pool's candidates)
    rr_pos: np.ndarray      # int64 [k]: ... the chosen candidates
    rr_w: np.ndarray        # float64 [k]: ... their weights
    rr_ord: np.ndarray      # int64 [k]: ... the rerouted row's candidates in rank order
    rr_ow: np.ndarray       # float64 [k]: ... and their weights
    rr_acc: np.ndarray      # float64 [3, E]: a batched step policy's union (best rank or -1, largest and summed
                            # weight), else [3, 0]
    rr_ids: np.ndarray      # int64 [K]: ... its experts
    rr_keys: np.ndarray     # int64 [K]: ... their rank keys


class Out(NamedTuple):
    layer_counts: np.ndarray  # int64 [L, N_COUNTERS], counted tokens only
    layer_mass: np.ndarray    # float64 [L]
    tok_counts: np.ndarray    # int64 [N_COUNTERS, T] (counter-major), every step (of the chunk, when streamed);
    #                           zeros: the kernel adds into it
    tok_mass: np.ndarray      # float64 [T], zeros (the plain kernels, which lose no mass, leave them)
    tok_seconds: np.ndarray   # float64 [T], zeros: simulated seconds per step (an untimed replay leaves them)
    tok_stall: np.ndarray     # float64 [T], zeros: seconds a step waited for the link (untimed: left)
    outcome: np.ndarray       # int8 [T, L, k] (policies/miss.py OUTCOME_*), or empty: no decision record
    substitute: np.ndarray    # int16 [T, L, k]: the expert run in place of a substituted request, else -1
    selected: np.ndarray      # int16 [T, L, k]: with a decision record, each step's row (rerouted or not)
    layer_displaced: np.ndarray  # float64 [L]: the router's gate mass rerouted away (counted tokens only)
    tok_displaced: np.ndarray    # float64 [T], zeros: ... per step (written by a rerouted replay)


class KernelArgs(NamedTuple):
    steps: Steps
    policy: Policy
    setup: Setup
    state: State
    out: Out


@dataclass
class Prepared:
    """A replay ready to run: the kernel's arguments and what the result needs to interpret them."""

    args: KernelArgs
    variant: Variant           # the kernel that replays it (simulator/kernels.py)
    run: Routing               # the routing replayed (the batch union when batch > 1)
    members: np.ndarray | None  # [steps, batch] token indices of a batched replay
    warmup_steps: int
    slots: int
    ram_cap: int               # host-RAM tier size in experts (-1: every expert fits)


def kernel_costs(cost: Any, n_layers: int, batch: int, lowbit: str | None = None) -> np.ndarray:
    """The kernel's seconds-per-operation vector from a CostParams (zeros without one); ``lowbit``: the
    quantization lowbit:Q fetches."""
    c = np.zeros(N_COSTS, np.float64)
    if cost is None:
        return c
    if lowbit is not None:
        c[S_FETCH_LOWBIT], c[S_LOWBIT_VRAM] = cost.lowbit_seconds(lowbit)
    c[S_DENSE_LAYER] = (cost.s_dense + (batch - 1) * cost.s_dense_per_seq) / n_layers
    c[S_EXPERT_VRAM] = cost.s_expert_vram
    c[S_FETCH_RAM] = cost.s_fetch_ram
    c[S_FETCH_NVME] = cost.s_fetch_nvme
    c[S_CPU_RAM] = cost.s_expert_cpu
    c[S_CPU_NVME] = cost.s_expert_cpu_nvme
    c[S_COPY_RAM] = cost.s_copy_link
    c[S_COPY_NVME] = cost.s_copy_nvme
    c[S_CPU_HANDOFF] = cost.s_cpu_handoff
    c[S_WRITEBACK] = cost.s_writeback
    c[S_ROUTER_SYNC] = getattr(cost, "s_router_sync", 0.0)
    return c


def ram_tier(cost: Any, counts: np.ndarray) -> tuple[int, np.ndarray]:
    """Host-RAM tier capacity (-1: all experts fit) and its initial content: the most
    requested experts that fit, least popular first (a warm page cache)."""
    L, E = counts.shape
    if cost is None or cost.ram_expert_capacity >= L * E or cost.unified:
        return -1, np.zeros(0, np.int64)
    cap = int(cost.ram_expert_capacity)
    top = np.lexsort((np.arange(L * E), -counts.reshape(-1)))[:cap]
    return cap, top[::-1].astype(np.int64).copy()


def build(routing: Routing, config: SimConfig, cost: Any = None, record: bool = False, generic: bool = False
          ) -> Prepared:
    """Everything the kernel needs to replay ``routing`` under ``config`` (priced by ``cost``, a
    CostParams, or unclocked); ``record`` allocates the per-request decision record; ``generic`` runs it on
    the one kernel of every config (simulator/kernels.py)."""
    L = routing.n_layers
    run, wm, members = routing, None, None
    if config.batch > 1:
        run, wm, members = batch_routing(routing, config.batch)
    sel = np.ascontiguousarray(run.sel, dtype=np.int16)
    w = np.ascontiguousarray(run.w, dtype=np.float32)
    wm = w if wm is None else wm
    T, _, k = sel.shape
    warmup = config.warmup_tokens if members is None else int((members.max(axis=1) < config.warmup_tokens).sum())
    next_req, first_req = run.next_requests()
    look = np.zeros((0, 0, 0), np.int16)
    if config.prefetch == "lookahead":
        look = lookahead_steps(run, config)
    cand = np.ascontiguousarray(run.cand, dtype=np.int16)
    batched = members is not None and config.reroute is not None  # each member rerouted on its own
    tok = routing if batched else run
    tok_cand, logits, score = step_scores(tok, config, np.ascontiguousarray(tok.sel, dtype=np.int16),
                                          np.ascontiguousarray(tok.cand, dtype=np.int16))
    if not batched:
        cand = tok_cand
    by_member = NO_MEMBERS
    if batched:
        by_member = dict(members=np.ascontiguousarray(members, dtype=np.int64),
                         tok_sel=np.ascontiguousarray(routing.sel, dtype=np.int16),
                         tok_w=np.ascontiguousarray(routing.w, dtype=np.float32), tok_cand=tok_cand)
    steps = Steps(sel=sel, w=w, wm=wm, cand=cand, next_req=next_req, first_req=first_req,
                  tok_seq=np.ascontiguousarray(run.seq, dtype=np.int32), t0=0, look=look, logits=logits, score=score,
                  **by_member)
    policy, setup, state, slots, ram_cap = policy_state(routing, config, cost, warmup)
    if k != routing.top_k and registry.get(config.eviction_name).uses_token:  # a batch's union: the kernel's ticks
        policy = policy._replace(prm=registry.get(config.eviction_name).kernel_params(  # are L x (E + k) a token
            config.eviction_param, ticks_per_token=L * (routing.n_experts + k)))
    if state.pf_prev.shape[0]:  # a batch's union may be wider than k
        state = state._replace(pf_prev=np.full((L, k), -1, np.int16))
    if k != routing.top_k:
        state = state._replace(**row_state(k, run.n_candidates))
    if batched:
        state = state._replace(**union_state(routing.n_experts, k))
    shape = (T, L, k) if record else (0, 0, 0)
    out = Out(layer_counts=np.zeros((L, N_COUNTERS), np.int64), layer_mass=np.zeros(L, np.float64),
              tok_counts=np.zeros((N_COUNTERS, T), np.int64), tok_mass=np.zeros(T, np.float64),
              tok_seconds=np.zeros(T, np.float64), tok_stall=np.zeros(T, np.float64),
              outcome=np.full(shape, -1, np.int8), substitute=np.full(shape, -1, np.int16),
              selected=np.full(shape, -1, np.int16), layer_displaced=np.zeros(L, np.float64),
              tok_displaced=np.zeros(T, np.float64))
    return Prepared(args=KernelArgs(steps, policy, setup, state, out),
                    variant=variant_of(config, cost, generic), run=run, members=members, warmup_steps=warmup,
                    slots=slots, ram_cap=ram_cap)


def policy_state(source: Any, config: SimConfig, cost: Any, warmup: int) -> tuple[Policy, Setup, State, int, int]:
    """The policy, setup and fresh state groups of a replay of ``source`` (a Routing or a streamed
    traces.stream.DecodedStore: its geometry and request counts), and (slots per layer, host-RAM tier
    size)."""
    L, E = source.n_layers, source.n_experts
    if source.n_tokens >= 2**31:  # the kernel's int32 per-object counters count at most one request a token
        raise MoesimError(f"a replay handles fewer than 2^31 tokens; this trace has {source.n_tokens:,}")
    slots = config.slots_per_layer(E)
    low_bytes = None
    if config.lowbit_share is not None and cost is not None:
        cost.lowbit_seconds(config.low_quant)  # checks the quantization against the model preset
        low_bytes = float(cost.expert_bytes_by_quant[config.low_quant])
    full_slots, n_low = config.lowbit_tier(slots, E, None if cost is None else float(cost.bytes_per_expert),
                                           low_bytes)
    if config.allocation == "global":
        pool_of_layer, pool_cap = np.zeros(L, np.int64), np.array([full_slots * L], np.int64)
    else:
        pool_of_layer, pool_cap = np.arange(L, dtype=np.int64), np.full(L, full_slots, np.int64)
    counts_all = source.request_counts()
    ev = registry.get(config.eviction_name)
    param = config.eviction_param
    pinned = np.zeros(L * E, np.bool_)
    warm_objs = np.zeros(0, np.int64)
    pin_events = np.zeros((0, 3), np.int64)
    if ev.schedules:  # repin, static-domain: the pinned set changes along the tokens (policies/repin.py)
        if not isinstance(source, Routing):
            raise MoesimError(f"{ev.name} replays a trace in memory (it reads the whole routing ahead): "
                              "use --no-stream")
        first, pin_events = ev.module.schedule(source, config.eviction_values, full_slots, config.allocation)
        pinned[first] = True
    elif ev.pinned:
        prefix_counts = counts_all if param is None else source.request_counts(int(param))  # static:W: first W tokens
        pinned[ev.module.pinned(prefix_counts, full_slots, config.allocation)] = True
    elif config.warm:
        # least popular first, so the most popular experts are the most recently inserted
        warm_objs = most_requested(counts_all, full_slots, config.allocation)[::-1].copy()
        if config.allocation == "per-layer":
            warm_objs = np.concatenate([warm_objs[warm_objs // E == l] for l in range(L)])
    ram_cap, ram_warm = ram_tier(cost, counts_all)
    lowbit_res = np.zeros(L * E, np.bool_)
    if n_low:  # the low-bit tier: copies of the most requested experts (after the pinned ones), fixed
        ranked = np.where(pinned.reshape(L, E), -1, counts_all)
        lowbit_res[most_requested(ranked, n_low, config.allocation)] = True
    pf_code = prefetch_mod.get(config.prefetch).code
    overlap = overlap_of(config, cost)
    if overlap != prefetch_mod.OVERLAP_NONE and miss_mod.miss_quant(config.miss) is not None:
        raise MoesimError(f"{config.miss} under an overlapped clock (--overlap layer|cross-layer, or the engine "
                          "profile's default) is not modelled: use --overlap none")
    # a policy whose time is in tokens (registry USES_TOKEN) gets the kernel's ticks per token
    policy = Policy(evict=ev.code, prm=ev.kernel_params(param, ticks_per_token=L * (E + source.top_k)),
                    miss=miss_mod.get(config.miss_name).code,
                    theta=float(config.theta), beta=float(config.admit or 0.0), warmup_tokens=int(warmup),
                    reset_per_seq=bool(config.reset_per_sequence), overlap=overlap,
                    prefetch=pf_code, pf_depth=int(config.prefetch_depth), step_pin=bool(config.step_pin),
                    max_uploads=upload_cap(config, cost), uses_next=ev.uses_next_request,
                    uses_score=ev.uses_score, admits=not ev.pinned, pin_mode=ev.pin_mode,
                    cpu_overlap=bool(getattr(cost, "cpu_overlap", False)) and overlap == prefetch_mod.OVERLAP_NONE,
                    admit_window=config.admit_window, **step_policy(config, source))
    succ, cnt = np.zeros((0, 0, 0), np.int16), np.zeros((0, 0, 0), np.int64)
    if pf_code == prefetch_mod.NEXT_LAYER:
        succ, cnt = next_layer_table(source, config)
    setup = Setup(pool_of_layer=pool_of_layer, pinned=pinned, warm_objs=warm_objs, ram_warm=ram_warm,
                  cost=kernel_costs(cost, L, config.batch, config.low_quant), pf_succ=succ, pf_cnt=cnt,
                  lowbit_res=lowbit_res, pin_events=pin_events)
    n_obj = L * E
    n_pf = n_obj if pf_code != prefetch_mod.NONE else 0
    state = State(objs=np.zeros((n_obj, N_OB), np.int32), objf=np.zeros((n_obj, N_FO), np.float64),
                  pools=new_pools(pool_cap, ram_cap), heap=np.zeros((max(1, int(pool_cap.sum())), 3), np.float64),
                  queue=np.zeros((L, E), np.int64), queue_t=np.zeros((L, E), np.float64),
                  queue_hl=np.zeros((L, 2), np.int64), clock=np.zeros(N_CLOCK, np.float64),
                  scal=np.zeros(N_SCAL, np.int64), pf=np.zeros(n_pf, np.int32), pf_t=np.zeros(n_pf, np.float64),
                  pf_prev=np.full((L, source.top_k) if n_pf else (0, 0), -1, np.int16),
                  pf_scal=np.zeros(N_PF_SCAL, np.int64), pf_score=np.zeros(E if n_pf else 0, np.float64),
                  pf_pick=np.zeros(E if n_pf else 0, np.int64), spin=np.full((n_obj, 2), -1.0, np.float64),
                  last_req=np.full(n_obj, reroute_mod.NEVER_USED, np.int64),
                  **row_state(source.top_k, source.n_candidates))
    return policy, setup, state, slots, ram_cap


def row_state(k: int, n_candidates: int) -> dict:
    """The ext kernel's step row and rerouting's scratch for rows of k requests and n_candidates candidates."""
    return dict(row=np.zeros(k, np.int16), row_w=np.zeros(k, np.float32), row_wm=np.zeros(k, np.float32),
                row_next=np.zeros(k, np.int64), rr_b=np.zeros(n_candidates, np.float64),
                rr_pos=np.zeros(k, np.int64), rr_w=np.zeros(k, np.float64), rr_ord=np.zeros(k, np.int64),
                rr_ow=np.zeros(k, np.float64), **union_state(0, 0))


def union_state(E: int, K: int) -> dict:
    """A batched step policy's scratch for unions of up to K of E experts."""
    return dict(rr_acc=np.full((3, E), -1.0, np.float64), rr_ids=np.zeros(K, np.int64),
                rr_keys=np.zeros(K, np.int64))


def step_policy(config: SimConfig, source: Any) -> dict:
    """The Policy fields of the step policy (rerouting), checked against the trace: it needs candidate scores, a
    selection that is the top k of them, a pool of at least k of them and J <= k."""
    fields = dict(step=reroute_mod.NONE, step_value=0.0, step_pool=0, step_resident=reroute_mod.RESIDENT_CACHE,
                  step_window=0, step_biased=False, gating_sigmoid=source.meta.gating == "sigmoid")
    if config.reroute is None:
        return fields
    meta, k = source.meta, source.top_k
    if not getattr(meta, "has_scores", False):
        raise MoesimError("--reroute needs the candidates' scores, which this trace does not keep (a frequency-only "
                          "trace, an import of selected ids only, or a ranked file of schema version 2: rewrite it "
                          "with moesim compact from its source)")
    name, value = reroute_mod.parse_reroute(config.reroute)
    M = source.n_candidates
    pool = M if config.reroute_pool is None else config.reroute_pool
    if not (k <= pool <= M):
        raise MoesimError(f"--reroute-pool {pool}: the pool takes from k = {k} to the {M} candidates the trace stores")
    if name == "keep" and value > k:
        raise MoesimError(f"--reroute keep:{value:g} keeps more than the k = {k} experts a step selects")
    mode, window = reroute_mod.parse_resident(config.reroute_resident)
    return fields | dict(step=reroute_mod.STEP_POLICIES[name].code, step_value=float(value), step_pool=int(pool),
                         step_resident=mode, step_window=int(window),
                         step_biased=config.reroute_weights == "biased")


def step_scores(run: Any, config: SimConfig, sel: np.ndarray, cand: np.ndarray, meta: Any = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(candidates, logits, selection scores) [T, L, M] of a step policy, else (``cand``, empty, empty);
    ``run``: a Routing or a streamed chunk (its ``logits``; ``meta`` then the store's). A step whose
    selection is a top k of its candidates' scores only by a tie (the model took a candidate of the same
    score as one ranked before it, which the trace ranks lower id first) gets its candidates reordered,
    the selected first among equal scores, so the top k the step policy re-takes is the model's own."""
    empty = np.zeros((0, 0, 0), np.float32)
    if config.reroute is None:
        return cand, empty, empty
    logits = getattr(run, "logits", None)
    if logits is None:
        raise MoesimError("--reroute needs the candidates' scores, which this trace does not keep")
    meta = run.meta if meta is None else meta
    k = sel.shape[2]
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    score = selection_scores(logits, cand, meta)
    off = ~(np.sort(sel, axis=2) == np.sort(cand[:, :, :k], axis=2)).all(axis=2)
    if off.any():
        cand, logits, score = cand.copy(), logits.copy(), score.copy()
        t, l = np.nonzero(off)
        c, x, s = cand[t, l], logits[t, l], score[t, l]
        chosen = (c[:, :, None] == sel[t, l][:, None, :]).any(axis=2)
        group = np.concatenate([np.zeros((len(t), 1), np.int64), np.cumsum(s[:, 1:] != s[:, :-1], axis=1)], axis=1)
        order = np.argsort(2 * group + ~chosen, axis=1, kind="stable")
        cand[t, l] = np.take_along_axis(c, order, axis=1)
        logits[t, l] = np.take_along_axis(x, order, axis=1)
        score[t, l] = np.take_along_axis(s, order, axis=1)
        if not (np.sort(sel[t, l], axis=1) == np.sort(cand[t, l, :k], axis=1)).all():
            raise MoesimError("--reroute needs each step's selection to be the top k of its candidates' scores; "
                              "this trace stores a selection of its own (a model's selected column): rerouting "
                              "would change steps its bias never touched")
    return cand, logits, score


def selection_scores(logits: np.ndarray, cand: np.ndarray, meta) -> np.ndarray:
    """The candidates' selection scores: the logit for softmax gatings; sigmoid(logit) plus the layer's selection
    bias for sigmoid (traces/gating.py's rule)."""
    if meta.gating != "sigmoid":
        return logits
    s = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    if meta.selection_bias is not None:
        bias = np.asarray(meta.selection_bias, dtype=np.float64)
        s = s + bias[np.arange(bias.shape[0])[None, :, None], cand]
    return np.ascontiguousarray(s, dtype=np.float32)


def upload_cap(config: SimConfig, cost: Any) -> int:
    """Fetched (or, for hybrid misses, uploaded) experts admitted per layer per step at most (0: no cap):
    --max-uploads, else for hybrid misses the engine profile's uploads_per_layer."""
    if config.max_uploads:
        return int(config.max_uploads)
    if config.miss_name == "hybrid" and cost is not None:
        return int(getattr(cost, "uploads_per_layer", 0) or 0)
    return 0


def variant_of(config: SimConfig, cost: Any, generic: bool = False) -> Variant:
    """The kernel a replay of ``config`` (priced by ``cost`` or not) runs;
    ``generic``: the kernel a sweep runs it on (ext at least)."""
    family = family_of(config, cost, generic)
    return variant(config.eviction_name, family, step_rule_of(config) if family != "plain" else "none")


def step_rule_of(config: SimConfig) -> str:
    """The step rule of a replay of ``config`` (simulator/paths.py STEP_RULES): a batch reroutes each member."""
    if config.reroute is None:
        return "none"
    return "reroute-batched" if config.batch > 1 else "reroute"


def family_of(config: SimConfig, cost: Any, generic: bool = False) -> str:
    """The kernel family (simulator/kernels.py FAMILIES) a replay needs: engine for --step-pin, --max-uploads
    and the low-bit paths; ext for any other miss policy than fetch-all, prefetch, rerouting, an overlapped
    clock, --admission second-touch or a re-pinning placement; else plain."""
    if config.step_pin or upload_cap(config, cost) or config.lowbit_share or miss_mod.miss_quant(config.miss):
        return "engine"
    # (second-touch admission and the re-pinning placements stay out of plain's hot loop: measured 1.13-1.26x on
    # its LRU kernel alone with them in, benchmarks/replay_vs_libcachesim.py)
    if generic or config.miss_name != "fetch-all" or config.prefetch != "none" or config.reroute is not None \
            or overlap_of(config, cost) != prefetch_mod.OVERLAP_NONE or getattr(cost, "cpu_overlap", False) \
            or config.admit_window or registry.get(config.eviction_name).schedules:
        return "ext"
    return "plain"


def overlap_of(config: SimConfig, cost: Any) -> int:
    """The clock's overlap mode: the config's, else the engine profile's (CostParams.overlap), else none."""
    name = config.overlap if config.overlap is not None else getattr(cost, "overlap", "none")
    return prefetch_mod.overlap_code(name) if cost is not None else prefetch_mod.OVERLAP_NONE


def lookahead_steps(run: Routing, config: SimConfig) -> np.ndarray:
    """The lookahead column as the kernel reads it; refused (one line) when the trace has none."""
    if run.lookahead is None:
        raise MoesimError("--prefetch lookahead needs a trace with the lookahead column (layer l+1's router applied "
                          "to layer l's hidden state, recorded by the tracers; docs/trace-format.md); this trace "
                          "has none")
    if config.prefetch_depth != 1:
        raise MoesimError("--prefetch lookahead predicts the next layer only: use --prefetch-depth 1")
    if config.batch > 1:
        raise MoesimError("--prefetch lookahead replays batch 1 only")
    return np.ascontiguousarray(run.lookahead, dtype=np.int16)


def next_layer_table(source: Any, config: SimConfig) -> tuple[np.ndarray, np.ndarray]:
    """The next-layer predictor's table (policies/prefetch.py transitions) from --prefetch-train's trace, or
    from the replayed trace's first tokens (prefetch.default_train_tokens): a Routing or a streamed store."""
    depth = int(config.prefetch_depth)
    L, E = source.n_layers, source.n_experts
    if config.prefetch_train is not None:
        from moesim.traces.routing import load_routing

        train = load_routing(config.prefetch_train)
        if (train.n_layers, train.n_experts) != (L, E):
            raise MoesimError(f"--prefetch-train {config.prefetch_train}: {train.n_layers} MoE layers x "
                              f"{train.n_experts} experts, the replayed trace has {L} x {E}")
        return prefetch_mod.transitions(train.sel, E, depth)
    n = prefetch_mod.default_train_tokens(source.n_tokens)
    if isinstance(source, Routing):
        return source.derived(("prefetch_transitions", depth, n),
                              lambda: prefetch_mod.transitions(source.sel[:n], E, depth))
    parts = [c.sel.copy() for c in source.chunks(n, stop=n, what=("sel",))]  # a streamed store: read the prefix
    return prefetch_mod.transitions(np.concatenate(parts), E, depth)


def tiny_args(eviction: str, family: str) -> KernelArgs:
    """The arguments of a one-token, one-layer replay of the kernel family (simulator/kernels.py FAMILIES)
    under ``eviction``: the smallest problem with the real argument types, to compile a kernel with."""
    from moesim.simulator.driver import tiny_routing

    config = SimConfig(eviction=eviction, slots=1, max_uploads=1 if family in ("ext", "engine") else None)
    return build(tiny_routing(), config, record=False).args
