"""The replay kernel: one numba loop over (token, layer, rank) for one policy config.

It only computes on arrays (no I/O, no Python objects); its arguments are five named groups
built by one function (simulator/args.py), and policies arrive as plain int codes whose hooks the
registry dispatches (policies/registry.py, policies/miss.py). The public entry point that validates
and converts is simulator.driver.simulate. The semantics are in docs/replay-semantics.md;
tests/reference_replay.py is the slow reference this kernel must match count for count.
"""

from numba import njit

from moesim.policies import miss, registry
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
from moesim.traces.derived import NEVER

# counter columns (per layer and per token)
COUNTER_NAMES = ("requests", "hits", "misses", "fetches", "substitutions", "drops", "cpu", "admissions",
                 "first_choice_substitutions", "evictions", "fetches_nvme", "cpu_nvme", "copies", "copies_nvme")
(REQUESTS, HITS, MISSES, FETCHES, SUBSTITUTIONS, DROPS, CPU, ADMISSIONS, FIRST_CHOICE_SUBS, EVICTIONS,
 FETCHES_NVME, CPU_NVME, COPIES, COPIES_NVME) = range(len(COUNTER_NAMES))
N_COUNTERS = len(COUNTER_NAMES)
# cost columns: seconds per operation (simulator/args.py kernel_costs); all zero replays without a clock
COST_NAMES = ("dense_layer", "expert_vram", "fetch_ram", "fetch_nvme", "cpu_ram", "cpu_nvme", "copy_ram",
              "copy_nvme", "cpu_handoff", "writeback")
(S_DENSE_LAYER, S_EXPERT_VRAM, S_FETCH_RAM, S_FETCH_NVME, S_CPU_RAM, S_CPU_NVME, S_COPY_RAM, S_COPY_NVME,
 S_CPU_HANDOFF, S_WRITEBACK) = range(len(COST_NAMES))
N_COSTS = len(COST_NAMES)

_RESCALE = 1e150  # decayed frequency scores are rescaled before they overflow
_FLAGS = registry.FLAGS  # frozen into the compiled kernel as a constant


@njit(inline="always")
def _tick(pos, E, k):
    """A request's position (t * L + l) * k + r in replay order -> its tick. Step s = t * L + l owns
    the ticks [s(E+k), (s+1)(E+k)): its background admissions take s(E+k) + i, its requests
    s(E+k) + E + rank, so ticks order every event of the replay."""
    if pos >= NEVER:
        return NEVER
    return (pos // k) * (E + k) + E + pos % k


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


@njit(cache=True, _nrt=False)  # type: ignore[call-overload]
def replay(steps, policy, setup, state, out):
    """Replay every (token, layer) step (simulator/args.py names every array); add counters into
    out.layer_counts/layer_mass (tokens from policy.warmup_tokens on) and out.tok_counts/tok_mass/
    tok_seconds/tok_stall (every token); with a decision record (out.outcome non-empty), each
    request's outcome and substitute. steps.sel entries < 0 are padding (batched routing);
    steps.w: the weights the miss policy reads; steps.wm: the gate mass a substitution or drop loses."""
    sel, w, wm, cand, next_req, tok_seq = steps.sel, steps.w, steps.wm, steps.cand, steps.next_req, steps.tok_seq
    ob, fo, po, heap = state.objs, state.objf, state.pools, state.heap
    queue, queue_t, qhl, sc = state.queue, state.queue_t, state.queue_hl, state.step_counts
    layer_counts, layer_mass, tok_counts, tok_mass = out.layer_counts, out.layer_mass, out.tok_counts, out.tok_mass
    outcome, substitute = out.outcome, out.substitute
    pool_of_layer, cost = setup.pool_of_layer, setup.cost
    code, prm, miss_code, theta, beta = policy.evict, policy.prm, policy.miss, policy.theta, policy.beta
    T, L, k = sel.shape
    M = cand.shape[2]
    n_obj = ob.shape[0]
    E = n_obj // L
    ram = po.shape[0] - 1
    record = outcome.shape[0] > 0
    admits = _FLAGS[code, registry.ADMITS]
    uses_score = _FLAGS[code, registry.USES_SCORE]
    uses_next = _FLAGS[code, registry.USES_NEXT_REQUEST]
    half_life = prm[0] if uses_score else 0.0
    for o in range(n_obj):
        ob[o, NREQ] = _tick(steps.first_req[o], E, k)
        ob[o, MARK] = -1
    # hoisted: array loads inside the loop could not be, stores to other arrays may alias them
    s_dense_layer, s_vram = cost[S_DENSE_LAYER], cost[S_EXPERT_VRAM]
    s_fetch_ram, s_fetch_nvme = cost[S_FETCH_RAM], cost[S_FETCH_NVME]
    s_cpu_ram, s_cpu_nvme = cost[S_CPU_RAM], cost[S_CPU_NVME]
    s_copy_ram, s_copy_nvme = cost[S_COPY_RAM], cost[S_COPY_NVME]
    s_handoff, s_writeback = cost[S_CPU_HANDOFF], cost[S_WRITEBACK]
    substitutes = miss_code == miss.THRESHOLD or miss_code == miss.FIRST_CHOICE or miss_code == miss.SUBSTITUTE_ALL
    decay_base = 0
    inc = 1.0
    now = 0.0        # simulated seconds
    link_free = 0.0  # when the host-to-GPU link finishes its queued copies

    for t in range(T):
        t_start = now
        stall = 0.0
        if t == 0 or (policy.reset_per_seq and tok_seq[t] != tok_seq[t - 1]):
            _reset(policy, setup, E, ob, fo, po, heap, qhl)
            decay_base = t
        if half_life > 0.0:
            inc = 2.0 ** ((t - decay_base) / half_life)
            if inc > _RESCALE:
                for o in range(n_obj):
                    fo[o, SCORE] /= inc
                    registry.rekey(code, ob, fo, po, heap, prm, pool_of_layer[o // E], o)
                decay_base = t
                inc = 1.0

        for l in range(L):
            pool = pool_of_layer[l]
            base = l * E
            step = t * L + l
            for c in range(N_COUNTERS):
                sc[c] = 0
            smass = 0.0
            now += s_dense_layer
            # background copies of this layer's experts that have completed are admitted first
            i = 0
            while qhl[l, 1] > 0 and queue_t[l, qhl[l, 0]] <= now:
                o = queue[l, qhl[l, 0]]
                qhl[l, 0] = (qhl[l, 0] + 1) % E
                qhl[l, 1] -= 1
                ob[o, QUEUED] = 0
                if ob[o, RES] == 0:
                    v = _admit(code, prm, pool, o, step * (E + k) + i, ob, fo, po, heap)
                    if v != registry.NOT_ADMITTED:
                        sc[ADMISSIONS] += 1
                    if v >= 0:
                        sc[EVICTIONS] += 1
                        link_free = max(now, link_free) + s_writeback
                    i += 1
            if substitutes:  # a substitute may not be one of the step's selected experts
                for r in range(k):
                    if sel[t, l, r] >= 0:
                        ob[base + sel[t, l, r], MARK] = step
            n_req = 0
            n_hit = 0

            for r in range(k):
                if sel[t, l, r] < 0:
                    continue
                o = base + sel[t, l, r]
                tick = step * (E + k) + E + r
                if uses_next:
                    ob[o, NREQ] = _tick(next_req[t, l, r], E, k)
                if uses_score:
                    fo[o, SCORE] += inc
                n_req += 1
                if ob[o, RES] != 0:
                    n_hit += 1
                    registry.hit(code, ob, fo, po, heap, prm, pool, o, tick, True)
                    now += s_vram
                    if record:
                        outcome[t, l, r] = miss.OUTCOME_HIT
                    continue
                wr = w[t, l, r]
                action = miss.decide(miss_code, r, wr, theta)
                if action == miss.FETCH:
                    sc[FETCHES] += 1
                    start = max(now, link_free)  # behind any queued background copy
                    stall += start - now
                    if _from_nvme(o, ram, ob, po):
                        sc[FETCHES_NVME] += 1
                        link_free = start + s_fetch_nvme
                    else:
                        link_free = start + s_fetch_ram
                    now = link_free + s_vram
                    if admits and _admit(code, prm, pool, o, tick, ob, fo, po, heap) >= 0:
                        sc[EVICTIONS] += 1
                        link_free = max(now, link_free) + s_writeback
                    if record:
                        outcome[t, l, r] = miss.OUTCOME_FETCH
                    continue
                if action == miss.CPU:
                    sc[CPU] += 1
                    if _from_nvme(o, ram, ob, po):
                        sc[CPU_NVME] += 1
                        now += s_cpu_nvme
                    else:
                        now += s_cpu_ram
                    if record:
                        outcome[t, l, r] = miss.OUTCOME_CPU
                    continue
                # substituted or dropped: the step loses this expert's gate weight
                sub = -1
                if action == miss.SUBSTITUTE:
                    for j in range(M):
                        c = base + cand[t, l, j]
                        if c >= base and ob[c, RES] != 0 and ob[c, MARK] != step:
                            sub = c
                            break
                if sub >= 0:
                    ob[sub, MARK] = step
                    sc[SUBSTITUTIONS] += 1
                    registry.hit(code, ob, fo, po, heap, prm, pool, sub, tick, False)
                    now += s_vram
                    if record:
                        outcome[t, l, r] = miss.OUTCOME_SUBSTITUTE
                        substitute[t, l, r] = sub - base
                else:
                    sc[DROPS] += 1
                    if record:
                        outcome[t, l, r] = miss.OUTCOME_DROP
                smass += wm[t, l, r]
                if r == 0:
                    sc[FIRST_CHOICE_SUBS] += 1
                if beta > 0.0 and admits:
                    fo[o, ACC] += wr
                    if fo[o, ACC] >= beta and ob[o, QUEUED] == 0:
                        fo[o, ACC] = 0.0
                        # a background copy: occupies the link after what is queued on it
                        start = max(now, link_free)
                        sc[COPIES] += 1
                        if _from_nvme(o, ram, ob, po):
                            sc[COPIES_NVME] += 1
                            link_free = start + s_copy_nvme
                        else:
                            link_free = start + s_copy_ram
                        ob[o, QUEUED] = 1
                        q = (qhl[l, 0] + qhl[l, 1]) % E
                        queue[l, q] = o
                        queue_t[l, q] = link_free
                        qhl[l, 1] += 1

            if sc[CPU] > 0:
                now += s_handoff
            sc[REQUESTS] = n_req
            sc[HITS] = n_hit
            sc[MISSES] = n_req - n_hit
            for c in range(N_COUNTERS):
                tok_counts[t, c] += sc[c]
            tok_mass[t] += smass
            if t >= policy.warmup_tokens:
                for c in range(N_COUNTERS):
                    layer_counts[l, c] += sc[c]
                layer_mass[l] += smass
        out.tok_seconds[t] = now - t_start
        out.tok_stall[t] = stall
