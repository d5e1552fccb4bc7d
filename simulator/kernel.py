"""The replay kernel: one numba loop over (token, layer, rank) for one policy config.

It only computes on arrays (no I/O, no Python objects); its arguments are five named groups
built by one function (simulator/args.py), and policies arrive as plain int codes whose hooks the
registry dispatches (policies/registry.py, policies/miss.py). The public entry point that validates
and converts is simulator.driver.simulate. The semantics are in docs/replay-semantics.md;
tests/reference_replay.py is the slow reference this kernel must match count for count.
"""

from numba import njit

from moesim.policies import lists, miss, registry
from moesim.policies import prefetch as pfp
from moesim.policies.structures import (
    ACC,
    CAP,
    CNT,
    HEAD,
    HPOS,
    HSIZE,
    LST,
    MARK,
    N_LISTS,
    NREQ,
    QUEUED,
    RES,
    RNXT,
    RPRV,
    RRES,
    SCORE,
    SIZE,
    TAIL,
    X0,
    list_clear,
)
from moesim.simulator import overlap
from moesim.simulator import prefetch as pfm
from moesim.simulator import step_pin as pin

# counter columns (per layer and per token)
COUNTER_NAMES = ("requests", "hits", "misses", "fetches", "substitutions", "drops", "cpu", "admissions",
                 "first_choice_substitutions", "evictions", "fetches_nvme", "cpu_nvme", "copies", "copies_nvme",
                 "prefetches", "prefetch_used", "prefetch_late", "prefetches_nvme", "lowbit", "capped", "pin_full",
                 "lowbit_tier")
(REQUESTS, HITS, MISSES, FETCHES, SUBSTITUTIONS, DROPS, CPU, ADMISSIONS, FIRST_CHOICE_SUBS, EVICTIONS,
 FETCHES_NVME, CPU_NVME, COPIES, COPIES_NVME, PREFETCHES, PREFETCH_USED, PREFETCH_LATE,
 PREFETCHES_NVME, LOWBIT, CAPPED, PIN_FULL, LOWBIT_TIER) = range(len(COUNTER_NAMES))
N_COUNTERS = len(COUNTER_NAMES)
# cost columns: seconds per operation (simulator/args.py kernel_costs); all zero replays without a clock
COST_NAMES = ("dense_layer", "expert_vram", "fetch_ram", "fetch_nvme", "cpu_ram", "cpu_nvme", "copy_ram",
              "copy_nvme", "cpu_handoff", "writeback", "fetch_lowbit", "lowbit_vram")
(S_DENSE_LAYER, S_EXPERT_VRAM, S_FETCH_RAM, S_FETCH_NVME, S_CPU_RAM, S_CPU_NVME, S_COPY_RAM, S_COPY_NVME,
 S_CPU_HANDOFF, S_WRITEBACK, S_FETCH_LOWBIT, S_LOWBIT_VRAM) = range(len(COST_NAMES))
N_COSTS = len(COST_NAMES)

_RESCALE = 1e150  # decayed frequency scores are rescaled before they overflow
_FLAGS = registry.FLAGS  # frozen into the compiled kernel as a constant


# The replay kernel and its helpers are compiled without NRT (the builder allocates every array):
# with NRT, each use of an array in an inlined helper or each call increfs and decrefs it atomically,
# which made replay ~10x slower.
@njit(_nrt=False)  # type: ignore[call-overload]  # numba's NRT switch is not in its stubs
def _admit(code, prm, pool, o, tick, ob, fo, po, heap):
    """Make o resident in its pool through the eviction's insert hook. Returns the victim, -1 when
    nothing left the pool, registry.NOT_ADMITTED when the policy refused o."""
    return registry.insert(code, ob, fo, po, heap, prm, pool, o, tick)


@njit(_nrt=False)  # type: ignore[call-overload]  # numba's NRT switch is not in its stubs
def _from_nvme(o, ram, ob, po):
    """Read o from host memory: True when it must first come from NVMe (a host-RAM tier
    miss, which then caches it, evicting the least recently used)."""
    if po[ram, CAP] < 0:
        return False  # every expert fits in host RAM
    if po[ram, CAP] == 0:
        return True  # no host RAM to spare: every read streams from NVMe
    if ob[o, RRES] != 0:
        if po[ram, HEAD] != o:
            _ram_unlink(ob, po, ram, o)
            _ram_push_front(ob, po, ram, o)
        return False
    if po[ram, SIZE] >= po[ram, CAP]:
        v = po[ram, TAIL]
        _ram_unlink(ob, po, ram, v)
        ob[v, RRES] = 0
    else:
        po[ram, SIZE] += 1
    ob[o, RRES] = 1
    _ram_push_front(ob, po, ram, o)
    return True


@njit(inline="always")
def _ram_push_front(ob, po, ram, o):
    h = po[ram, HEAD]
    ob[o, RPRV] = -1
    ob[o, RNXT] = h
    if h != -1:
        ob[h, RPRV] = o
    else:
        po[ram, TAIL] = o
    po[ram, HEAD] = o


@njit(inline="always")
def _ram_unlink(ob, po, ram, o):
    p = ob[o, RPRV]
    n = ob[o, RNXT]
    if p != -1:
        ob[p, RNXT] = n
    else:
        po[ram, HEAD] = n
    if n != -1:
        ob[n, RPRV] = p
    else:
        po[ram, TAIL] = p


@njit(_nrt=False)  # type: ignore[call-overload]  # numba's NRT switch is not in its stubs
def _reset(policy, setup, E, ob, fo, po, heap, qhl):
    """Empty every pool and copy queue, then pin the static set or pre-fill the warm
    set; the host-RAM tier starts with ram_warm (least recently used first)."""
    pinned = setup.pinned
    for o in range(ob.shape[0]):
        ob[o, RES] = 1 if pinned[o] else 0
        ob[o, HPOS] = -1
        ob[o, CNT] = 0
        ob[o, QUEUED] = 0
        ob[o, RRES] = 0
        ob[o, LST] = -1
        fo[o, SCORE] = 0.0
        fo[o, ACC] = 0.0
    for p in range(po.shape[0]):
        po[p, SIZE] = 0
        po[p, HSIZE] = 0
        for q in range(N_LISTS):
            list_clear(po, p, q)
        for x in range(X0, po.shape[1]):
            po[p, x] = 0
    for l in range(qhl.shape[0]):
        qhl[l, 0] = 0
        qhl[l, 1] = 0
    warm = setup.warm_objs
    nw = warm.shape[0]
    for i in range(nw):
        o = warm[i]
        _admit(policy.evict, policy.prm, setup.pool_of_layer[o // E], o, -2 * (nw - i) - 1, ob, fo, po, heap)
    ram = po.shape[0] - 1
    for i in range(setup.ram_warm.shape[0]):
        _from_nvme(setup.ram_warm[i], ram, ob, po)


@njit(_nrt=False)  # type: ignore[call-overload]  # numba's NRT switch is not in its stubs
def _land_copies(code, prm, pool, l, tick0, now, link_free, s_writeback, ob, fo, po, heap, queue, queue_t, qhl, pf):
    """Admit layer l's background copies and prefetches that completed by ``now`` (in queue order, at the
    step's first ticks). Returns (admissions, evictions, when the link is free). ``pf``: the prefetch
    states (empty without prefetch)."""
    E = queue.shape[1]
    n_admit = 0
    n_evict = 0
    i = 0
    prefetching = pf.shape[0] > 0
    while qhl[l, 1] > 0 and queue_t[l, qhl[l, 0]] <= now:
        o = queue[l, qhl[l, 0]]
        qhl[l, 0] = (qhl[l, 0] + 1) % E
        qhl[l, 1] -= 1
        ob[o, QUEUED] = 0
        fetched = False  # a prefetch: admitted but not an admission
        if prefetching:
            st = pf[o]
            pf[o] = pfm.PF_NONE
            if st == pfm.PF_STALE:
                continue  # already served to a request that waited for it
            fetched = st == pfm.PF_INFLIGHT
        if ob[o, RES] == 0:
            v = _admit(code, prm, pool, o, tick0 + i, ob, fo, po, heap)
            if v != registry.NOT_ADMITTED:
                if fetched:
                    pf[o] = pfm.PF_LANDED
                else:
                    n_admit += 1
            if v >= 0:
                n_evict += 1
                if s_writeback != 0.0:
                    link_free = max(now, link_free) + s_writeback
            i += 1
    return n_admit, n_evict, link_free


@njit(_nrt=False)  # type: ignore[call-overload]  # numba's NRT switch is not in its stubs
def _substitute(code, prm, pool, cand, t, l, base, step, tick, ob, fo, po, heap):
    """The best-scored resident candidate not selected and not yet run at this step, run in place of
    a miss (marked, and used through the hit hook); -1 when there is none."""
    for j in range(cand.shape[2]):
        c = base + cand[t, l, j]
        if c >= base and ob[c, RES] != 0 and fo[c, MARK] != step:
            fo[c, MARK] = step
            registry.hit(code, ob, fo, po, heap, prm, pool, c, tick, False)
            return c
    return -1


@njit(_nrt=False)  # type: ignore[call-overload]  # numba's NRT switch is not in its stubs
def _start_copy(o, l, now, link_free, cost, timed, tiered, ram, ob, fo, po, queue, queue_t, qhl, tok_counts,
                layer_counts, t, counting):
    """Queue a background copy of o (its accumulator reached beta): it occupies the link after what is queued
    on it. Returns when the link is free."""
    fo[o, ACC] = 0.0
    _bump(tok_counts, layer_counts, t, l, COPIES, counting)
    nvme = tiered and _from_nvme(o, ram, ob, po)
    if nvme:
        _bump(tok_counts, layer_counts, t, l, COPIES_NVME, counting)
    return _queue_copy(o, l, nvme, now, link_free, cost, timed, ob, queue, queue_t, qhl)


@njit(inline="always")
def _queue_copy(o, l, nvme, now, link_free, cost, timed, ob, queue, queue_t, qhl):
    """A background copy (admission or prefetch) takes the link after what is queued on it, from now on;
    returns when the link is free (= when o lands)."""
    if timed:
        link_free = max(now, link_free) + (cost[S_COPY_NVME] if nvme else cost[S_COPY_RAM])
    _enqueue(o, l, link_free, ob, queue, queue_t, qhl)
    return link_free


@njit(_nrt=False)  # type: ignore[call-overload]  # numba's NRT switch is not in its stubs
def _tier_run(o, l, wr, now, link_free, cost, timed, tiered, ram, copies, beta, ob, fo, po, queue, queue_t, qhl,
              tok_counts, layer_counts, t, counting):
    """A miss served by the expert's resident low-bit copy (no transfer); with --admit its weight accumulates
    towards a background copy of the full expert. Returns when the link is free."""
    _bump(tok_counts, layer_counts, t, l, LOWBIT, counting)
    _bump(tok_counts, layer_counts, t, l, LOWBIT_TIER, counting)
    if copies:
        fo[o, ACC] += wr
        if fo[o, ACC] >= beta and ob[o, QUEUED] == 0:
            link_free = _start_copy(o, l, now, link_free, cost, timed, tiered, ram, ob, fo, po, queue, queue_t, qhl,
                                    tok_counts, layer_counts, t, counting)
    return link_free


@njit(_nrt=False)  # type: ignore[call-overload]  # numba's NRT switch is not in its stubs
def _pinned_hits(code, prm, pool, sel, next_req, t, l, base, tick1, uses_next, uses_score, inc, timed, s_vram, now,
                 record, ob, fo, po, heap, outcome):
    """--step-pin: the step's hits, before its misses, in rank order (ticks tick1, tick1 + 1, ...). Returns
    (hits, now)."""
    n = 0
    for r in range(sel.shape[2]):
        e = sel[t, l, r]
        if e < 0 or ob[base + e, RES] == 0:
            continue
        o = base + e
        if uses_next:
            fo[o, NREQ] = next_req[t, l, r]
        if uses_score:
            fo[o, SCORE] += inc
        registry.hit(code, ob, fo, po, heap, prm, pool, o, tick1 + n, True)
        n += 1
        if timed:
            now += s_vram
        if record:
            outcome[t, l, r] = miss.OUTCOME_HIT
    return n, now


@njit(_nrt=False)  # type: ignore[call-overload]  # numba's NRT switch is not in its stubs
def _admit_engine(pin_mode, code, prm, pool, o, tick, step, n_up, max_up, step_pin, ob, fo, po, heap, spin, tok_counts,
                  layer_counts, t, l, counting):
    """Admit a fetched expert under --max-uploads (beyond the cap: for this use only, counted as capped) and
    --step-pin (no pinned victim; none left: pin_full). Returns (victim or a negative code, uploads so far)."""
    if max_up > 0 and n_up >= max_up:
        _bump(tok_counts, layer_counts, t, l, CAPPED, counting)
        return registry.NOT_ADMITTED, n_up
    if step_pin:
        v = pin.insert(pin_mode, code, prm, pool, o, tick, step, ob, fo, po, heap, spin)
    else:
        v = registry.insert(code, ob, fo, po, heap, prm, pool, o, tick)
    if v == pin.PIN_FULL:
        _bump(tok_counts, layer_counts, t, l, PIN_FULL, counting)
    elif v != registry.NOT_ADMITTED:
        n_up += 1
    return v, n_up


@njit(_nrt=False)  # type: ignore[call-overload]  # numba's NRT switch is not in its stubs
def _lowbit_fetch(o, l, wr, now, link_free, copy_end, stall, cost, timed, tiered, ram, copies, beta, ob, fo, po, queue,
                  queue_t, qhl, tok_counts, layer_counts, t, counting):
    """lowbit:Q: copy the expert's low-bit copy (behind what is queued on the link, after ``copy_end``) and run it;
    not admitted; with --admit its weight accumulates towards a background copy of the full expert. Returns
    (now, link_free, copy_end, stall)."""
    _bump(tok_counts, layer_counts, t, l, LOWBIT, counting)
    if timed:
        now, link_free, copy_end, stall = _sync_fetch(now, link_free, copy_end, stall, cost[S_FETCH_LOWBIT],
                                                      cost[S_LOWBIT_VRAM])
    if copies:
        fo[o, ACC] += wr
        if fo[o, ACC] >= beta and ob[o, QUEUED] == 0:
            link_free = _start_copy(o, l, now, link_free, cost, timed, tiered, ram, ob, fo, po, queue, queue_t, qhl,
                                    tok_counts, layer_counts, t, counting)
    return now, link_free, copy_end, stall


@njit(inline="always")
def _sync_fetch(now, link_free, copy_end, stall, s_link, s_run):
    """A copy the step waits for: it takes the link behind what is queued there, from ``copy_end`` on (the time
    waited is stall), then the expert runs. Returns (now, link_free, copy_end, stall)."""
    start = max(copy_end, link_free)
    stall += start - copy_end
    link_free = start + s_link
    return max(now, link_free) + s_run, link_free, link_free, stall


@njit(_nrt=False)  # type: ignore[call-overload]  # numba's NRT switch is not in its stubs
def _enqueue(o, l, done, ob, queue, queue_t, qhl):
    """Queue a background copy of o (layer l) that completes at ``done``."""
    E = queue.shape[1]
    ob[o, QUEUED] = 1
    q = (qhl[l, 0] + qhl[l, 1]) % E
    queue[l, q] = o
    queue_t[l, q] = done
    qhl[l, 1] += 1


@njit(_nrt=False)  # type: ignore[call-overload]  # numba's NRT switch is not in its stubs
def _prefetch(policy, steps, setup, state, t, l, t_r, link_free, tiered, timed, tok_counts, layer_counts, counting):
    """Step (t, l)'s prefetches for layer l + depth (same token): each predicted expert neither resident nor
    already queued is copied on the link behind what is there (at the earliest at the router decision
    ``t_r``) and queued to land at that layer's first step after it completes. Returns the link's free time."""
    sel, pf, ob, po = steps.sel, state.pf, state.objs, state.pools
    L = sel.shape[1]
    E = ob.shape[0] // L
    seq_t = steps.tok_seq[t]
    lt = l + policy.pf_depth
    if lt < L:
        n = pfm.predict(policy.prefetch, t, l, lt, sel, steps.look, setup.pf_succ, setup.pf_cnt, state.pf_prev,
                        state.pf_scal, seq_t, state.pf_score, state.pf_pick)
        ram = po.shape[0] - 1
        cost = setup.cost
        for i in range(n):
            o = lt * E + state.pf_pick[i]
            if ob[o, RES] != 0 or ob[o, QUEUED] != 0:
                continue
            _bump(tok_counts, layer_counts, t, lt, PREFETCHES, counting)
            nvme = tiered and _from_nvme(o, ram, ob, po)
            if nvme:
                _bump(tok_counts, layer_counts, t, lt, PREFETCHES_NVME, counting)
            link_free = _queue_copy(o, lt, nvme, t_r, link_free, cost, timed, ob, state.queue, state.queue_t,
                                    state.queue_hl)
            pf[o] = pfm.PF_INFLIGHT
            state.pf_t[o] = link_free
    if policy.prefetch == pfp.PREV_TOKEN:
        pfm.remember(l, t, sel, state.pf_prev, state.pf_scal, seq_t)
    return link_free


# The scalars a replay carries from one kernel call to the next (State.clock, State.scal): a streamed
# replay calls the kernel once per chunk of tokens with the same state arrays, so everything a token
# depends on from earlier tokens lives in the state, never in the kernel's locals.
NOW, LINK_FREE = range(2)       # clock: simulated seconds; when the host-to-GPU link finishes its queue
PREV_SEQ, DECAY_BASE = range(2)  # scal: the last replayed token's sequence; the token decay counts from
N_CLOCK = N_SCAL = 2


@njit(cache=True, _nrt=False)  # type: ignore[call-overload]
def replay(steps, policy, setup, state, out):
    """Replay the tokens of ``steps`` (tokens steps.t0 .. steps.t0 + T - 1 of the trace; simulator/args.py
    names every array) continuing from ``state``: a whole trace in one call, or a streamed trace chunk by
    chunk with the same state. Adds counters into out.layer_counts/layer_mass (tokens from
    policy.warmup_tokens on) and, per token of the chunk, into out.tok_counts (counter-major, from zeros);
    sets out.tok_mass/tok_seconds/tok_stall (the chunk's tokens; they arrive as zeros, and are written only when
    they can differ from zero: mass in the ext variant, seconds and stall in a timed replay);
    with a decision record (out.outcome non-empty), each request's outcome and substitute.
    steps.sel entries < 0 are padding (batched routing); steps.w: the weights the miss policy reads;
    steps.wm: the gate mass a substitution or drop loses; steps.next_req and steps.first_req: ticks."""
    code = policy.evict
    sel, w, wm, cand, next_req, tok_seq = steps.sel, steps.w, steps.wm, steps.cand, steps.next_req, steps.tok_seq
    t0 = steps.t0
    ob, fo, po, heap, spin = state.objs, state.objf, state.pools, state.heap, state.spin
    queue, queue_t, qhl = state.queue, state.queue_t, state.queue_hl
    clock, scal = state.clock, state.scal
    layer_counts, layer_mass, tok_counts, tok_mass = out.layer_counts, out.layer_mass, out.tok_counts, out.tok_mass
    tok_seconds, tok_stall = out.tok_seconds, out.tok_stall
    outcome, substitute = out.outcome, out.substitute
    pool_of_layer, cost, lowbit_res = setup.pool_of_layer, setup.cost, setup.lowbit_res
    prm, miss_code, theta, beta = policy.prm, policy.miss, policy.theta, policy.beta
    warmup, reset_per_seq = policy.warmup_tokens, policy.reset_per_seq
    # A compile-time constant (policy.ext's length is part of its type, simulator/args.py): a fetch-all replay
    # without overlap, prefetch, step pinning, an upload cap or low-bit experts runs a variant compiled without
    # them, where every miss is fetched: the substitution, drop and CPU paths are not in its loop at all (their
    # mere presence, unused, made the fetch-all replay ~15-20% slower: more live values, a longer loop).
    ext = len(policy.ext) > 0
    step_pin = ext and policy.step_pin
    max_up = policy.max_uploads if ext else 0
    pin_mode = pin.MODES[code]
    engine = step_pin or max_up > 0
    tier = False  # a low-bit tier (--lowbit-share): misses with a resident low-bit copy run it
    if ext:
        for o in range(lowbit_res.shape[0]):
            if lowbit_res[o]:
                tier = True
                break
    T, L, k = sel.shape
    n_obj = ob.shape[0]
    E = n_obj // L
    ram = po.shape[0] - 1
    tiered = po[ram, CAP] >= 0  # a host-RAM tier smaller than the experts: reads may come from NVMe
    record = outcome.shape[0] > 0
    admits = _FLAGS[code, registry.ADMITS]
    uses_score = _FLAGS[code, registry.USES_SCORE]
    uses_next = _FLAGS[code, registry.USES_NEXT_REQUEST]
    half_life = prm[0] if uses_score else 0.0
    timed = False  # without a cost model every time is zero: the clock arithmetic is skipped
    for c in range(cost.shape[0]):
        if cost[c] != 0.0:
            timed = True
    if t0 == 0:
        for o in range(n_obj):
            fo[o, NREQ] = steps.first_req[o]
            fo[o, MARK] = -1.0
    # hoisted: array loads inside the loop could not be, stores to other arrays may alias them
    s_dense_layer, s_vram = cost[S_DENSE_LAYER], cost[S_EXPERT_VRAM]
    s_fetch_ram, s_fetch_nvme = cost[S_FETCH_RAM], cost[S_FETCH_NVME]
    s_cpu_ram, s_cpu_nvme = cost[S_CPU_RAM], cost[S_CPU_NVME]
    s_handoff, s_writeback = cost[S_CPU_HANDOFF], cost[S_WRITEBACK]
    s_lowbit_vram = cost[S_LOWBIT_VRAM]
    substitutes = ext and (miss_code == miss.THRESHOLD or miss_code == miss.FIRST_CHOICE
                           or miss_code == miss.SUBSTITUTE_ALL)
    copies = beta > 0.0 and admits
    # overlap (simulator/overlap.py) and prefetch (simulator/prefetch.py): off, they leave the loop as it was
    ov = policy.overlap if timed and ext else 0
    prefetching = ext and policy.prefetch != pfp.NONE and admits  # pinned evictions never admit: nothing to prefetch
    pf = state.pf
    t_r = h = h0 = lk0 = 0.0
    m_link = 0
    now = clock[NOW]
    link_free = clock[LINK_FREE]
    prev_seq = scal[PREV_SEQ]
    decay_base = scal[DECAY_BASE]
    inc = 1.0
    # LRU, FIFO and the keyed heap (Belady) in the plain variant: their requests run in loops of their own with
    # their hooks called directly (the loop unswitched on the policy code): the generic loop, with every inlined
    # policy in its dispatch, kept them ~15-25% slower (more live values spilled around a longer loop)
    own = -1
    if not ext:
        own = (OWN_LISTS if code == registry.LIST_MOVE or code == registry.LIST_STAY
               else OWN_KEYED if code == registry.KEYED else -1)
    move = code != registry.LIST_STAY  # FIFO's hit leaves its list as it is

    for t in range(T):
        tg = t0 + t  # the token's index in the whole trace
        t_start = now
        stall = 0.0
        if tg == 0 or (reset_per_seq and tok_seq[t] != prev_seq):
            _reset(policy, setup, E, ob, fo, po, heap, qhl)
            if prefetching:
                pfm.reset(pf, state.pf_scal)
            decay_base = tg
        prev_seq = tok_seq[t]
        if half_life > 0.0:
            inc = 2.0 ** ((tg - decay_base) / half_life)
            if inc > _RESCALE:
                for o in range(n_obj):
                    fo[o, SCORE] /= inc
                    registry.rekey(code, ob, fo, po, heap, prm, pool_of_layer[o // E], o)
                decay_base = tg
                inc = 1.0
        counting = tg >= warmup
        tmass = 0.0
        tk_req = tk_hit = tk_fetch = tk_evict = tk_admit = 0  # the token's frequent counters, over its layers

        for l in range(L):
            pool = pool_of_layer[l]
            base = l * E
            step = tg * L + l
            tick0 = step * (E + k)  # the step's ticks: tick0 + i for its admissions, tick0 + E + r for rank r
            n_req = 0
            n_hit = 0
            n_fetch = 0
            n_evict = 0
            n_admit = 0
            n_up = 0
            smass = 0.0
            ran_cpu = False
            if timed:
                now += s_dense_layer
            t_r = now  # the router decision
            if ov:
                h = h0 = overlap.NEG
                lk0 = now
                m_link = 0
            if ext and qhl[l, 1] > 0 and queue_t[l, qhl[l, 0]] <= now:  # plain: nothing is ever queued
                n_admit, n_evict, link_free = _land_copies(code, prm, pool, l, tick0, now, link_free, s_writeback,
                                                           ob, fo, po, heap, queue, queue_t, qhl, pf)
            if substitutes:  # a substitute may not be one of the step's selected experts
                for r in range(k):
                    if sel[t, l, r] >= 0:
                        fo[base + sel[t, l, r], MARK] = step
            if step_pin:  # the step's hits first (in rank order), then its misses below
                pin.mark(sel, t, l, base, step, spin)
                n_hit, now = _pinned_hits(code, prm, pool, sel, next_req, t, l, base, tick0 + E, uses_next, uses_score,
                                          inc, timed, s_vram, now, record, ob, fo, po, heap, outcome)
                n_req = n_hit
                pin.raise_hits(pin_mode, sel, t, l, base, pool_of_layer, ob, po, heap, spin)
            copy_end = now  # --step-pin: the step's copies go onto the link together, from here
            if own >= 0:
                n_req, n_hit, n_fetch, n_evict, now, stall, link_free = _own_step(
                    own, (move, sel, next_req, t, l, base, tick0 + E, now, stall, link_free, timed, tiered, ram, s_vram,
                          s_fetch_ram, s_fetch_nvme, s_writeback, record, ob, fo, po, heap, prm, pool, outcome,
                          tok_counts, layer_counts, counting))

            for r in range(0 if own >= 0 else k):  # the generic request loop (none left for LRU, FIFO, Belady)
                e = sel[t, l, r]
                if e < 0:
                    continue
                o = base + e
                if step_pin and ob[o, RES] != 0:
                    continue  # a hit, handled above
                tick = tick0 + E + (n_req if step_pin else r)  # --step-pin: ticks in the order handled
                if uses_next:
                    fo[o, NREQ] = next_req[t, l, r]
                if uses_score:
                    fo[o, SCORE] += inc
                n_req += 1
                if ob[o, RES] != 0:
                    n_hit += 1
                    registry.hit(code, ob, fo, po, heap, prm, pool, o, tick, True)
                    if timed:
                        now += s_vram
                    if prefetching and pf[o] == pfm.PF_LANDED:
                        pf[o] = pfm.PF_NONE
                        _bump(tok_counts, layer_counts, t, l, PREFETCH_USED, counting)
                    if record:
                        outcome[t, l, r] = miss.OUTCOME_HIT
                    continue
                if prefetching and pf[o] == pfm.PF_INFLIGHT:
                    # its prefetch is still in flight: wait for it (a hit, late), no second copy
                    n_hit += 1
                    _bump(tok_counts, layer_counts, t, l, PREFETCH_USED, counting)
                    done = state.pf_t[o]
                    asked = t_r if ov else now
                    if done > asked:
                        _bump(tok_counts, layer_counts, t, l, PREFETCH_LATE, counting)
                    if timed:
                        if ov:
                            h = max(h, done) + s_vram
                            m_link += 1
                        else:
                            stall += max(done, now) - now
                            now = max(done, now) + s_vram
                    if pfm.serve_late(code, prm, pool, o, tick, ob, fo, po, heap, pf) >= 0:
                        n_evict += 1
                        if timed:
                            link_free = max(t_r if ov else now, link_free) + s_writeback
                    if record:
                        outcome[t, l, r] = miss.OUTCOME_HIT
                    continue
                wr = w[t, l, r] if ext else 0.0  # the plain variant fetches every miss: no weight to read
                action = miss.decide(miss_code, r, wr, theta) if ext else miss.FETCH
                if tier and lowbit_res[o]:
                    if timed:
                        now += s_lowbit_vram
                    link_free = _tier_run(o, l, wr, t_r if ov else now, link_free, cost, timed, tiered, ram, copies,
                                          beta, ob, fo, po, queue, queue_t, qhl, tok_counts, layer_counts, t, counting)
                    if record:
                        outcome[t, l, r] = miss.OUTCOME_LOWBIT
                    continue
                if action == miss.FETCH:
                    n_fetch += 1
                    nvme = tiered and _from_nvme(o, ram, ob, po)
                    if nvme:
                        _bump(tok_counts, layer_counts, t, l, FETCHES_NVME, counting)
                    if timed:
                        if ov:
                            link_free, h, lk0, h0, m_link = overlap.fetch(
                                t_r, link_free, s_fetch_nvme if nvme else s_fetch_ram, s_vram, h, lk0, h0, m_link)
                        else:
                            if not step_pin:
                                copy_end = now
                            now, link_free, copy_end, stall = _sync_fetch(
                                now, link_free, copy_end, stall, s_fetch_nvme if nvme else s_fetch_ram, s_vram)
                    if prefetching and pf[o] == pfm.PF_LANDED:
                        pf[o] = pfm.PF_NONE  # evicted before use, fetched again
                    if admits:
                        if engine:  # --step-pin or --max-uploads
                            v, n_up = _admit_engine(pin_mode, code, prm, pool, o, tick, step, n_up, max_up, step_pin,
                                                    ob, fo, po, heap, spin, tok_counts, layer_counts, t, l, counting)
                        else:
                            v = registry.insert(code, ob, fo, po, heap, prm, pool, o, tick)
                        if v >= 0:
                            n_evict += 1
                            if timed:
                                link_free = max(t_r if ov else now, link_free) + s_writeback
                    if record:
                        outcome[t, l, r] = miss.OUTCOME_FETCH
                    continue
                if ext and action == miss.LOWBIT:
                    if not step_pin:
                        copy_end = now
                    now, link_free, copy_end, stall = _lowbit_fetch(o, l, wr, now, link_free, copy_end, stall, cost,
                                                                    timed, tiered, ram, copies, beta, ob, fo, po,
                                                                    queue, queue_t, qhl, tok_counts, layer_counts, t,
                                                                    counting)
                    if record:
                        outcome[t, l, r] = miss.OUTCOME_LOWBIT
                    continue
                if action == miss.CPU:
                    ran_cpu = True
                    _bump(tok_counts, layer_counts, t, l, CPU, counting)
                    nvme = tiered and _from_nvme(o, ram, ob, po)
                    if nvme:
                        _bump(tok_counts, layer_counts, t, l, CPU_NVME, counting)
                    if timed:
                        now += s_cpu_nvme if nvme else s_cpu_ram
                    if record:
                        outcome[t, l, r] = miss.OUTCOME_CPU
                    continue
                # substituted or dropped: the step loses this expert's gate weight
                sub = -1
                if action == miss.SUBSTITUTE:
                    sub = _substitute(code, prm, pool, cand, t, l, base, step, tick, ob, fo, po, heap)
                if sub >= 0:
                    _bump(tok_counts, layer_counts, t, l, SUBSTITUTIONS, counting)
                    if timed:
                        now += s_vram
                    if record:
                        outcome[t, l, r] = miss.OUTCOME_SUBSTITUTE
                        substitute[t, l, r] = sub - base
                else:
                    _bump(tok_counts, layer_counts, t, l, DROPS, counting)
                    if record:
                        outcome[t, l, r] = miss.OUTCOME_DROP
                smass += wm[t, l, r]
                if r == 0:
                    _bump(tok_counts, layer_counts, t, l, FIRST_CHOICE_SUBS, counting)
                if copies:
                    fo[o, ACC] += wr
                    if fo[o, ACC] >= beta and ob[o, QUEUED] == 0:
                        link_free = _start_copy(o, l, t_r if ov else now, link_free, cost, timed, tiered, ram, ob, fo,
                                                po, queue, queue_t, qhl, tok_counts, layer_counts, t, counting)

            if step_pin:
                pin.restore(pin_mode, sel, t, l, base, pool_of_layer, ob, po, heap, spin)
            if timed and ran_cpu:
                now += s_handoff
            if prefetching:
                link_free = _prefetch(policy, steps, setup, state, t, l, t_r, link_free, tiered, timed, tok_counts,
                                      layer_counts, counting)
            if ov:
                now, stall = overlap.finish(ov, now, m_link, s_vram, h, h0, link_free, stall)
            tmass += smass
            tk_req += n_req
            tk_hit += n_hit
            tk_fetch += n_fetch
            tk_evict += n_evict
            tk_admit += n_admit
            if counting:
                _add(layer_counts, l, n_req, n_hit, n_fetch, n_evict, n_admit)
                if ext:  # the plain variant loses no mass
                    layer_mass[l] += smass
        _add_token(tok_counts, t, tk_req, tk_hit, tk_fetch, tk_evict, tk_admit)
        # the outputs start as zeros (simulator/args.py), which is what an untimed or plain replay would write
        if ext:
            tok_mass[t] = tmass
        if timed:
            tok_seconds[t] = now - t_start
            tok_stall[t] = stall
    clock[NOW] = now
    clock[LINK_FREE] = link_free
    scal[PREV_SEQ] = prev_seq
    scal[DECAY_BASE] = decay_base


OWN_LISTS, OWN_KEYED = range(2)  # the policies whose plain-variant requests run in a loop of their own


def _own_requests(hit, insert, uses_next):
    """A step's requests in the plain variant under one policy's hooks, called directly: the generic request
    loop's fetch-all path (every miss fetched and inserted, ticks tick0 + r; ``uses_next``: the expert's next
    request is kept for its hooks; a hit runs the hit hook when the call's ``move`` is set: FIFO shares LRU's
    loop); without a clock, a host-RAM tier or a decision record, a leaner loop still. Returns (requests,
    hits, fetches, evictions, now, stall, link_free)."""

    @njit(inline="always")
    def requests(a):
        (move, sel, next_req, t, l, base, tick0, now, stall, link_free, timed, tiered, ram, s_vram, s_fetch_ram,
         s_fetch_nvme, s_writeback, record, ob, fo, po, heap, prm, pool, outcome, tok_counts, layer_counts,
         counting) = a
        n_req = n_hit = n_fetch = n_evict = 0
        if not (timed or tiered or record):  # the cache alone: a loop with the fewest live values (~8% faster)
            for r in range(sel.shape[2]):
                e = sel[t, l, r]
                if e < 0:
                    continue
                o = base + e
                if uses_next:
                    fo[o, NREQ] = next_req[t, l, r]
                n_req += 1
                if ob[o, RES] != 0:
                    n_hit += 1
                    if move:
                        hit(ob, fo, po, heap, prm, pool, o, tick0 + r, True)
                    continue
                n_fetch += 1
                if insert(ob, fo, po, heap, prm, pool, o, tick0 + r) >= 0:
                    n_evict += 1
            return n_req, n_hit, n_fetch, n_evict, now, stall, link_free
        for r in range(sel.shape[2]):
            e = sel[t, l, r]
            if e < 0:
                continue
            o = base + e
            if uses_next:
                fo[o, NREQ] = next_req[t, l, r]
            n_req += 1
            if ob[o, RES] != 0:
                n_hit += 1
                if move:
                    hit(ob, fo, po, heap, prm, pool, o, tick0 + r, True)
                if timed:
                    now += s_vram
                if record:
                    outcome[t, l, r] = miss.OUTCOME_HIT
                continue
            n_fetch += 1
            nvme = tiered and _from_nvme(o, ram, ob, po)
            if nvme:
                _bump(tok_counts, layer_counts, t, l, FETCHES_NVME, counting)
            if timed:
                now, link_free, _, stall = _sync_fetch(now, link_free, now, stall,
                                                       s_fetch_nvme if nvme else s_fetch_ram, s_vram)
            if insert(ob, fo, po, heap, prm, pool, o, tick0 + r) >= 0:
                n_evict += 1
                if timed:
                    link_free = max(now, link_free) + s_writeback
            if record:
                outcome[t, l, r] = miss.OUTCOME_FETCH
        return n_req, n_hit, n_fetch, n_evict, now, stall, link_free

    return requests


_list_requests = _own_requests(lists.move_to_front, lists.insert_front, False)  # LRU, and FIFO without moving
_keyed_requests = _own_requests(registry.KEYED_HIT, registry.KEYED_INSERT, True)


@njit(inline="always")
def _own_step(own, a):
    """The step's requests in the loop of policy ``own`` (OWN_LISTS or OWN_KEYED); ``a``: the arguments of
    _own_requests' loop, as a tuple."""
    if own == OWN_LISTS:
        return _list_requests(a)
    return _keyed_requests(a)


@njit(inline="always")
def _add(counts, i, n_req, n_hit, n_fetch, n_evict, n_admit):
    """Add a step's frequent counters (kept in locals) into row i."""
    counts[i, REQUESTS] += n_req
    counts[i, HITS] += n_hit
    counts[i, MISSES] += n_req - n_hit
    counts[i, FETCHES] += n_fetch
    counts[i, EVICTIONS] += n_evict
    counts[i, ADMISSIONS] += n_admit


@njit(inline="always")
def _add_token(tok_counts, t, n_req, n_hit, n_fetch, n_evict, n_admit):
    """Add a token's frequent counters (summed over its layers in locals) into its column: counter-major,
    so that a token writes these six streams and leaves the rare counters' memory untouched."""
    tok_counts[REQUESTS, t] += n_req
    tok_counts[HITS, t] += n_hit
    tok_counts[MISSES, t] += n_req - n_hit
    tok_counts[FETCHES, t] += n_fetch
    tok_counts[EVICTIONS, t] += n_evict
    tok_counts[ADMISSIONS, t] += n_admit


@njit(inline="always")
def _bump(tok_counts, layer_counts, t, l, c, counting):
    """Count a rarer event straight into its token's column and (when counted) its layer's row."""
    tok_counts[c, t] += 1
    if counting:
        layer_counts[l, c] += 1
