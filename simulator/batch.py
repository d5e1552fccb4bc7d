"""Batch B: B sequences decoded in lock step read the union of their experts.

A batched routing has one step per (group of B sequences, position): the layer's
requests are the union of the members' selected experts, ranked by their best
rank across members (then highest weight, then lower id), padded with -1. The
miss policy reads each union expert's best rank and largest weight (the 0.15 rule
fetches what any member needs as a first choice or with w >= θ); substituting or
dropping it costs the sum of the members' weights (``wm``). Substitution
candidates interleave the members' candidate lists by rank.
"""

from __future__ import annotations

import numpy as np

from moesim.errors import MoesimError
from moesim.jitcache import cached_njit
from moesim.traces.routing import Routing


def lock_step_members(seq: np.ndarray, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Token indices [steps, batch] (-1 where a member has ended) and each step's group:
    sequences in id order (tokens are ordered by (seq, pos)), grouped batch at a time,
    each group's members advancing one position per step."""
    seq_ids, starts, lengths = np.unique(seq, return_index=True, return_counts=True)
    rows, groups = [], []
    for g in range(0, len(seq_ids), batch):
        idx = list(range(g, min(g + batch, len(seq_ids))))
        n = int(lengths[idx].max())
        block = np.full((n, batch), -1, np.int64)
        for j, s in enumerate(idx):
            block[: lengths[s], j] = np.arange(starts[s], starts[s] + lengths[s])
        rows.append(block)
        groups.append(np.full(n, g // batch, np.int32))
    return np.concatenate(rows), np.concatenate(groups)


@cached_njit()
def _union(sel, w, cand, members, E):
    S, B = members.shape
    _, L, k = sel.shape
    M = cand.shape[2]
    K = min(E, B * k)
    MM = min(E, B * M)
    usel = np.full((S, L, K), -1, np.int16)
    uw = np.zeros((S, L, K), np.float32)
    uwm = np.zeros((S, L, K), np.float32)
    ucand = np.full((S, L, MM), -1, np.int16)
    best_rank = np.full(E, k, np.int64)
    wmax = np.zeros(E, np.float64)
    wsum = np.zeros(E, np.float64)
    seen = np.zeros(E, np.bool_)
    keys = np.zeros(K, np.int64)
    ids = np.zeros(K, np.int64)
    for s in range(S):
        for l in range(L):
            n = 0
            for j in range(B):
                t = members[s, j]
                if t < 0:
                    continue
                for r in range(k):
                    e = sel[t, l, r]
                    if not seen[e]:
                        seen[e] = True
                        best_rank[e] = r
                        wmax[e] = w[t, l, r]
                        wsum[e] = w[t, l, r]
                        ids[n] = e
                        n += 1
                    else:
                        best_rank[e] = min(best_rank[e], r)
                        wmax[e] = max(wmax[e], w[t, l, r])
                        wsum[e] += w[t, l, r]
            # rank the union: best rank, then larger weight (to 2^-30), then lower id
            for i in range(n):
                e = ids[i]
                wq = (1 << 30) - np.int64(wmax[e] * (1 << 30))
                keys[i] = (best_rank[e] << 46) | (wq << 15) | e
            order = np.argsort(keys[:n])
            for i in range(n):
                e = ids[order[i]]
                usel[s, l, i] = e
                uw[s, l, i] = wmax[e]
                uwm[s, l, i] = wsum[e]
                seen[e] = False
            m = 0
            for r in range(M):
                for j in range(B):
                    t = members[s, j]
                    if t < 0:
                        continue
                    e = cand[t, l, r]
                    if not seen[e]:
                        seen[e] = True
                        ucand[s, l, m] = e
                        m += 1
            for i in range(m):
                seen[ucand[s, l, i]] = False
    return usel, uw, uwm, ucand


def batch_routing(routing: Routing, batch: int) -> tuple[Routing, np.ndarray, np.ndarray]:
    """The lock-step union routing of ``batch`` sequences at a time, with its weights for
    the miss policy and the gate mass per union expert, and the member tokens [steps, B]."""
    if batch < 1:
        raise MoesimError(f"batch must be >= 1, got {batch}")
    n_seq = routing.n_sequences
    if batch > n_seq:
        raise MoesimError(f"batch {batch} needs at least {batch} sequences; the trace has {n_seq}")

    def union():
        members, group = lock_step_members(routing.seq, batch)
        usel, uw, uwm, ucand = _union(routing.sel, routing.w, routing.cand, members, routing.n_experts)
        first = members.max(axis=1)
        phase = np.where(members >= 0, routing.phase[np.maximum(members, 0)], 1)
        decode = (phase == 1).all(axis=1).astype(np.int8)
        b = Routing(meta=routing.meta, seq=group, pos=routing.pos[first], phase=decode,
                    domain=routing.domain[first], domain_names=routing.domain_names, token=None,
                    sel=usel, w=uw, cand=ucand, digest=f"{routing.digest}:batch{batch}", path=routing.path)
        return b, uwm, members

    return routing.derived(("batch", batch), union)
