"""The kernel's side of prefetch (--prefetch): predicting a step's targets, issuing their copies, and serving a
request whose prefetch is still in flight. The policies' records and the next-layer table are in
policies/prefetch.py, the per-expert states in simulator/prefetch_state.py; the rules in
docs/replay-semantics.md ("Prefetch")."""


from moesim.jitcache import cached_njit
from moesim.policies import prefetch as pol
from moesim.policies.structures import QUEUED, RES
from moesim.simulator.copyqueue import queue_copy
from moesim.simulator.counters import PREFETCH_LATE, PREFETCH_USED, PREFETCHES, PREFETCHES_NVME
from moesim.simulator.host_ram import from_nvme
from moesim.simulator.prefetch_state import PF_INFLIGHT, PF_STALE, PREV_SEQ, PREV_VALID


@cached_njit(_nrt=False)
def predict(mode, t, l, lt, sel, look, succ, cnt, prev, pf_scal, seq_t, score, pick):
    """The experts to prefetch for layer ``lt`` of token ``t`` at step (t, l), best first, into ``pick``;
    returns how many. ``score`` (float64 [E]) is zero on entry and on return."""
    k = sel.shape[2]
    n = 0
    if mode == pol.ORACLE:
        for r in range(k):
            if sel[t, lt, r] >= 0:
                pick[n] = sel[t, lt, r]
                n += 1
    elif mode == pol.PREV_TOKEN:
        if pf_scal[PREV_VALID] != 0 and pf_scal[PREV_SEQ] == seq_t:
            for r in range(k):
                if prev[lt, r] >= 0:
                    pick[n] = prev[lt, r]
                    n += 1
    elif mode == pol.LOOKAHEAD:
        for r in range(look.shape[2]):
            if look[t, l, r] >= 0:
                pick[n] = look[t, l, r]
                n += 1
    elif mode == pol.NEXT_LAYER:
        for r in range(k):
            e = sel[t, l, r]
            if e < 0:
                continue
            for j in range(succ.shape[2]):
                s = succ[l, e, j]
                if s < 0:
                    break
                if score[s] == 0.0:
                    pick[n] = s
                    n += 1
                score[s] += cnt[l, e, j]
        # the k best by summed count (equal sums: lower id), kept sorted at the front of pick by insertion:
        # candidate j is read before any write reaches index j
        cnt = 0
        for j in range(n):
            c = pick[j]
            v = score[c]
            if cnt == k:
                last = pick[k - 1]
                if v < score[last] or (v == score[last] and c > last):
                    continue
                pos = k - 1
            else:
                pos = cnt
                cnt += 1
            while pos > 0:
                p = pick[pos - 1]
                if v > score[p] or (v == score[p] and c < p):
                    pick[pos] = p
                    pos -= 1
                else:
                    break
            pick[pos] = c
        for r in range(k):  # the scratch back to zero (pick no longer lists every candidate)
            e = sel[t, l, r]
            if e >= 0:
                for j in range(succ.shape[2]):
                    s = succ[l, e, j]
                    if s < 0:
                        break
                    score[s] = 0.0
        n = cnt
    return n


@cached_njit(_nrt=False)
def remember(l, t, sel, prev, pf_scal, seq_t):
    """prev-token: keep step (t, l)'s selection for the next token (and, at the last layer, its sequence)."""
    for r in range(sel.shape[2]):
        prev[l, r] = sel[t, l, r]
    if l == sel.shape[1] - 1:
        pf_scal[PREV_SEQ] = seq_t
        pf_scal[PREV_VALID] = 1


@cached_njit(_nrt=False)
def serve_late(insert, prm, pool, o, tick, ob, fo, po, heap, pf):
    """A request whose expert's prefetch is still in flight waits for it: the expert is admitted now (through
    the policy's ``insert`` hook, like a fetch) and the queued copy becomes stale. Returns the victim (as
    insert)."""
    pf[o] = PF_STALE
    return insert(ob, fo, po, heap, prm, pool, o, tick)


@cached_njit(_nrt=False)
def issue(policy, steps, setup, state, t, l, t_r, link_free, tiered, timed, tok_counts, layer_counts, counting):
    """Step (t, l)'s prefetches for layer l + depth (same token): each predicted expert neither resident nor
    already queued is copied on the link behind what is there (at the earliest at the router decision
    ``t_r``) and queued to land at that layer's first step after it completes. Returns the link's free time."""
    sel, pf, ob, po = steps.sel, state.pf, state.objs, state.pools
    L = sel.shape[1]
    E = ob.shape[0] // L
    seq_t = steps.tok_seq[t]
    lt = l + policy.pf_depth
    if lt < L:
        n = predict(policy.prefetch, t, l, lt, sel, steps.look, setup.pf_succ, setup.pf_cnt, state.pf_prev,
                    state.pf_scal, seq_t, state.pf_score, state.pf_pick)
        ram = po.shape[0] - 1
        cost = setup.cost
        for i in range(n):
            o = lt * E + state.pf_pick[i]
            if ob[o, RES] != 0 or ob[o, QUEUED] != 0:
                continue
            tok_counts[PREFETCHES, t] += 1
            if counting:
                layer_counts[lt, PREFETCHES] += 1
            nvme = tiered and from_nvme(o, ram, ob, po)
            if nvme:
                tok_counts[PREFETCHES_NVME, t] += 1
                if counting:
                    layer_counts[lt, PREFETCHES_NVME] += 1
            link_free = queue_copy(o, lt, nvme, t_r, link_free, cost, timed, ob, state.queue, state.queue_t,
                                   state.queue_hl)
            pf[o] = PF_INFLIGHT
            state.pf_t[o] = link_free
    if policy.prefetch == pol.PREV_TOKEN:
        remember(l, t, sel, state.pf_prev, state.pf_scal, seq_t)
    return link_free


@cached_njit(_nrt=False)
def late_hit(insert, prm, pool, o, tick, t, l, t_r, ov, now, h, m_link, stall, link_free, timed, s_vram, s_writeback,
             ob, fo, po, heap, pf, pf_t, tok_counts, layer_counts, counting):
    """A request whose expert's prefetch is still in flight: a hit that uses the prefetch (late when it lands after
    the request is asked), waiting for it, no second copy; the expert is admitted now through ``insert``. Returns
    (evictions, now, h, m_link, stall, link_free): the overlapped clock's GPU chain (h, m_link) or the serialized
    clock's wait."""
    tok_counts[PREFETCH_USED, t] += 1
    if counting:
        layer_counts[l, PREFETCH_USED] += 1
    done = pf_t[o]
    asked = t_r if ov else now
    if done > asked:
        tok_counts[PREFETCH_LATE, t] += 1
        if counting:
            layer_counts[l, PREFETCH_LATE] += 1
    if timed:
        if ov:
            h = max(h, done) + s_vram
            m_link += 1
        else:
            stall += max(done, now) - now
            now = max(done, now) + s_vram
    n_evict = 0
    if serve_late(insert, prm, pool, o, tick, ob, fo, po, heap, pf) >= 0:
        n_evict = 1
        if timed:
            link_free = max(t_r if ov else now, link_free) + s_writeback
    return n_evict, now, h, m_link, stall, link_free
