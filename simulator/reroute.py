"""The step seam's rules: rerouting (--reroute bias:λ | keep:J) rewrites a step's row before its requests are
handled (docs/replay-semantics.md, "Rerouting"; the records and parsing are policies/reroute.py). The ext kernels
call the replay's rule once per step through a pointer (simulator/paths.py STEP_RULES): ``select`` for a trace's
steps, ``select_union`` for a batch's; tests/reference_replay.py has the same rule."""

import math

import numpy as np

from moesim.jitcache import cached_njit
from moesim.policies.reroute import BIAS, RESIDENT_CACHE
from moesim.policies.structures import NREQ, RES


@cached_njit(_nrt=False)
def choose(policy, sel, cand, logits, score, t, l, state, base, tg):
    """The rerouted set of the router row (t, l) of ``sel`` (its candidates ``cand``, their ``logits`` and selection
    ``score``): False when it is the router's set; else True, with the chosen candidates' positions in rank order
    in state.rr_ord[:k] and their gate weights in state.rr_ow[:k]."""
    ob, last, b, pos, nw = state.objs, state.last_req, state.rr_b, state.rr_pos, state.rr_w
    k = sel.shape[2]
    P = policy.step_pool
    recent = policy.step_resident != RESIDENT_CACHE
    # the candidates' residency and the biased scores (keep: residency only)
    hi = -math.inf
    lo = math.inf
    for j in range(P):
        s = score[t, l, j]
        hi = max(hi, s)
        lo = min(lo, s)
    lam_r = policy.step_value * (hi - lo) if policy.step == BIAS else 0.0
    for j in range(P):
        o = base + cand[t, l, j]
        res = (last[o] >= tg - policy.step_window) if recent else (ob[o, RES] != 0)
        b[j] = 1.0 if res else 0.0
    n = 0
    if policy.step == BIAS:  # the k largest biased scores, equal ones in candidate order
        for _ in range(k):
            best = -1
            bv = -math.inf
            for j in range(P):
                taken = False
                for q in range(n):
                    if pos[q] == j:
                        taken = True
                        break
                v = score[t, l, j] + lam_r * b[j]
                if not taken and (best < 0 or v > bv):
                    best = j
                    bv = v
            pos[n] = best
            n += 1
    else:  # keep:J, then the resident candidates, then the others, in candidate order
        J = int(policy.step_value)
        for r in range(J):
            for j in range(P):
                if cand[t, l, j] == sel[t, l, r]:
                    pos[n] = j
                    n += 1
                    break
        for want in (1.0, 0.0):
            for j in range(P):
                if n == k:
                    break
                if b[j] != want:
                    continue
                taken = False
                for q in range(n):
                    if pos[q] == j:
                        taken = True
                        break
                if not taken:
                    pos[n] = j
                    n += 1
    changed = False
    for q in range(k):
        if pos[q] >= k:  # the router's selection is the first k candidates (checked when the replay is built)
            changed = True
    if not changed:
        return False
    # the new set's gate weights, in candidate order (the reference sums in the same order)
    for q in range(k):  # sort the positions: candidate order
        for q2 in range(q + 1, k):
            if pos[q2] < pos[q]:
                pos[q], pos[q2] = pos[q2], pos[q]
    biased = policy.step_biased and policy.step == BIAS
    top = -math.inf
    for q in range(k):
        j = pos[q]
        lg = float(logits[t, l, j])  # float64, as the reference computes (math.exp of a float32 is exp-f)
        x = lg + (lam_r * b[j] if biased else 0.0)
        if policy.gating_sigmoid:
            x = 1.0 / (1.0 + math.exp(-lg)) + (lam_r * b[j] if biased else 0.0)
        nw[q] = x
        top = max(top, x)
    total = 0.0
    for q in range(k):
        if not policy.gating_sigmoid:
            nw[q] = math.exp(nw[q] - top)
        total += nw[q]
    for q in range(k):
        nw[q] = nw[q] / total
    # rank order: by weight, equal weights in candidate order (a stable selection sort of the k)
    for r in range(k):
        best = -1
        for q in range(k):
            if pos[q] >= 0 and (best < 0 or nw[q] > nw[best]):
                best = q
        state.rr_ord[r] = pos[best]
        state.rr_ow[r] = nw[best]
        pos[best] = -1
    return True


@cached_njit(_nrt=False)
def keep_row(policy, steps, state, fo, t, l, base, tg, rekey, pool):
    """No step policy: the router's row as it is (the step rules' signature; simulator/paths.py)."""
    _router_row(steps, state, t, l)
    return 0, 0.0, 0


@cached_njit(_nrt=False)
def select(policy, steps, state, fo, t, l, base, tg, rekey, pool):
    """Rewrite the step row (state.row, row_w, row_wm, row_next) of step (t, l) of token tg. Returns (requests
    rerouted in, the router's gate mass rerouted away, steps whose first choice changed). ``rekey``: the policy's
    hook, for a resident expert whose next request moved (``pool`` its pool); a step whose set of experts does not
    change gets the router's row as it is, and (0, 0.0, 0). A batched step is ``select_union``'s."""
    sel, w, cand, next_req = steps.sel, steps.w, steps.cand, steps.next_req
    row, row_w, row_wm, row_next = state.row, state.row_w, state.row_wm, state.row_next
    k = sel.shape[2]
    if not choose(policy, sel, cand, steps.logits, steps.score, t, l, state, base, tg):
        _router_row(steps, state, t, l)
        return 0, 0.0, 0
    for r in range(k):
        e = cand[t, l, state.rr_ord[r]]
        row[r] = e
        row_w[r] = state.rr_ow[r]
        row_wm[r] = state.rr_ow[r]
        row_next[r] = -1  # rerouted in: its next router request stays its NREQ
        for r0 in range(k):
            if sel[t, l, r0] == e:
                row_next[r] = next_req[t, l, r0]
    # the router's experts rerouted away: their gate mass is displaced, their request at this step passed
    n_in = 0
    displaced = 0.0
    for r0 in range(k):
        e = sel[t, l, r0]
        kept = False
        for r in range(k):
            if row[r] == e:
                kept = True
        if not kept:
            displaced += w[t, l, r0]
            if policy.uses_next:
                _passed(policy, state, fo, base + e, next_req[t, l, r0], rekey, pool)
    for r in range(k):
        found = False
        for r0 in range(k):
            if sel[t, l, r0] == row[r]:
                found = True
        if not found:
            n_in += 1
    return n_in, displaced, 1 if row[0] != sel[t, l, 0] else 0


@cached_njit(_nrt=False)
def _passed(policy, state, fo, o, nxt, rekey, pool):
    """The router's request of o at this step passed (rerouted away): its next request is the following one; a
    resident o is re-keyed (Belady's key is its next request)."""
    fo[o, NREQ] = nxt
    if state.objs[o, RES] != 0:
        rekey(state.objs, fo, state.pools, state.heap, policy.prm, pool, o)


@cached_njit(_nrt=False)
def _router_row(steps, state, t, l):
    for r in range(steps.sel.shape[2]):
        state.row[r] = steps.sel[t, l, r]
        state.row_w[r] = steps.w[t, l, r]
        state.row_wm[r] = steps.wm[t, l, r]
        state.row_next[r] = steps.next_req[t, l, r]


@cached_njit(_nrt=False)
def select_union(policy, steps, state, fo, t, l, base, tg, rekey, pool):
    """A batched step: each live member's row rerouted on its own (residency as at the step's start), then their
    union as simulator/batch.py takes it (best rank, then the larger weight, then the lower id; the miss policy
    reads the largest member weight, a substitution loses their sum). Counters per member: requests rerouted in,
    gate mass rerouted away, members whose first choice changed."""
    members, tsel, tw, tcand = steps.members, steps.tok_sel, steps.tok_w, steps.tok_cand
    k = tsel.shape[2]
    acc, ids = state.rr_acc, state.rr_ids  # [3, E]: best rank (-1: not in the union), largest weight, sum
    n = 0
    n_in = 0
    n_changed = 0
    displaced = 0.0
    moved = False
    for j in range(members.shape[1]):
        tm = members[t, j]
        if tm < 0:
            continue
        ch = choose(policy, tsel, tcand, steps.logits, steps.score, tm, l, state, base, tg)
        for r in range(k):
            if ch:
                e = tcand[tm, l, state.rr_ord[r]]
                x = float(np.float32(state.rr_ow[r]))  # the member's row holds float32 weights, as unbatched
            else:
                e = tsel[tm, l, r]
                x = float(tw[tm, l, r])
            if acc[0, e] < 0:
                acc[0, e] = r
                acc[1, e] = x
                acc[2, e] = x
                ids[n] = e
                n += 1
            else:
                acc[0, e] = min(acc[0, e], r)
                acc[1, e] = max(acc[1, e], x)
                acc[2, e] += x
        if ch:
            moved = True
            for r in range(k):
                e = tcand[tm, l, state.rr_ord[r]]
                e0 = tsel[tm, l, r]
                found = False
                kept = False
                for r0 in range(k):
                    if tsel[tm, l, r0] == e:
                        found = True
                    if tcand[tm, l, state.rr_ord[r0]] == e0:
                        kept = True
                if not found:
                    n_in += 1
                if not kept:
                    displaced += tw[tm, l, r]
            if tcand[tm, l, state.rr_ord[0]] != tsel[tm, l, 0]:
                n_changed += 1
    if not moved:
        for i in range(n):
            acc[0, ids[i]] = -1.0
        _router_row(steps, state, t, l)
        return 0, 0.0, 0
    # the union in rank order: best rank, then the larger weight (to 2^-30), then the lower id
    keys = state.rr_keys
    for i in range(n):
        e = ids[i]
        wq = (1 << 30) - np.int64(acc[1, e] * (1 << 30))
        keys[i] = (np.int64(acc[0, e]) << 46) | (wq << 15) | e
    for i in range(1, n):  # insertion sort (keys are distinct: they end in the id)
        v = keys[i]
        q = i - 1
        while q >= 0 and keys[q] > v:
            keys[q + 1] = keys[q]
            q -= 1
        keys[q + 1] = v
    sel, next_req = steps.sel, steps.next_req
    K = sel.shape[2]
    for r in range(K):
        if r >= n:
            state.row[r] = -1
            state.row_w[r] = 0.0
            state.row_wm[r] = 0.0
            state.row_next[r] = -1
            continue
        e = keys[r] & 0x7FFF
        state.row[r] = e
        state.row_w[r] = acc[1, e]
        state.row_wm[r] = acc[2, e]
        state.row_next[r] = -1
        for r0 in range(K):
            if sel[t, l, r0] == e:
                state.row_next[r] = next_req[t, l, r0]
        acc[0, e] = -1.0
    if policy.uses_next:  # the union's experts no member runs any more: their request at this step passed
        for r0 in range(K):
            e = sel[t, l, r0]
            if e < 0:
                continue
            kept = False
            for r in range(n):
                if state.row[r] == e:
                    kept = True
            if not kept:
                _passed(policy, state, fo, base + e, next_req[t, l, r0], rekey, pool)
    return n_in, displaced, n_changed
