"""Slow, plain-Python reference of the replay semantics (docs/replay-semantics.md).

Written for clarity, not speed, and independently of the kernel's data
structures: each pool's eviction policy is a class of tests/reference_policies.py,
next requests are found by searching forward. The numba kernel must match it
count for count.
"""

from __future__ import annotations

import math

import numpy as np
from reference_policies import NOT_ADMITTED, make_policy

COUNTERS = ("requests", "hits", "misses", "fetches", "substitutions", "drops", "cpu", "admissions",
            "first_choice_substitutions", "evictions", "fetches_nvme", "cpu_nvme", "copies", "copies_nvme",
            "prefetches", "prefetch_used", "prefetch_late", "prefetches_nvme", "lowbit", "capped", "pin_full",
            "lowbit_tier", "rerouted", "first_choice_changed")
COST_KEYS = ("dense_layer", "vram", "fetch_ram", "fetch_nvme", "cpu_ram", "cpu_nvme", "copy_ram", "copy_nvme",
             "cpu_handoff", "writeback", "fetch_lowbit", "lowbit_vram", "router_sync")


def _top(counts: dict, n: int) -> list:
    """The n most requested objects, ties to the lower (layer, expert); most popular first."""
    return sorted(counts, key=lambda o: (-counts[o], o))[:n]


def reference_replay(sel, w, cand, seq, n_experts, *, eviction, miss, slots, theta=0.15, admit=None,
                     allocation="per-layer", warm=False, warmup_tokens=0, reset_per_sequence=False,
                     half_life=None, static_prefix=None, cost=None, ram_cap=None, ram_warm=(), wm=None,
                     params=None, decisions=None, overlap="none", prefetch="none", prefetch_depth=1,
                     prefetch_train=None, lookahead=None, step_pin=False, max_uploads=None, lowbit_tier=0,
                     cpu_overlap=False, reroute=None, reroute_pool=None, reroute_resident="cache",
                     reroute_weights="original", logits=None, gating="softmax", selection_bias=None, rows=None,
                     members=None, tokens=None, admission=None, repin=None, domain=None):
    """Counters per layer and per token (with "seconds" and "stall" per token). Re-pinning placements
    (docs/replay-semantics.md): ``eviction="repin"`` with ``repin=(N, G)``, ``eviction="static-domain"`` with
    ``domain`` (per token, -1 for none) and ``static_prefix`` (its W); their swaps happen at the start of a token,
    outs (evictions, written back) then ins (uploads the token waits for), each in expert order.
    ``admission``: --admission second-touch's window W in requests of the pool (math.inf: no window; None: always
    admit): a fetched expert is admitted only when its pool requested it within its last W requests, else it is
    fetched for this use only; evictions a policy makes beyond its insertions' victims (extra_victims: slru,
    lirs) count at the step's end, written back then. ``cost``: seconds per
    operation keyed by COST_KEYS (None: no clock); ``ram_cap``: host-RAM tier size in experts (None: all
    experts in host RAM), initially holding ``ram_warm`` (layer, expert) pairs, least recently used first.
    Negative ids in ``sel`` are padding (batched routing); ``wm``: the mass a substitution loses
    (default: ``w``); ``params``: the eviction's named parameters (reference_policies classes).
    ``decisions``: a dict filled with {(t, l, r): (outcome, substitute id or -1)}, outcomes as named in
    the replay's decision record: "hit", "fetch", "substitute", "drop", "cpu", "lowbit".
    ``overlap``: none, layer or cross-layer (the clock's copy/compute overlap); ``prefetch``: none, prev-token,
    next-layer, lookahead or oracle, for the layer ``prefetch_depth`` ahead; next-layer learns from
    ``prefetch_train`` (selections [T', L, k]; default: the first 10% of ``sel``, at most 10,000 tokens);
    lookahead reads ``lookahead`` [T, L, k]. ``miss="lowbit"``: every
    miss runs a low-bit copy (cost keys fetch_lowbit, lowbit_vram). ``step_pin``: at each step the hits are handled
    first, then the misses (each in rank order); no step's selected expert is a victim of its misses (the least-
    preferred other one is; none: the fetch is for this use only, counted as pin_full), and the step's copies go
    onto the link back to back. ``max_uploads``: at most this many fetches admitted per step (the rest: capped).
    ``lowbit_tier``: low-bit copies per layer (``slots`` is then the full-expert slots) of the most requested
    experts after the pinned ones, resident throughout; a miss of one runs it (lowbit, lowbit_tier; cost
    lowbit_vram) whatever the miss policy.

    Engine costs of a dynamic cache (issue 29, docs/replay-semantics.md; the kernel charges them from v2 on):
    cost key ``router_sync`` is charged once per (token, layer) step whose layer is not wholly resident (some of its E
    experts not in VRAM once the step's landed copies are admitted), right after the step's dense share and before
    its experts: the host reads the router's output back, and the step's router decision (when its copies are
    issued) comes after it. ``miss="hybrid"``: every miss is computed on the CPU for this use (cpu_ram / cpu_nvme,
    counted as cpu, outcome "cpu") and, unless the expert is already queued, uploaded into the cache in the
    background: a copy from host RAM (copy_ram) queued on the link at the issue time, admitted when it lands as
    --admit's copies are; with ``max_uploads`` at most that many uploads per step (the rest: capped). With
    ``cpu_overlap`` (``overlap="none"`` only) a step's CPU experts run on the host from its router decision while the
    GPU runs its other experts: the step's experts end at the later of the two, then the hand-off is added.

    Rerouting (docs/replay-semantics.md, "Rerouting"): ``reroute`` = ("bias", λ) or ("keep", J) rewrites each step's
    selection before its requests from the candidates' ``logits`` [T, L, M] (aligned with ``cand``; ``gating`` and
    ``selection_bias`` [L][E] give their selection scores), over the first ``reroute_pool`` candidates, residency
    ``reroute_resident`` ("cache" or "recent:W"), weights ``reroute_weights`` ("original" or "biased"); counters
    rerouted and first_choice_changed, and "displaced" (mass) per layer and per token; ``rows``: a dict filled with
    {(t, l): the step's row of expert ids}. Batched (``sel`` a lock-step union, ``members`` [steps, B] its member
    tokens, ``tokens`` = (sel, w, cand, logits) of the tokens, ``logits`` unused): each member's row is rerouted on
    its own, then the step runs their union (simulator/batch.py's rule); the counters add up over the members."""
    assert not (cpu_overlap and overlap != "none"), "cpu_overlap is defined for overlap none"
    wm = w if wm is None else wm
    decisions = {} if decisions is None else decisions
    cost = dict.fromkeys(COST_KEYS, 0.0) | (cost or {})
    T, L, k = sel.shape
    E = n_experts
    objs = [(l, e) for l in range(L) for e in range(E)]
    pool_of = (lambda o: o[0]) if allocation == "per-layer" else (lambda o: 0)
    cap = {p: slots for p in range(L)} if allocation == "per-layer" else {0: slots * L}

    # every request in replay order, and each object's request positions
    requests = [(t, l, r) for t in range(T) for l in range(L) for r in range(k) if sel[t, l, r] >= 0]
    positions: dict = {}
    for (t, l, r) in requests:
        positions.setdefault((l, int(sel[t, l, r])), []).append((t, l, r))

    def next_request(o, after):
        for p in positions.get(o, []):
            if p > after:
                return p
        return (math.inf,)

    def request_counts(n_tokens):
        c = {o: 0 for o in objs}
        for t in range(min(T, n_tokens)):
            for l in range(L):
                for r in range(k):
                    if sel[t, l, r] >= 0:
                        c[(l, int(sel[t, l, r]))] += 1
        return c

    def most_requested(counts):
        if allocation == "global":
            return _top(counts, slots * L)
        return [o for l in range(L) for o in _top({x: c for x, c in counts.items() if x[0] == l}, slots)]

    pinned = set()
    if eviction == "static":
        pinned = set(most_requested(request_counts(T if static_prefix is None else static_prefix)))
    if eviction == "static-layers":  # whole layers, the last ones, as llama.cpp --n-cpu-moe leaves them
        n_layers = min(L, slots * L // E)
        pinned = {(l, e) for l in range(L - n_layers, L) for e in range(E)}

    swaps = {}  # re-pinning: token -> (experts out, experts in)
    if eviction == "repin":
        every, gain = repin
        pools = [[o for o in objs if pool_of(o) == p] for p in cap]
        held = [set() for _ in cap]
        for t0_ in range(every, T, every):
            window = {o: 0 for o in objs}
            for t_ in range(t0_ - every, t0_):
                for l_ in range(L):
                    for e_ in sel[t_, l_]:
                        if e_ >= 0:
                            window[(l_, int(e_))] += 1
            outs, ins = [], []
            for p, members in enumerate(pools):
                h = held[p]
                while True:  # the hottest unpinned expert (lowest id on ties) against the coldest pinned (highest)
                    free = [o for o in members if o not in h]
                    if not free:
                        break
                    hot = min(free, key=lambda o: (-window[o], o))
                    if len(h) < cap[p]:
                        if window[hot] <= 0 or window[hot] < gain:
                            break
                        h.add(hot)
                        ins.append(hot)
                        continue
                    cold = max(h, key=lambda o: (-window[o], o))
                    if window[hot] - window[cold] <= 0 or window[hot] - window[cold] < gain:
                        break
                    h.discard(cold)
                    h.add(hot)
                    ins.append(hot)
                    outs.append(cold)
            # an expert swapped in and out at one re-estimation (not possible: it would have to be colder than the
            # experts it displaced) would cancel; the lists are disjoint
            swaps[t0_] = (sorted(outs), sorted(ins))
    if eviction == "static-domain":
        learn = T if static_prefix is None else static_prefix
        tables = {}
        for d in sorted({int(x) for x in domain if x >= 0}):
            counts = {o: 0 for o in objs}
            for t_ in range(min(T, learn)):
                if domain[t_] == d:
                    for l_ in range(L):
                        for e_ in sel[t_, l_]:
                            if e_ >= 0:
                                counts[(l_, int(e_))] += 1
            tables[d] = set(most_requested(counts)) if any(domain[t_] == d for t_ in range(min(T, learn))) else set()
        first = next(t_ for t_ in range(T) if domain[t_] >= 0)
        cur_d = int(domain[first])
        pinned = set(tables[cur_d])
        for t_ in range(first + 1, T):
            d = int(domain[t_])
            if d >= 0 and d != cur_d:
                swaps[t_] = (sorted(tables[cur_d] - tables[d]), sorted(tables[d] - tables[cur_d]))
                cur_d = d

    ov = overlap != "none" and any(v != 0.0 for v in cost.values())
    prefetching = prefetch != "none" and not eviction.startswith("static")  # pinned evictions never admit
    successors = {}
    if prefetch == "next-layer":
        train = sel[:max(1, min(10_000, int(T * 0.1)))] if prefetch_train is None else prefetch_train
        successors = _successors(train, E, prefetch_depth)

    def predicted(t, l, lt):
        """The experts to prefetch for layer lt at step (t, l), best first."""
        if prefetch == "oracle":
            return [int(e) for e in sel[t, lt] if e >= 0]
        if prefetch == "prev-token":
            if t == 0 or seq[t - 1] != seq[t]:
                return []
            return [int(e) for e in sel[t - 1, lt] if e >= 0]
        if prefetch == "lookahead":
            return [int(e) for e in lookahead[t, l] if e >= 0]
        score: dict = {}
        for e in sel[t, l]:
            if e >= 0:
                for s_, n_ in successors.get((l, int(e)), []):
                    score[s_] = score.get(s_, 0) + n_
        return sorted(score, key=lambda x: (-score[x], x))[:k]
    tier = set()
    if lowbit_tier:
        counts = request_counts(T)
        ranked = {o: (-1 if o in pinned else c) for o, c in counts.items()}
        if allocation == "global":
            tier = set(_top(ranked, lowbit_tier * L))
        else:
            tier = {o for l in range(L) for o in _top({x: c for x, c in ranked.items() if x[0] == l}, lowbit_tier)}

    layer = {l: dict.fromkeys(COUNTERS, 0) | {"mass": 0.0, "displaced": 0.0} for l in range(L)}
    per_token = [dict.fromkeys(COUNTERS, 0) | {"mass": 0.0, "displaced": 0.0, "seconds": 0.0, "stall": 0.0}
                 for _ in range(T)]
    row_of = {} if rows is None else rows

    state = {}
    pinning = eviction.startswith("static") or eviction == "repin"
    prefetching = prefetching and not pinning
    cur = {"now": (0, 0, -1), "router": {}, "rowpos": None}  # where Belady looks ahead from (next_use)

    def next_use(o):
        """Belady's next request of o: the router's requests. One the router made at the current step is pending
        until o's position in the step's row is handled (at a step's start, before its row exists, all are)."""
        t_, l_, r_ = cur["now"]
        rank = cur["router"].get(o)
        if rank is not None and (cur["rowpos"] is None or cur["rowpos"].get(o, -1) > r_):
            return (t_, l_, rank)
        return next_request(o, (t_, l_, k))

    def reset(t):
        state["score"] = dict.fromkeys(objs, 0.0)
        state["policy"] = {} if pinning else {
            p: make_policy(eviction, cap[p], params, score=state["score"],
                           next_use=next_use,
                           token=lambda stamp: stamp[0] // L if stamp[0] >= 0 else -1) for p in cap}
        state["acc"] = dict.fromkeys(objs, 0.0)
        state["pending"] = {l: [] for l in range(L)}  # (object, completion time), in link order
        state["pf"] = {}  # object -> "inflight" | "landed" (resident, unused) | "stale" (served late, still queued)
        state["pf_done"] = {}
        state["ram"] = list(ram_warm)  # least recently used first
        state["decay_base"] = t
        state["clock"] = 0
        state["last_req"] = {}  # --reroute-resident recent:W: the token each expert was last requested at
        state["reqs"] = dict.fromkeys(cap, 0)  # second-touch: each pool's requests since the reset
        state["req_at"] = {}  # ... and the index of each expert's last one
        if warm and not pinning:
            order = list(reversed(most_requested(request_counts(T))))
            if allocation == "per-layer":
                order = [o for l in range(L) for o in order if o[0] == l]
            for i, o in enumerate(order):
                state["policy"][pool_of(o)].insert(o, (-1, 0, i))

    def resident(o):
        return o in pinned or (not pinning and o in state["policy"][pool_of(o)])

    def insert(o, stamp, now, c, tc, pinned=None):
        """Admit o (a fetch or a landed background copy); False when the policy refused it, "pin_full" when
        every resident expert of the pool is in ``pinned``."""
        cur["now"] = now
        pol = state["policy"][pool_of(o)]
        if pinned is not None:
            if len(pol) >= pol.capacity and all(x in pinned for x in pol.last_use):
                return "pin_full"
            victim = pol.insert(o, stamp, exclude=pinned)
        else:
            victim = pol.insert(o, stamp)
        if victim is NOT_ADMITTED:
            return False
        if victim is not None:
            c["evictions"] += 1
            tc["evictions"] += 1
            # an engine that writes evicted experts back occupies the link, queued after what is on it
            clock["link"] = max(issue_time(), clock["link"]) + cost["writeback"]
        return True

    def from_nvme(o):
        if ram_cap is None:
            return False
        if ram_cap == 0:
            return True
        ram = state["ram"]
        if o in ram:
            ram.remove(o)
            ram.append(o)
            return False
        if len(ram) >= ram_cap:
            ram.pop(0)
        ram.append(o)
        return True

    clock = {"now": 0.0, "link": 0.0, "router": 0.0}

    def issue_time():
        """When a copy decided now is put on the link: under overlap every copy of a step is issued at its
        router decision; serialized, at the moment it is decided."""
        return clock["router"] if ov else clock["now"]

    def gpu_end(start, arrivals):
        """The GPU, free at ``start`` after the step's resident work, runs the link-dependent experts in rank
        order, each as soon as it has landed (``arrivals``: landing times in rank order)."""
        g = start
        for a in arrivals:
            g = max(g, a) + cost["vram"]
        return g

    def background_copy(o, wr, c, tc, queue):
        """--admit: a substituted, dropped or low-bit expert's weight accumulates; at beta a copy is queued."""
        if admit and not pinning:
            state["acc"][o] += wr
            if state["acc"][o] >= admit and o not in [x for x, _ in queue]:
                state["acc"][o] = 0.0
                start = max(issue_time(), clock["link"])
                nvme = from_nvme(o)
                clock["link"] = start + cost["copy_nvme" if nvme else "copy_ram"]
                queue.append((o, clock["link"]))
                for d in (c, tc):
                    d["copies"] += 1
                    d["copies_nvme"] += int(nvme)
    inc = 1.0
    for t in range(T):
        t_start = clock["now"]
        if t == 0 or (reset_per_sequence and seq[t] != seq[t - 1]):
            reset(t)
        if half_life:
            inc = 2.0 ** ((t - state["decay_base"]) / half_life)
            if inc > 1e150:
                for o in objs:
                    state["score"][o] /= inc
                state["decay_base"] = t
                inc = 1.0
        counting = t >= warmup_tokens
        tc = per_token[t]
        outs, ins = swaps.get(t, ((), ()))
        for o in outs:  # a swapped-out expert is evicted (written back)
            pinned.discard(o)
            for d in ((layer[o[0]],) if counting else ()) + (tc,):
                d["evictions"] += 1
            clock["link"] = max(clock["now"], clock["link"]) + cost["writeback"]
        for o in ins:  # a swapped-in one is uploaded, a copy the token waits for
            pinned.add(o)
            nvme = from_nvme(o)
            for d in ((layer[o[0]],) if counting else ()) + (tc,):
                d["copies"] += 1
                d["admissions"] += 1
                d["copies_nvme"] += int(nvme)
            start = max(clock["now"], clock["link"])
            tc["stall"] += start - clock["now"]
            clock["link"] = start + cost["fetch_nvme" if nvme else "fetch_ram"]
            clock["now"] = clock["link"]
        for l in range(L):
            c = layer[l] if counting else dict.fromkeys(COUNTERS, 0) | {"mass": 0.0}
            now_step = (t, l, -1)
            clock["now"] += cost["dense_layer"]
            clock["router"] = clock["now"]
            arrivals, arrivals_own, waited = [], [], 0  # overlap: the step's link-dependent experts
            link_own = clock["now"]  # the link carrying only the step's own fetches (stall)
            queue = state["pending"][l]
            extra0 = 0 if pinning else len(getattr(state["policy"][pool_of((l, 0))], "extra_victims", ()))
            cur["router"] = {(l, int(sel[t, l, r])): r for r in range(k) if sel[t, l, r] >= 0}
            cur["rowpos"] = None
            i = 0
            while queue and queue[0][1] <= clock["now"]:
                o, _ = queue.pop(0)
                kind = state["pf"].pop(o, None)
                if kind == "stale":
                    continue
                if resident(o):
                    continue
                if insert(o, (t * L + l, 0, i), now_step, c, tc):
                    if kind == "inflight":
                        state["pf"][o] = "landed"
                    else:
                        c["admissions"] += 1
                        tc["admissions"] += 1
                i += 1
            if cost["router_sync"] and not all(resident((l, e)) for e in range(E)):
                clock["now"] += cost["router_sync"]  # the host reads the router's output back
                clock["router"] = clock["now"]
                link_own = clock["now"]
            cpu_end = clock["now"]  # cpu_overlap: the host's own timeline from the router decision
            srow, wrow, wmrow = [int(e) for e in sel[t, l]], [float(x) for x in w[t, l]], [float(x) for x in wm[t, l]]
            if reroute is not None:
                if reroute_resident.startswith("recent:"):
                    window = int(reroute_resident[len("recent:"):])
                    recent = {e for (ll, e), tt in state["last_req"].items() if ll == l and tt >= t - window}
                else:
                    recent = {e for e in range(E) if resident((l, e))}
                bias = None if selection_bias is None else selection_bias[l]
                if members is None:
                    new = _rerouted_row(srow, cand[t, l], logits[t, l], recent.__contains__, reroute, reroute_pool,
                                        reroute_weights, gating, bias)
                    if new is not None:
                        new_ids, new_w = new
                        moved_in = sum(e not in srow for e in new_ids)
                        away = sum(wr_ for e, wr_ in zip(srow, wrow) if e not in new_ids)
                        new = new_ids, new_w, list(new_w), moved_in, away, int(new_ids[0] != srow[0])
                else:
                    new = _rerouted_union(members[t], tokens, l, k, recent.__contains__, reroute, reroute_pool,
                                          reroute_weights, gating, bias)
                if new is not None:
                    new_ids, new_w, new_wm, moved_in, away, n_changed = new
                    for d in (c, tc):
                        d["rerouted"] += moved_in
                        d["first_choice_changed"] += n_changed
                        d["displaced"] = d.get("displaced", 0.0) + away  # (a warm-up layer's dict is a scratch one)
                        d["mass"] += away  # the gate mass of the experts rerouted away is lost, as a substitute's
                    srow, wrow, wmrow = new_ids, new_w, new_wm
            cur["rowpos"] = {(l, e): r for r, e in enumerate(srow) if e >= 0}
            row_of[(t, l)] = list(srow)
            selected = {(l, e) for e in srow if e >= 0}
            ran_as_substitute = set()
            cpu_before = c["cpu"]
            ranks = [r for r in range(k) if srow[r] >= 0]
            hits = [r for r in ranks if resident((l, srow[r]))]
            if step_pin:  # the step's hits first, then its misses
                ranks = hits + [r for r in ranks if r not in hits]
            copy_end = clock["now"]
            uploads = 0
            for pos, r in enumerate(ranks):
                if step_pin and pos == len(hits):
                    copy_end = clock["now"]  # the misses' copies start together, after the hits ran
                o = (l, srow[r])
                wr = wrow[r]
                now = (t, l, r)
                state["last_req"][o] = t
                stamp = (t * L + l, 1, pos if step_pin else r)
                state["score"][o] += inc
                c["requests"] += 1
                tc["requests"] += 1
                second = True  # --admission second-touch: requested within the window
                if admission:
                    ri, prev = state["reqs"][pool_of(o)], state["req_at"].get(o)
                    state["reqs"][pool_of(o)] = ri + 1
                    state["req_at"][o] = ri
                    second = prev is not None and ri - prev <= admission
                if resident(o):
                    decisions[(t, l, r)] = ("hit", -1)
                    c["hits"] += 1
                    tc["hits"] += 1
                    clock["now"] += cost["vram"]
                    if o not in pinned:
                        state["policy"][pool_of(o)].hit(o, stamp, request=True)
                    if state["pf"].get(o) == "landed":
                        del state["pf"][o]
                        c["prefetch_used"] += 1
                        tc["prefetch_used"] += 1
                    continue
                if state["pf"].get(o) == "inflight":
                    # the expert's prefetch is still in flight: wait for it (no second copy), admit it
                    decisions[(t, l, r)] = ("hit", -1)
                    for d in (c, tc):
                        d["hits"] += 1
                        d["prefetch_used"] += 1
                    done = state["pf_done"][o]
                    if done > issue_time():
                        c["prefetch_late"] += 1
                        tc["prefetch_late"] += 1
                    if ov:
                        arrivals.append(done)
                        waited += 1
                    else:
                        tc["stall"] += max(done, clock["now"]) - clock["now"]
                        clock["now"] = max(done, clock["now"]) + cost["vram"]
                    state["pf"][o] = "stale"
                    insert(o, stamp, now, c, tc)
                    continue
                c["misses"] += 1
                tc["misses"] += 1
                if o in tier:  # its low-bit copy is resident: run it, no transfer, whatever the miss policy
                    decisions[(t, l, r)] = ("lowbit", -1)
                    for d in (c, tc):
                        d["lowbit"] += 1
                        d["lowbit_tier"] += 1
                    clock["now"] += cost["lowbit_vram"]
                    background_copy(o, wr, c, tc, queue)
                    continue
                if miss == "fetch-all":
                    action = "fetch"
                elif miss == "threshold":
                    action = "fetch" if (r == 0 or wr >= theta) else "substitute"
                elif miss == "first-choice":
                    action = "fetch" if r == 0 else "substitute"
                else:
                    action = miss
                decisions[(t, l, r)] = (action if action != "substitute" else "drop", -1)
                if action == "lowbit":  # --overlap none only (the overlapped clock refuses lowbit:Q)
                    c["lowbit"] += 1
                    tc["lowbit"] += 1
                    if not step_pin:
                        copy_end = clock["now"]
                    start = max(copy_end, clock["link"])
                    tc["stall"] += start - copy_end
                    clock["link"] = start + cost["fetch_lowbit"]
                    copy_end = clock["link"]
                    clock["now"] = max(clock["now"], clock["link"]) + cost["lowbit_vram"]
                    background_copy(o, wr, c, tc, queue)
                    continue
                if action == "fetch":
                    c["fetches"] += 1
                    tc["fetches"] += 1
                    nvme = from_nvme(o)
                    copy = cost["fetch_nvme" if nvme else "fetch_ram"]
                    if ov:  # issued at the router decision, computed once landed (gpu_end)
                        clock["link"] = max(clock["router"], clock["link"]) + copy
                        arrivals.append(clock["link"])
                        link_own += copy
                        arrivals_own.append(link_own)
                    else:
                        if not step_pin:
                            copy_end = clock["now"]
                        start = max(copy_end, clock["link"])
                        tc["stall"] += start - copy_end
                        clock["link"] = start + copy
                        copy_end = clock["link"]
                        clock["now"] = max(clock["now"], clock["link"]) + cost["vram"]
                    if nvme:
                        c["fetches_nvme"] += 1
                        tc["fetches_nvme"] += 1
                    if state["pf"].get(o) == "landed":
                        del state["pf"][o]
                    if not pinning and second:  # else fetched for this use only
                        if max_uploads is not None and uploads >= max_uploads:
                            c["capped"] += 1
                            tc["capped"] += 1
                        else:
                            got = insert(o, stamp, now, c, tc, pinned=selected if step_pin else None)
                            if got == "pin_full":
                                c["pin_full"] += 1
                                tc["pin_full"] += 1
                            elif got:
                                uploads += 1
                    continue
                if action in ("cpu", "hybrid"):
                    decisions[(t, l, r)] = ("cpu", -1)
                    c["cpu"] += 1
                    tc["cpu"] += 1
                    nvme = from_nvme(o)
                    if cpu_overlap:
                        cpu_end += cost["cpu_nvme" if nvme else "cpu_ram"]
                    else:
                        clock["now"] += cost["cpu_nvme" if nvme else "cpu_ram"]
                    if nvme:
                        c["cpu_nvme"] += 1
                        tc["cpu_nvme"] += 1
                    if action == "hybrid" and not pinning and o not in [x for x, _ in queue]:
                        if max_uploads is not None and uploads >= max_uploads:
                            c["capped"] += 1
                            tc["capped"] += 1
                        else:  # uploaded in the background from host RAM, where the CPU has just read it
                            uploads += 1
                            clock["link"] = max(issue_time(), clock["link"]) + cost["copy_ram"]
                            queue.append((o, clock["link"]))
                            for d in (c, tc):
                                d["copies"] += 1
                    continue
                sub = None
                if action == "substitute":
                    for e in cand[t, l]:
                        if e < 0:
                            continue
                        x = (l, int(e))
                        if resident(x) and x not in selected and x not in ran_as_substitute:
                            sub = x
                            break
                if sub is not None:
                    decisions[(t, l, r)] = ("substitute", sub[1])
                    ran_as_substitute.add(sub)
                    c["substitutions"] += 1
                    tc["substitutions"] += 1
                    if sub not in pinned:
                        state["policy"][pool_of(sub)].hit(sub, stamp, request=False)
                    clock["now"] += cost["vram"]
                else:
                    c["drops"] += 1
                    tc["drops"] += 1
                c["mass"] += wmrow[r]
                tc["mass"] += wmrow[r]
                if r == 0:
                    c["first_choice_substitutions"] += 1
                    tc["first_choice_substitutions"] += 1
                background_copy(o, wr, c, tc, queue)
            if not pinning:  # evictions beyond the insertions' victims (slru, lirs), written back at the step's end
                extra = len(getattr(state["policy"][pool_of((l, 0))], "extra_victims", ())) - extra0
                if extra:
                    c["evictions"] += extra
                    tc["evictions"] += extra
                    clock["link"] = max(issue_time(), clock["link"]) + extra * cost["writeback"]
            if cpu_overlap:  # the CPU experts ran beside the GPU's: the later of the two ends the experts
                clock["now"] = max(clock["now"], cpu_end)
            if c["cpu"] > cpu_before:  # the hand-off of a layer computed (partly) on the CPU
                clock["now"] += cost["cpu_handoff"]
            lt = l + prefetch_depth
            if prefetching and lt < L:
                for e in predicted(t, l, lt):
                    o = (lt, e)
                    if resident(o) or o in [x for x, _ in state["pending"][lt]]:
                        continue
                    ct = layer[lt] if counting else dict.fromkeys(COUNTERS, 0)
                    nvme = from_nvme(o)
                    for d in (ct, tc):
                        d["prefetches"] += 1
                        d["prefetches_nvme"] += int(nvme)
                    clock["link"] = max(clock["router"], clock["link"]) + cost["copy_nvme" if nvme else "copy_ram"]
                    state["pending"][lt].append((o, clock["link"]))
                    state["pf"][o] = "inflight"
                    state["pf_done"][o] = clock["link"]
            if ov:
                # resident work (in clock["now"]) first, then the link-dependent experts as they land
                end = gpu_end(clock["now"], arrivals)
                if overlap == "layer":  # the link is synchronized at the end of every layer
                    end = max(end, clock["link"])
                end_own = gpu_end(clock["now"] + waited * cost["vram"], arrivals_own)
                tc["stall"] += end - end_own
                clock["now"] = end
        tc["seconds"] = clock["now"] - t_start
    return layer, per_token


def _rerouted_row(router, cand, logits, resident, rule, pool, weights, gating, bias):
    """A step's rerouted row (expert ids in rank order, their gate weights), or None when rerouting leaves its set of
    experts as the router chose it. ``router``: the router's ids in rank order (the top k of the candidates);
    ``cand``/``logits``: the candidates in candidate order and their logits; ``resident(e)``: e counts as resident;
    ``rule``: ("bias", λ) or ("keep", J); ``pool``: candidates considered (None: all)."""
    k = len(router)
    P = len(cand) if pool is None else pool
    ids = [int(e) for e in cand[:P]]
    x = [float(v) for v in logits[:P]]
    if gating == "sigmoid":  # the selection score, float32 as the replay keeps it
        s = [float(np.float32(1.0 / (1.0 + math.exp(-v)) + (0.0 if bias is None else float(bias[e]))))
             for v, e in zip(x, ids)]
    else:
        s = x
    res = [1.0 if resident(e) else 0.0 for e in ids]
    name, value = rule
    lam_r = value * (max(s) - min(s)) if name == "bias" else 0.0
    if name == "bias":
        chosen = sorted(range(P), key=lambda j: (-(s[j] + lam_r * res[j]), j))[:k]
    else:
        chosen = [ids.index(router[r]) for r in range(int(value))]
        rest = [j for j in range(P) if j not in chosen]
        chosen += ([j for j in rest if res[j]] + [j for j in rest if not res[j]])[:k - len(chosen)]
    if set(chosen) == set(range(k)):
        return None
    chosen.sort()
    bias_w = lam_r if weights == "biased" and name == "bias" else 0.0
    if gating == "sigmoid":
        vals = [1.0 / (1.0 + math.exp(-x[j])) + bias_w * res[j] for j in chosen]
    else:
        vals = [x[j] + bias_w * res[j] for j in chosen]
        top = max(vals)
        vals = [math.exp(v - top) for v in vals]
    total = 0.0
    for v in vals:  # in candidate order, as the kernel sums
        total += v
    wts = [v / total for v in vals]
    order = sorted(range(k), key=lambda q: (-wts[q], q))
    return [ids[chosen[q]] for q in order], [float(np.float32(wts[q])) for q in order]


def _rerouted_union(live, tokens, l, K, resident, rule, pool, weights, gating, bias):
    """A batched step's row rerouted: each live member's row rerouted on its own, then their union (best rank, then
    the larger weight to 2^-30, then the lower id; weights the largest member weight, masses their sum, float32),
    padded to K with -1; with the counters summed over the members (requests rerouted in, the gate mass rerouted
    away, members whose first choice changed). None when no member's set changes."""
    tsel, tw, tcand, tlogits = tokens
    rows, moved, away, changed = [], 0, 0.0, 0
    for tm in live:
        if tm < 0:
            continue
        router, rw = [int(e) for e in tsel[tm, l]], [float(x) for x in tw[tm, l]]
        new = _rerouted_row(router, tcand[tm, l], tlogits[tm, l], resident, rule, pool, weights, gating, bias)
        if new is None:
            rows.append((router, rw))
            continue
        ids, wts = new
        moved += sum(e not in router for e in ids)
        for e, x in zip(router, rw):
            if e not in ids:
                away += x
        changed += int(ids[0] != router[0])
        rows.append((ids, wts))
    if not moved:  # a member whose set changed ran an expert it did not select
        return None
    u: dict = {}
    for ids, wts in rows:
        for r, (e, x) in enumerate(zip(ids, wts)):
            br, mx, sm = u.get(e, (r, x, 0.0))
            u[e] = (min(br, r), max(mx, x), sm + x)
    order = sorted(u, key=lambda e: (u[e][0], (1 << 30) - int(u[e][1] * (1 << 30)), e))
    pad = [-1] * (K - len(order))
    return (order + pad, [float(np.float32(u[e][1])) for e in order] + [0.0] * len(pad),
            [float(np.float32(u[e][2])) for e in order] + [0.0] * len(pad), moved, away, changed)


def _successors(train, E, depth):
    """next-layer prefetch: for each (layer l, expert e) the min(2k, E) experts of layer l + depth most often
    selected in the same token as e (most often first, equal counts: lower id), with their counts."""
    T, L, k = train.shape
    out = {}
    for l in range(L - depth):
        counts: dict = {}
        for t in range(T):
            for a in train[t, l]:
                for b in train[t, l + depth]:
                    if a >= 0 and b >= 0:
                        counts.setdefault(int(a), {}).setdefault(int(b), 0)
                        counts[int(a)][int(b)] += 1
        for a, row in counts.items():
            out[(l, a)] = sorted(row.items(), key=lambda x: (-x[1], x[0]))[:min(2 * k, E)]
    return out


def random_routing_arrays(rng: np.random.Generator, T: int, L: int, E: int, k: int, M: int, n_seq: int = 1,
                          skew: float = 1.0):
    """Routing arrays with locality: per-layer popularity plus a drifting state, softmax weights."""
    base = rng.normal(scale=skew, size=(L, E))
    state = rng.normal(size=(L, E))
    sel = np.empty((T, L, k), np.int16)
    w = np.empty((T, L, k), np.float32)
    cand = np.empty((T, L, M), np.int16)
    for t in range(T):
        state = 0.7 * state + 0.3 * rng.normal(size=(L, E))
        logits = np.round(base + state, 1)  # coarse grid: equal scores happen, exercising the tie rule
        for l in range(L):
            order = sorted(range(E), key=lambda e: (-logits[l, e], e))
            cand[t, l] = order[:M]
            s = np.array(order[:k])
            x = logits[l, s] - logits[l, s].max()
            ww = np.exp(x) / np.exp(x).sum()
            o2 = sorted(range(k), key=lambda i: (-ww[i], s[i]))
            sel[t, l] = s[o2]
            w[t, l] = ww[o2]
    seq = np.sort(rng.integers(0, n_seq, size=T)).astype(np.int32)
    return sel, w, cand, seq
