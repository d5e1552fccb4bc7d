"""A model's selection that is its top k only by a tie (it took a candidate of the same score as one the trace
ranks before it, lower id first; the emulator met one in a locality-trained demo model's closed loop) is rerouted
as the model's own top k: as if the trace ranked the selected first among the tied, counter for counter, and
bias:0 and keep:k stay the plain replay."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from reference_replay import COUNTERS, reference_replay
from replay_helpers import make_routing, seeded_rng

from moesim.errors import MoesimError
from moesim.simulator import SimConfig, simulate

T, L, E, K, M = 300, 2, 10, 3, 8


def tied_routing(rng):
    """(the model's routing, with a selection that takes the later of two tied candidates on some steps; the same
    routing with those candidates swapped, so its selection is its k first candidates; the tied steps)."""
    logits = np.round(rng.normal(size=(T, L, E)), 1)   # a coarse grid: many equal scores
    ids = np.broadcast_to(np.arange(E), logits.shape)
    order = np.lexsort((ids, -logits), axis=-1)
    cand = order[..., :M].astype(np.int16)
    x = np.take_along_axis(logits, order[..., :M], axis=-1).astype(np.float32)
    tie = x[..., K - 1] == x[..., K]                    # the k-th and the next candidate score alike
    swapped, xs = cand.copy(), x.copy()
    swapped[tie, K - 1], swapped[tie, K] = cand[tie, K], cand[tie, K - 1]
    sel = swapped[..., :K].copy()                        # the model took the later of the two
    xk = xs[..., :K].astype(np.float64)
    ww = np.exp(xk - xk[..., :1])
    w = (ww / ww.sum(axis=-1, keepdims=True)).astype(np.float32)
    seq = np.zeros(T, np.int32)
    model = dataclasses.replace(make_routing(sel, w, cand, seq, E), logits=x)
    model = dataclasses.replace(model, meta=dataclasses.replace(model.meta, gating="softmax"))
    ranked = dataclasses.replace(model, cand=swapped, logits=xs)
    return model, ranked, tie


@pytest.mark.parametrize("rule", ["bias:0.3", "keep:1", "bias:0", "keep:3"])
def test_a_tied_selection_reroutes_as_the_models_top_k(rule):
    with seeded_rng("reroute-ties") as rng:
        model, ranked, tie = tied_routing(rng)
    assert tie.sum() > 10
    config = SimConfig(eviction="lru", miss="fetch-all", slots=3, reroute=rule)
    got = simulate(model, config).totals()
    want = simulate(ranked, config).totals()
    assert {c: got[c] for c in COUNTERS} == {c: want[c] for c in COUNTERS}
    assert got["displaced_mass"] == pytest.approx(want["displaced_mass"], rel=1e-12)
    rule_name, value = rule.split(":")
    layers, _ = reference_replay(ranked.sel, ranked.w, ranked.cand, ranked.seq, E, eviction="lru",
                                 miss="fetch-all", slots=3, reroute=(rule_name, float(value)), logits=ranked.logits)
    assert {c: got[c] for c in COUNTERS} == {c: sum(layers[l][c] for l in range(L)) for c in COUNTERS}
    if rule in ("bias:0", "keep:3"):
        plain = simulate(model, SimConfig(eviction="lru", miss="fetch-all", slots=3)).totals()
        assert got["rerouted"] == 0 and {c: got[c] for c in COUNTERS if c not in ("rerouted", "first_choice_changed")} \
            == {c: plain[c] for c in COUNTERS if c not in ("rerouted", "first_choice_changed")}


def test_a_selection_below_the_top_k_is_still_refused():
    with seeded_rng("reroute-ties-refused") as rng:
        model, _, tie = tied_routing(rng)
    sel = model.sel.copy()
    t, l = np.argwhere(~tie)[0]
    sel[t, l, K - 1] = model.cand[t, l, M - 1]   # a strictly lower score: not a top k
    with pytest.raises(MoesimError, match="top k"):
        simulate(dataclasses.replace(model, sel=sel), SimConfig(slots=3, reroute="bias:0.1"))
