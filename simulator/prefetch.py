"""The kernel's side of prefetch (--prefetch): predicting a step's targets, serving a request whose prefetch is
still in flight, and the per-expert prefetch state. The policies' records and the next-layer table are in
policies/prefetch.py; the rules in docs/replay-semantics.md ("Prefetch").

Per-expert state (State.pf, int32): whether the expert's queued copy is a prefetch in flight, whether it is
resident by a prefetch not used yet, or whether its queued copy was already served to a request (a stale
queue entry, skipped when it pops). The completion time of a prefetch in flight is in State.pf_t.
"""

from numba import njit

from moesim.policies import prefetch as pol
from moesim.policies import registry

PF_NONE, PF_INFLIGHT, PF_LANDED, PF_STALE = range(4)
# State.pf_scal: the sequence of the last token whose rows State.pf_prev holds, and whether it holds any
PREV_SEQ, PREV_VALID = range(2)
N_PF_SCAL = 2


@njit(_nrt=False)  # type: ignore[call-overload]  # numba's NRT switch is not in its stubs
def reset(pf, pf_scal):
    """Forget every prefetch (the cache and the copy queues were emptied)."""
    for o in range(pf.shape[0]):
        pf[o] = PF_NONE
    pf_scal[PREV_VALID] = 0


@njit(_nrt=False)  # type: ignore[call-overload]  # numba's NRT switch is not in its stubs
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


@njit(_nrt=False)  # type: ignore[call-overload]  # numba's NRT switch is not in its stubs
def remember(l, t, sel, prev, pf_scal, seq_t):
    """prev-token: keep step (t, l)'s selection for the next token (and, at the last layer, its sequence)."""
    for r in range(sel.shape[2]):
        prev[l, r] = sel[t, l, r]
    if l == sel.shape[1] - 1:
        pf_scal[PREV_SEQ] = seq_t
        pf_scal[PREV_VALID] = 1


@njit(_nrt=False)  # type: ignore[call-overload]  # numba's NRT switch is not in its stubs
def serve_late(code, prm, pool, o, tick, ob, fo, po, heap, pf):
    """A request whose expert's prefetch is still in flight waits for it: the expert is admitted now (through
    the eviction policy, like a fetch) and the queued copy becomes stale. Returns the victim (as insert)."""
    pf[o] = PF_STALE
    return registry.insert(code, ob, fo, po, heap, prm, pool, o, tick)
