"""Speculative steps in the replay (simulator/speculative.py): a step verifies G + 1 tokens per sequence, reading the
union of their experts; tokens per second count the yielded tokens."""

import numpy as np
import pytest
from reference_replay import COUNTERS, random_routing_arrays, reference_replay
from replay_helpers import make_routing

from moesim.costmodel.timing import cost_params
from moesim.errors import MoesimError
from moesim.simulator import SimConfig, simulate
from moesim.simulator.speculative import (
    accepted_schedule,
    simulate_speculative,
    speculative_members,
    speculative_routing,
)


def _routing(seed=1, T=60, L=2, E=12, k=3, M=8, n_seq=1):
    rng = np.random.default_rng(seed)
    sel, w, cand, seq = random_routing_arrays(rng, T, L, E, k, M, n_seq)
    return make_routing(sel, w, cand, seq, E), (sel, w, cand, seq)


def test_accepted_drafts_spread_evenly():
    a = accepted_schedule(10, 4, 0.3)
    assert a.sum() == 12 and set(a.tolist()) <= {1, 2}
    assert accepted_schedule(5, 3, 0.0).tolist() == [0] * 5
    assert accepted_schedule(5, 3, 1.0).tolist() == [3] * 5


def test_members_and_yields():
    seq = np.zeros(10, np.int32)
    m, _, y = speculative_members(seq, 0, 0.7)
    assert m[:, 0].tolist() == list(range(10)) and y.tolist() == [1] * 10  # G = 0: plain decode
    m, _, y = speculative_members(seq, 3, 1.0)
    assert m.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, -1, -1]] and y.tolist() == [4, 4, 2]
    m, _, y = speculative_members(seq, 3, 0.0)  # every draft rejected: windows slide one token a step
    assert m[1].tolist() == [1, 2, 3, 4] and y.tolist() == [1] * 10
    m, _, y = speculative_members(seq, 2, 0.5)  # one of two drafts accepted per step
    assert m[:2].tolist() == [[0, 1, 2], [2, 3, 4]] and y.sum() == 10
    two = np.repeat(np.arange(2, dtype=np.int32), 6)
    m, g, y = speculative_members(two, 1, 1.0, batch=2)  # two sequences in lock step, 2 tokens each a step
    assert m[0].tolist() == [0, 1, 6, 7] and y.tolist() == [4, 4, 4] and g.tolist() == [0, 0, 0]


def test_union_reads_every_verified_tokens_experts():
    routing, (sel, w, _, _) = _routing()
    spec, wm, members, _ = speculative_routing(routing, 2, 0.5)
    for s in range(len(members)):
        toks = [t for t in members[s] if t >= 0]
        for layer in range(sel.shape[1]):
            want = {int(e) for t in toks for e in sel[t, layer]}
            got = [int(e) for e in spec.sel[s, layer] if e >= 0]
            assert set(got) == want and len(got) == len(want)
            for i, e in enumerate(spec.sel[s, layer]):
                if e >= 0:
                    ws = [float(w[t, layer, r]) for t in toks for r in range(sel.shape[2]) if sel[t, layer, r] == e]
                    assert wm[s, layer, i] == pytest.approx(sum(ws), rel=1e-6)
                    assert spec.w[s, layer, i] == pytest.approx(max(ws), rel=1e-6)


def test_no_drafts_is_the_plain_replay():
    routing, _ = _routing(2)
    cost = cost_params("qwen3-30b-a3b", "q4_k_m", "rtx3090-pcie4")
    config = SimConfig(eviction="lru", miss="substitute", slots=3, admit=0.4)
    plain = simulate(routing, config, cost=cost)
    spec = simulate_speculative(routing, config, 0, 0.5, cost=cost)
    np.testing.assert_array_equal(plain.counts, spec.counts)
    np.testing.assert_allclose(plain.mass, spec.mass, rtol=1e-6)
    np.testing.assert_allclose(plain.token_seconds, spec.token_seconds, rtol=1e-12)
    assert spec.timing["s_per_token"] == pytest.approx(plain.timing["s_per_token"])


@pytest.mark.parametrize("drafted,accept", [(3, 1.0), (3, 0.4), (2, 0.0)])
def test_speculative_clock_matches_the_reference_and_counts_yielded_tokens(drafted, accept):
    routing, _ = _routing(3, T=80)
    cost = cost_params("qwen3-30b-a3b", "q4_k_m", "rtx3090-pcie4")
    config = SimConfig(eviction="lru", miss="threshold:0.3", slots=3, admit=0.4)
    res = simulate_speculative(routing, config, drafted, accept, cost=cost)
    spec, wm, members, yields = speculative_routing(routing, drafted, accept)
    L = spec.n_layers
    layers, tok = reference_replay(
        spec.sel, spec.w, spec.cand, spec.seq, 12, eviction="lru", miss="threshold", theta=0.3, slots=3, admit=0.4,
        wm=wm, cost={"dense_layer": cost.s_dense / L, "vram": cost.s_expert_vram, "fetch_ram": cost.s_fetch_ram,
                     "fetch_nvme": cost.s_fetch_nvme, "copy_ram": cost.s_copy_link, "copy_nvme": cost.s_copy_nvme})
    for i, name in enumerate(COUNTERS):
        assert res.counts[:, i].tolist() == [layers[l][name] for l in range(L)], name
    np.testing.assert_allclose(res.mass, [layers[l]["mass"] for l in range(L)], rtol=1e-5)
    np.testing.assert_allclose(res.token_seconds, [x["seconds"] for x in tok], rtol=1e-9)
    assert res.counted_tokens == routing.n_tokens == int(yields.sum())
    assert res.timing["s_per_token"] == pytest.approx(sum(x["seconds"] for x in tok) / routing.n_tokens)
    assert res.extra["speculative"]["tokens_per_step"] == pytest.approx(routing.n_tokens / len(yields))


def test_bad_speculative_inputs():
    routing, _ = _routing()
    config = SimConfig(eviction="lru", miss="fetch-all", slots=3)
    for drafted, accept, message in ((-1, 0.5, "--speculative must be"), (2, None, "needs --accept"),
                                     (2, 1.5, "--accept must be"), (2, float("nan"), "--accept must be")):
        with pytest.raises(MoesimError, match=message):
            simulate_speculative(routing, config, drafted, accept)
