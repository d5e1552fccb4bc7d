"""The ext replay: every miss policy, background admission, prefetch, the overlapped clock, the engine's
step semantics (--step-pin, --max-uploads), the low-bit tier and the step seam. A template that
simulator/kernels.py compiles per eviction policy: the policy's hooks are inlined where requests hit (HIT)
and are fetched (INSERT; of the structure kinds only a list's insertion, the others called), and arrive as
function pointers too (``hit``, ``insert``, ``rekey``: policies/hooks.py ``compiled``) for the rarer paths,
which arrive as function pointers themselves (``step_rule`` ... ``apply_pins``: simulator/paths.py), compiled
once for every kernel. So the part compiled per policy is this loop and nothing else.

Each step's selection is copied into the state's step row (State.row, row_w, row_wm) before its requests
are handled: the seam where the replay's step rule (``step_rule``, set when ``policy.step`` is) may rewrite
which experts the step runs and their weights.

The semantics are docs/replay-semantics.md's; tests/reference_replay.py is the slow reference this
kernel matches count for count, second for second.
"""

from typing import Any

import numpy as np

from moesim.policies import miss
from moesim.policies import prefetch as pfp
from moesim.policies import reroute as reroute_mod
from moesim.policies.structures import CAP, EXTRA_EVICTIONS, LASTREQ, MARK, NREQ, QUEUED, REQS, RES, SCORE
from moesim.simulator import overlap
from moesim.simulator import step_pin as pin
from moesim.simulator.counters import (
    ADMISSIONS,
    CAPPED,
    DECAY_BASE,
    EVICTIONS,
    FETCHES,
    FETCHES_NVME,
    FIRST_CHOICE_CHANGED,
    HITS,
    LINK_FREE,
    MISSES,
    NOW,
    PREFETCH_USED,
    PREV_SEQ,
    REQUESTS,
    REROUTED,
    RESCALE,
    S_CPU_HANDOFF,
    S_CPU_NVME,
    S_CPU_RAM,
    S_DENSE_LAYER,
    S_EXPERT_VRAM,
    S_FETCH_NVME,
    S_FETCH_RAM,
    S_LOWBIT_VRAM,
    S_ROUTER_SYNC,
    S_WRITEBACK,
)
from moesim.simulator.host_ram import from_nvme
from moesim.simulator.miss_paths import admit_engine, layer_cold, lowbit_fetch, pinned_hits, sync_fetch, tier_run
from moesim.simulator.pin_events import first_event
from moesim.simulator.prefetch_state import PF_INFLIGHT, PF_LANDED, PF_NONE
from moesim.simulator.prefetch_state import reset as pf_reset
from moesim.simulator.reset import clocked, first_ticks

# Bound per specialization (simulator/kernels.py): the inlinable hooks, of a custom policy or of every structure
# kind (policies/kinds.py). The template is never compiled itself.
HIT: Any = None
INSERT: Any = None
ENGINE = True  # the engine family: --step-pin, --max-uploads and the low-bit paths compiled in (else left out)


def replay(steps, policy, setup, state, out, hit, insert, rekey, step_rule, prefetch, late_hit, lose, cpu_run, land,
           upload, reset_state, apply_pins):
    """Replay the tokens of ``steps`` (tokens steps.t0 .. steps.t0 + T - 1 of the trace; simulator/args.py
    names every array) continuing from ``state``: a whole trace in one call, or a streamed trace chunk by
    chunk with the same state. Adds counters into out.layer_counts/layer_mass (tokens from
    policy.warmup_tokens on) and, per token of the chunk, into out.tok_counts (counter-major, from zeros);
    sets out.tok_mass and, when clocked, out.tok_seconds/tok_stall; with a decision record (out.outcome
    non-empty), each request's outcome and substitute. steps.sel entries < 0 are padding (batched routing);
    steps.w: the weights the miss policy reads; steps.wm: the gate mass a substitution or drop loses."""
    sel, w, wm, cand, next_req, tok_seq = steps.sel, steps.w, steps.wm, steps.cand, steps.next_req, steps.tok_seq
    t0 = steps.t0
    ob, fo, po, heap, spin = state.objs, state.objf, state.pools, state.heap, state.spin
    queue, queue_t, qhl = state.queue, state.queue_t, state.queue_hl
    row, row_w, row_wm = state.row, state.row_w, state.row_wm
    clock, scal = state.clock, state.scal
    layer_counts, layer_mass, tok_counts, tok_mass = out.layer_counts, out.layer_mass, out.tok_counts, out.tok_mass
    tok_seconds, tok_stall = out.tok_seconds, out.tok_stall
    outcome, substituted, rec_sel = out.outcome, out.substitute, out.selected
    row_next, last_req = state.row_next, state.last_req
    rerouting = policy.step != reroute_mod.NONE
    recent = rerouting and policy.step_resident != reroute_mod.RESIDENT_CACHE
    pool_of_layer, cost, lowbit_res = setup.pool_of_layer, setup.cost, setup.lowbit_res
    prm, miss_code, theta, beta = policy.prm, policy.miss, policy.theta, policy.beta
    warmup, reset_per_seq = policy.warmup_tokens, policy.reset_per_seq
    step_pin = policy.step_pin if ENGINE else False
    adm_w = policy.admit_window  # --admission second-touch:W (0: every fetched expert is admitted)
    max_up = policy.max_uploads
    engine = (step_pin or max_up > 0) if ENGINE else False
    tier = False  # a low-bit tier (--lowbit-share): misses with a resident low-bit copy run it
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
    uses_next, uses_score, admits, pin_mode = policy.uses_next, policy.uses_score, policy.admits, policy.pin_mode
    half_life = prm[0] if uses_score else 0.0
    timed = clocked(cost)  # without a cost model every time is zero: the clock arithmetic is skipped
    if t0 == 0:
        first_ticks(steps.first_req, fo)
    # hoisted: array loads inside the loop could not be, stores to other arrays may alias them
    s_dense_layer, s_vram = cost[S_DENSE_LAYER], cost[S_EXPERT_VRAM]
    s_fetch_ram, s_fetch_nvme = cost[S_FETCH_RAM], cost[S_FETCH_NVME]
    s_cpu_ram, s_cpu_nvme = cost[S_CPU_RAM], cost[S_CPU_NVME]
    s_handoff, s_writeback = cost[S_CPU_HANDOFF], cost[S_WRITEBACK]
    s_lowbit_vram, s_sync = cost[S_LOWBIT_VRAM], cost[S_ROUTER_SYNC]
    cpu_ov = policy.cpu_overlap and timed  # a step's CPU experts run on the host beside its GPU work
    substitutes = miss_code == miss.THRESHOLD or miss_code == miss.FIRST_CHOICE or miss_code == miss.SUBSTITUTE_ALL
    copies = beta > 0.0 and admits
    # overlap (simulator/overlap.py) and prefetch (simulator/prefetch.py): off, they leave the loop as it was
    ov = policy.overlap if timed else 0
    prefetching = policy.prefetch != pfp.NONE and admits  # pinned evictions never admit: nothing to prefetch
    pf = state.pf
    t_r = h = h0 = lk0 = 0.0
    m_link = np.int64(0)  # not a literal 0 (see n_up)
    now = clock[NOW]
    link_free = clock[LINK_FREE]
    prev_seq = scal[PREV_SEQ]
    decay_base = scal[DECAY_BASE]
    inc = 1.0
    pin_ev = setup.pin_events  # a re-pinning placement's swaps (simulator/pin_events.py), at their tokens' start
    pin_i = first_event(pin_ev, t0) if pin_ev.shape[0] else 0

    for t in range(T):
        tg = t0 + t  # the token's index in the whole trace
        t_start = now
        stall = 0.0
        if tg == 0 or (reset_per_seq and tok_seq[t] != prev_seq):
            reset_state(setup, ob, fo, po, qhl)
            warm = setup.warm_objs
            nw = warm.shape[0]
            for i in range(nw):
                o = warm[i]
                insert(ob, fo, po, heap, prm, pool_of_layer[o // E], o, -2 * (nw - i) - 1)
            if prefetching:
                pf_reset(pf, state.pf_scal)
            if recent:
                for o in range(n_obj):
                    last_req[o] = reroute_mod.NEVER_USED
            if adm_w > 0:  # second-touch forgets the requests before the reset (the pools' counts are reset)
                for o in range(n_obj):
                    fo[o, LASTREQ] = -1.0
            decay_base = tg
        prev_seq = tok_seq[t]
        if uses_score and half_life > 0.0:
            inc = 2.0 ** ((tg - decay_base) / half_life)
            if inc > RESCALE:
                for o in range(n_obj):
                    fo[o, SCORE] /= inc
                    rekey(ob, fo, po, heap, prm, pool_of_layer[o // E], o)
                decay_base = tg
                inc = 1.0
        counting = tg >= warmup
        if pin_i < pin_ev.shape[0] and pin_ev[pin_i, 0] == tg:
            pin_i, now, link_free, stall = apply_pins(pin_ev, pin_i, tg, t, E, ob, po, ram, tiered, counting,
                                                      tok_counts, layer_counts, timed, s_fetch_ram, s_fetch_nvme,
                                                      s_writeback, now, link_free, stall)
        tmass = 0.0
        tk_req = tk_hit = tk_fetch = tk_evict = tk_admit = 0  # the token's frequent counters, over its layers

        for l in range(L):
            pool = pool_of_layer[l]
            base = l * E
            step = tg * L + l
            tick0 = step * (E + k)  # the step's ticks: tick0 + i for its admissions, tick0 + E + r for rank r
            n_req = n_hit = n_fetch = n_evict = n_admit = 0
            n_up = np.int64(0)  # not a literal 0: the helper it is passed to would be compiled twice
            smass = 0.0
            ran_cpu = False
            if timed:
                now += s_dense_layer
            t_r = now  # the router decision
            if ov:
                h = h0 = overlap.NEG
                lk0 = now
                m_link = np.int64(0)
            if qhl[l, 1] > 0 and queue_t[l, qhl[l, 0]] <= now:
                n_admit, n_evict, link_free = land(insert, prm, pool, l, tick0, now, link_free, s_writeback, ob,
                                                   fo, po, heap, queue, queue_t, qhl, pf)
            if s_sync != 0.0 and layer_cold(ob, base, E):  # the host reads the router's output back first
                now += s_sync
                t_r = now
                lk0 = now
            cpu_end = now  # cpu_ov: the host's timeline from the router decision
            if rerouting:  # the step seam: a step policy rewrites the row from the step's candidate scores
                n_rr, displaced, changed = step_rule(policy, steps, state, fo, t, l, base, tg, rekey, pool)
                if n_rr:  # the router's experts rerouted away lose their gate mass, as substituted ones do
                    smass += displaced
                    tok_counts[REROUTED, t] += n_rr
                    tok_counts[FIRST_CHOICE_CHANGED, t] += changed
                    out.tok_displaced[t] += displaced
                    if counting:
                        layer_counts[l, REROUTED] += n_rr
                        layer_counts[l, FIRST_CHOICE_CHANGED] += changed
                        out.layer_displaced[l] += displaced
            else:
                for r in range(k):
                    row[r] = sel[t, l, r]
                    row_w[r] = w[t, l, r]
                    row_wm[r] = wm[t, l, r]
                    row_next[r] = next_req[t, l, r]
            if record:
                for r in range(k):
                    rec_sel[t, l, r] = row[r]
            if substitutes:  # a substitute may not be one of the step's selected experts
                for r in range(k):
                    if row[r] >= 0:
                        fo[base + row[r], MARK] = step
            if ENGINE and step_pin:  # the step's hits first (in rank order), then its misses below
                if adm_w > 0:  # the hits are its pool's requests first (second-touch counts them in that order)
                    for r in range(k):
                        if row[r] >= 0 and ob[base + row[r], RES] != 0:
                            ri = po[pool, REQS]
                            po[pool, REQS] = ri + 1
                            fo[base + row[r], LASTREQ] = ri
                pin.mark(row, base, step, spin)
                n_hit, now = pinned_hits(hit, prm, pool, row, row_next, t, l, base, tick0 + E, uses_next, uses_score,
                                         inc, timed, s_vram, now, record, ob, fo, po, heap, outcome)
                n_req = n_hit
                pin.raise_hits(pin_mode, row, base, pool, ob, po, heap, spin)
            copy_end = now  # --step-pin: the step's copies go onto the link together, from here

            for r in range(k):
                e = row[r]
                if e < 0:
                    continue
                o = base + e
                if recent:
                    last_req[o] = tg
                if step_pin and ob[o, RES] != 0:
                    continue  # a hit, handled above
                tick = tick0 + E + (n_req if step_pin else r)  # --step-pin: ticks in the order handled
                if uses_next and row_next[r] >= 0:  # (an expert rerouted in keeps its next router request)
                    fo[o, NREQ] = row_next[r]
                if uses_score:
                    fo[o, SCORE] += inc
                n_req += 1
                second = True  # second-touch: requested within the window (always true without the rule)
                if adm_w > 0:
                    ri = po[pool, REQS]
                    po[pool, REQS] = ri + 1
                    second = fo[o, LASTREQ] >= 0.0 and ri - fo[o, LASTREQ] <= adm_w
                    fo[o, LASTREQ] = ri
                if ob[o, RES] != 0:
                    n_hit += 1
                    HIT(ob, fo, po, heap, prm, pool, o, tick, True)
                    if timed:
                        now += s_vram
                    if prefetching and pf[o] == PF_LANDED:
                        pf[o] = PF_NONE
                        tok_counts[PREFETCH_USED, t] += 1
                        if counting:
                            layer_counts[l, PREFETCH_USED] += 1
                    if record:
                        outcome[t, l, r] = miss.OUTCOME_HIT
                    continue
                if prefetching and pf[o] == PF_INFLIGHT:  # its prefetch is still in flight: wait for it
                    n_hit += 1
                    v, now, h, m_link, stall, link_free = late_hit(
                        insert, prm, pool, o, tick, t, l, t_r, ov, now, h, m_link, stall, link_free, timed, s_vram,
                        s_writeback, ob, fo, po, heap, state.pf, state.pf_t, tok_counts, layer_counts, counting)
                    n_evict += v
                    if record:
                        outcome[t, l, r] = miss.OUTCOME_HIT
                    continue
                wr = row_w[r]
                action = miss.decide(miss_code, r, wr, theta)
                if ENGINE and tier and lowbit_res[o]:
                    if timed:
                        now += s_lowbit_vram
                    link_free = tier_run(o, l, wr, t_r if ov else now, link_free, cost, timed, tiered, ram, copies,
                                         beta, ob, fo, po, queue, queue_t, qhl, tok_counts, layer_counts, t, counting)
                    if record:
                        outcome[t, l, r] = miss.OUTCOME_LOWBIT
                    continue
                if action == miss.FETCH:
                    n_fetch += 1
                    nvme = tiered and from_nvme(o, ram, ob, po)
                    if nvme:
                        tok_counts[FETCHES_NVME, t] += 1
                        if counting:
                            layer_counts[l, FETCHES_NVME] += 1
                    if timed:
                        if ov:
                            link_free, h, lk0, h0, m_link = overlap.fetch(
                                t_r, link_free, s_fetch_nvme if nvme else s_fetch_ram, s_vram, h, lk0, h0, m_link)
                        else:
                            if not step_pin:
                                copy_end = now
                            now, link_free, copy_end, stall = sync_fetch(
                                now, link_free, copy_end, stall, s_fetch_nvme if nvme else s_fetch_ram, s_vram)
                    if prefetching and pf[o] == PF_LANDED:
                        pf[o] = PF_NONE  # evicted before use, fetched again
                    if admits and second:  # else fetched for this use only
                        if ENGINE and engine:  # --step-pin or --max-uploads
                            v, n_up = admit_engine(insert, pin_mode, prm, pool, o, tick, step, n_up, max_up, step_pin,
                                                   ob, fo, po, heap, spin, tok_counts, layer_counts, t, l, counting)
                        else:
                            v = INSERT(ob, fo, po, heap, prm, pool, o, tick)
                        if v >= 0:
                            n_evict += 1
                            if timed:
                                link_free = max(t_r if ov else now, link_free) + s_writeback
                    if record:
                        outcome[t, l, r] = miss.OUTCOME_FETCH
                    continue
                if ENGINE and action == miss.LOWBIT:
                    if not step_pin:
                        copy_end = now
                    now, link_free, copy_end, stall = lowbit_fetch(o, l, wr, now, link_free, copy_end, stall, cost,
                                                                   timed, tiered, ram, copies, beta, ob, fo, po,
                                                                   queue, queue_t, qhl, tok_counts, layer_counts, t,
                                                                   counting)
                    if record:
                        outcome[t, l, r] = miss.OUTCOME_LOWBIT
                    continue
                if action == miss.CPU or action == miss.HYBRID:
                    ran_cpu = True
                    if cpu_ov:
                        cpu_end = cpu_run(o, l, t, cpu_end, timed, tiered, ram, s_cpu_ram, s_cpu_nvme, ob, po,
                                          tok_counts, layer_counts, counting)
                    else:
                        now = cpu_run(o, l, t, now, timed, tiered, ram, s_cpu_ram, s_cpu_nvme, ob, po, tok_counts,
                                      layer_counts, counting)
                    if action == miss.HYBRID and admits and ob[o, QUEUED] == 0:  # and upload it for later tokens
                        if max_up > 0 and n_up >= max_up:
                            tok_counts[CAPPED, t] += 1
                            if counting:
                                layer_counts[l, CAPPED] += 1
                        else:
                            n_up += 1
                            link_free = upload(o, l, t_r if ov else now, link_free, cost, timed, ob, queue, queue_t,
                                               qhl, tok_counts, layer_counts, t, counting)
                    if record:
                        outcome[t, l, r] = miss.OUTCOME_CPU
                    continue
                # substituted or dropped: the step loses this expert's gate weight
                lost, now, link_free = lose(hit, action, r, o, wr, row_wm[r], prm, pool, cand, t, l, base, step, tick,
                                            t_r, ov, now, link_free, cost, timed, tiered, ram, copies, beta, ob, fo,
                                            po, heap, queue, queue_t, qhl, tok_counts, layer_counts, counting, record,
                                            outcome, substituted)
                smass += lost

            x = po[pool, EXTRA_EVICTIONS]  # evicted beyond the insertions' victims (slru, lirs): written back last
            if x:
                po[pool, EXTRA_EVICTIONS] = 0
                n_evict += x
                if timed:
                    link_free = max(t_r if ov else now, link_free) + x * s_writeback
            if ENGINE and step_pin:
                pin.restore(pin_mode, row, base, pool, ob, po, heap, spin)
            if cpu_ov:  # the CPU experts ran beside the GPU's: the later of the two ends the experts
                now = max(now, cpu_end)
            if timed and ran_cpu:
                now += s_handoff
            if prefetching:
                link_free = prefetch(policy, steps, setup, state, t, l, t_r, link_free, tiered, timed, tok_counts,
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
                layer_counts[l, REQUESTS] += n_req
                layer_counts[l, HITS] += n_hit
                layer_counts[l, MISSES] += n_req - n_hit
                layer_counts[l, FETCHES] += n_fetch
                layer_counts[l, EVICTIONS] += n_evict
                layer_counts[l, ADMISSIONS] += n_admit
                layer_mass[l] += smass
        tok_counts[REQUESTS, t] += tk_req
        tok_counts[HITS, t] += tk_hit
        tok_counts[MISSES, t] += tk_req - tk_hit
        tok_counts[FETCHES, t] += tk_fetch
        tok_counts[EVICTIONS, t] += tk_evict
        tok_counts[ADMISSIONS, t] += tk_admit
        tok_mass[t] = tmass
        if timed:
            tok_seconds[t] = now - t_start
            tok_stall[t] = stall
    clock[NOW] = now
    clock[LINK_FREE] = link_free
    scal[PREV_SEQ] = prev_seq
    scal[DECAY_BASE] = decay_base
