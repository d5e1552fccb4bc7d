"""The step seam's rule: rerouting (--reroute bias:λ | keep:J) rewrites a step's row before its requests are
handled (docs/replay-semantics.md, "Rerouting"; the records and parsing are policies/reroute.py). Called by the
ext kernel once per step, out of line; tests/reference_replay.py has the same rule."""

import math

from moesim.jitcache import cached_njit
from moesim.policies.reroute import BIAS, RESIDENT_CACHE
from moesim.policies.structures import NREQ, RES

NEVER_USED = -(1 << 62)  # State.last_req of an expert not requested since the last reset


@cached_njit(_nrt=False)
def select(policy, steps, state, fo, t, l, base, tg):
    """Rewrite the step row (state.row, row_w, row_wm, row_next) of step (t, l) of token tg. Returns (requests
    rerouted in, the router's gate mass rerouted away, whether the first choice changed); a step whose set of
    experts does not change gets the router's row as it is, and (0, 0.0, False)."""
    sel, w, wm, cand, next_req = steps.sel, steps.w, steps.wm, steps.cand, steps.next_req
    logits, score = steps.logits, steps.score
    row, row_w, row_wm, row_next = state.row, state.row_w, state.row_wm, state.row_next
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
        for r in range(k):
            row[r] = sel[t, l, r]
            row_w[r] = w[t, l, r]
            row_wm[r] = wm[t, l, r]
            row_next[r] = next_req[t, l, r]
        return 0, 0.0, False
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
    # the row: by weight, equal weights in candidate order (a stable selection sort of the k)
    for r in range(k):
        best = -1
        for q in range(k):
            if pos[q] >= 0 and (best < 0 or nw[q] > nw[best]):
                best = q
        j = pos[best]
        e = cand[t, l, j]
        row[r] = e
        row_w[r] = nw[best]
        row_wm[r] = nw[best]
        row_next[r] = -1  # rerouted in: its next router request stays its NREQ
        for r0 in range(k):
            if sel[t, l, r0] == e:
                row_next[r] = next_req[t, l, r0]
        pos[best] = -1
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
                fo[base + e, NREQ] = next_req[t, l, r0]
    for r in range(k):
        found = False
        for r0 in range(k):
            if sel[t, l, r0] == row[r]:
                found = True
        if not found:
            n_in += 1
    return n_in, displaced, row[0] != sel[t, l, 0]
