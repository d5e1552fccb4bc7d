"""The plain replay: every miss fetched (fetch-all) and admitted, a fixed placement, none of the engine features
(--admission second-touch and the re-pinning placements run on the ext kernel: simulator/args.py family_of). A template:
simulator/kernels.py compiles one copy per eviction policy, with the policy's hooks bound to HIT and
INSERT and inlined where requests are handled. (A copy without the clock, the host-RAM tier and the
decision record compiled in gained 1.26x on the LRU and FIFO kernel alone but 1.10x on `moesim profile` end
to end: retired, docs/performance.md.)

The semantics are docs/replay-semantics.md's; tests/reference_replay.py is the slow reference this
kernel matches count for count, second for second.
"""

from typing import Any

from moesim.policies.miss import OUTCOME_FETCH, OUTCOME_HIT
from moesim.policies.structures import CAP, EXTRA_EVICTIONS, NREQ, RES, SCORE
from moesim.simulator.counters import (
    DECAY_BASE,
    EVICTIONS,
    FETCHES,
    FETCHES_NVME,
    HITS,
    LINK_FREE,
    MISSES,
    NOW,
    PREV_SEQ,
    REQUESTS,
    RESCALE,
    S_DENSE_LAYER,
    S_EXPERT_VRAM,
    S_FETCH_NVME,
    S_FETCH_RAM,
    S_ROUTER_SYNC,
    S_WRITEBACK,
)
from moesim.simulator.host_ram import from_nvme
from moesim.simulator.miss_paths import layer_cold
from moesim.simulator.reset import first_ticks, reset_state

# Bound per specialization (simulator/kernels.py); the template itself is never compiled.
HIT: Any = None          # the policy's hit hook, inlined
INSERT: Any = None       # its insert hook, inlined
INSERT_CALL: Any = None  # its insert hook, out of line (the warm set at a reset)
REKEY_CALL: Any = None   # its rekey hook, out of line (rescaled scores)
USES_NEXT = False        # the policy reads each expert's next request
USES_SCORE = False       # ... its decayed request score
ADMITS = True            # False for pinned placements: a fetch is for this use only
EXTRA = False            # the policy evicts beyond its insertions' victims (registry extra_evictions: slru, lirs)


def replay(steps, policy, setup, state, out):
    """Replay the tokens of ``steps`` (tokens steps.t0 .. steps.t0 + T - 1 of the trace; simulator/args.py
    names every array) continuing from ``state``. Adds counters into out.layer_counts (tokens from
    policy.warmup_tokens on) and, per token, into out.tok_counts (counter-major, from zeros); sets
    out.tok_seconds/tok_stall in a clocked replay; with a decision record, each request's outcome."""
    sel, next_req, tok_seq, t0 = steps.sel, steps.next_req, steps.tok_seq, steps.t0
    ob, fo, po, heap = state.objs, state.objf, state.pools, state.heap
    clock, scal = state.clock, state.scal
    layer_counts, tok_counts = out.layer_counts, out.tok_counts
    tok_seconds, tok_stall, outcome = out.tok_seconds, out.tok_stall, out.outcome
    pool_of_layer, cost, prm = setup.pool_of_layer, setup.cost, policy.prm
    warmup, reset_per_seq = policy.warmup_tokens, policy.reset_per_seq
    T, L, k = sel.shape
    n_obj = ob.shape[0]
    E = n_obj // L
    ram = po.shape[0] - 1
    tiered = po[ram, CAP] >= 0  # a host-RAM tier smaller than the experts: reads may come from NVMe
    record = outcome.shape[0] > 0
    timed = False  # without a cost model every time is zero: the clock arithmetic is skipped
    for c in range(cost.shape[0]):
        if cost[c] != 0.0:
            timed = True
    half_life = prm[0] if USES_SCORE else 0.0
    if t0 == 0:
        first_ticks(steps.first_req, fo)
    s_dense_layer, s_vram = cost[S_DENSE_LAYER], cost[S_EXPERT_VRAM]
    s_fetch_ram, s_fetch_nvme, s_writeback = cost[S_FETCH_RAM], cost[S_FETCH_NVME], cost[S_WRITEBACK]
    s_sync = cost[S_ROUTER_SYNC]
    now = clock[NOW]
    link_free = clock[LINK_FREE]
    prev_seq = scal[PREV_SEQ]
    decay_base = scal[DECAY_BASE]
    inc = 1.0
    for t in range(T):
        tg = t0 + t  # the token's index in the whole trace
        t_start = now
        stall = 0.0
        if tg == 0 or (reset_per_seq and tok_seq[t] != prev_seq):
            reset_state(setup, ob, fo, po, state.queue_hl)
            warm = setup.warm_objs
            nw = warm.shape[0]
            for i in range(nw):
                o = warm[i]
                INSERT_CALL(ob, fo, po, heap, prm, pool_of_layer[o // E], o, -2 * (nw - i) - 1)
            decay_base = tg
        prev_seq = tok_seq[t]
        if USES_SCORE and half_life > 0.0:
            inc = 2.0 ** ((tg - decay_base) / half_life)
            if inc > RESCALE:
                for o in range(n_obj):
                    fo[o, SCORE] /= inc
                    REKEY_CALL(ob, fo, po, heap, prm, pool_of_layer[o // E], o)
                decay_base = tg
                inc = 1.0
        counting = tg >= warmup
        tk_req = tk_hit = tk_fetch = tk_evict = 0  # the token's frequent counters, over its layers
        for l in range(L):
            pool = pool_of_layer[l]
            base = l * E
            tick = (tg * L + l) * (E + k) + E  # the ticks of the step's requests: tick + rank
            if timed:
                now += s_dense_layer
                if s_sync != 0.0 and layer_cold(ob, base, E):
                    now += s_sync
            n_req = n_hit = n_fetch = n_evict = 0
            for r in range(k):
                e = sel[t, l, r]
                if e < 0:
                    continue  # padding (a batch's union)
                o = base + e
                if USES_NEXT:
                    fo[o, NREQ] = next_req[t, l, r]
                if USES_SCORE:
                    fo[o, SCORE] += inc
                n_req += 1
                if ob[o, RES] != 0:
                    n_hit += 1
                    HIT(ob, fo, po, heap, prm, pool, o, tick + r, True)
                    if timed:
                        now += s_vram
                    if record:
                        outcome[t, l, r] = OUTCOME_HIT
                    continue
                n_fetch += 1
                nvme = tiered and from_nvme(o, ram, ob, po)
                if nvme:
                    tok_counts[FETCHES_NVME, t] += 1
                    if counting:
                        layer_counts[l, FETCHES_NVME] += 1
                if timed:  # the copy waits for the link, then the expert runs
                    start = max(now, link_free)
                    stall += start - now
                    link_free = start + (s_fetch_nvme if nvme else s_fetch_ram)
                    now = link_free + s_vram
                if ADMITS:
                    if INSERT(ob, fo, po, heap, prm, pool, o, tick + r) >= 0:
                        n_evict += 1
                        if timed:
                            link_free = max(now, link_free) + s_writeback
                if record:
                    outcome[t, l, r] = OUTCOME_FETCH
            if EXTRA:  # evicted beyond the insertions' victims (slru, lirs): written back last
                x = po[pool, EXTRA_EVICTIONS]
                if x:
                    po[pool, EXTRA_EVICTIONS] = 0
                    n_evict += x
                    if timed:
                        link_free = max(now, link_free) + x * s_writeback
            tk_req += n_req
            tk_hit += n_hit
            tk_fetch += n_fetch
            tk_evict += n_evict
            if counting:
                layer_counts[l, REQUESTS] += n_req
                layer_counts[l, HITS] += n_hit
                layer_counts[l, MISSES] += n_req - n_hit
                layer_counts[l, FETCHES] += n_fetch
                layer_counts[l, EVICTIONS] += n_evict
        tok_counts[REQUESTS, t] += tk_req
        tok_counts[HITS, t] += tk_hit
        tok_counts[MISSES, t] += tk_req - tk_hit
        tok_counts[FETCHES, t] += tk_fetch
        tok_counts[EVICTIONS, t] += tk_evict
        if timed:
            tok_seconds[t] = now - t_start
            tok_stall[t] = stall
    clock[NOW] = now
    clock[LINK_FREE] = link_free
    scal[PREV_SEQ] = prev_seq
    scal[DECAY_BASE] = decay_base

