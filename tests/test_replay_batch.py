"""Batch B: lock-step sequences read the union of their experts."""

import numpy as np
import pytest
from reference_replay import COUNTERS, random_routing_arrays, reference_replay
from replay_helpers import make_routing

from moesim.errors import MoesimError
from moesim.simulator import SimConfig, simulate
from moesim.simulator.batch import batch_routing


def naive_union(routing, members):
    """Per step and layer: {expert: (best rank, max w, sum w)} over the live members."""
    out = []
    for row in members:
        layers = []
        for l in range(routing.n_layers):
            d = {}
            for t in row:
                if t < 0:
                    continue
                for r, (e, ww) in enumerate(zip(routing.sel[t, l], routing.w[t, l])):
                    e, ww = int(e), float(ww)
                    if e in d:
                        br, mx, sm = d[e]
                        d[e] = (min(br, r), max(mx, ww), sm + ww)
                    else:
                        d[e] = (r, ww, ww)
            layers.append(d)
        out.append(layers)
    return out


def test_union_matches_naive():
    rng = np.random.default_rng(2)
    sel, w, cand, seq = random_routing_arrays(rng, 90, 2, 12, 3, 6, 5)
    routing = make_routing(sel, w, cand, seq, 12)
    b, wm, members = batch_routing(routing, 2)
    assert (members >= 0).sum() == routing.n_tokens  # every token in exactly one step
    assert sorted(members[members >= 0].tolist()) == list(range(routing.n_tokens))
    for s, layers in enumerate(naive_union(routing, members)):
        for l, d in enumerate(layers):
            got = [int(e) for e in b.sel[s, l] if e >= 0]
            want = sorted(d, key=lambda e: (d[e][0], -d[e][1], e))
            assert got == want
            for i, e in enumerate(got):
                assert b.w[s, l, i] == pytest.approx(d[e][1])
                assert wm[s, l, i] == pytest.approx(d[e][2], rel=1e-6)


def test_batched_replay_matches_reference():
    rng = np.random.default_rng(4)
    sel, w, cand, seq = random_routing_arrays(rng, 100, 2, 16, 3, 8, 6)
    routing = make_routing(sel, w, cand, seq, 16)
    for eviction, miss in [("lru", "fetch-all"), ("freq", "threshold:0.3"), ("belady", "substitute")]:
        config = SimConfig(eviction=eviction, miss=miss, slots=5, batch=3, admit=0.5)
        res = simulate(routing, config)
        b, wm, _ = batch_routing(routing, 3)
        ref, _ = reference_replay(b.sel, b.w, b.cand, b.seq, 16, eviction=eviction, miss=miss.partition(":")[0],
                                  theta=float(miss.partition(":")[2] or 0), slots=5, admit=0.5, wm=wm)
        for i, name in enumerate(COUNTERS):
            assert res.counts[:, i].tolist() == [ref[l][name] for l in range(2)], name
        assert res.counted_tokens == routing.n_tokens


def test_batch_reads_fewer_experts_per_token():
    rng = np.random.default_rng(8)
    sel, w, cand, seq = random_routing_arrays(rng, 120, 2, 8, 3, 6, 8)
    routing = make_routing(sel, w, cand, seq, 8)
    one = simulate(routing, eviction="lru", miss="fetch-all", slots=2).totals()
    four = simulate(routing, eviction="lru", miss="fetch-all", slots=2, batch=4).totals()
    assert four["requests"] < one["requests"]  # the union overlaps
    with pytest.raises(MoesimError):
        simulate(routing, eviction="lru", miss="fetch-all", slots=2, batch=9)
