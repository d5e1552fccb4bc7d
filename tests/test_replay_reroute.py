"""Rerouting (--reroute, the step seam) against the plain-Python reference, count for count and second for second:
bias and keep, every eviction, pools, residency by cache and by recent use, original and biased weights, clocked,
streamed, with the decision record; the identities (bias:0 and keep:k are the plain replay); and the refusals."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from reference_replay import COST_KEYS, COUNTERS, reference_replay
from replay_helpers import make_routing, seeded_rng

from moesim.costmodel.timing import cost_params
from moesim.errors import MoesimError
from moesim.policies import registry
from moesim.simulator import SimConfig, simulate
from moesim.simulator.batch import batch_routing
from moesim.traces.stream import DecodedStore


def scored_routing(rng, T, L, E, k, M, n_seq=1, sigmoid=False):
    """A routing with its candidates' logits (equal logits happen: the tie rule is exercised)."""
    base = rng.normal(size=(L, E))
    state = rng.normal(size=(L, E))
    logits = np.empty((T, L, E))
    for t in range(T):
        state = 0.7 * state + 0.3 * rng.normal(size=(L, E))
        logits[t] = np.round(base + state, 1)
    ids = np.broadcast_to(np.arange(E), logits.shape)
    order = np.lexsort((ids, -logits), axis=-1)  # candidate order: score descending, lower id first
    cand = order[..., :M].astype(np.int16)
    x = np.take_along_axis(logits, order[..., :M], axis=-1).astype(np.float32)
    xk = x[..., :k].astype(np.float64)
    if sigmoid:
        ww = 1.0 / (1.0 + np.exp(-xk))
    else:
        ww = np.exp(xk - xk[..., :1])
    ww = ww / ww.sum(axis=-1, keepdims=True)
    rank = np.lexsort((cand[..., :k], -ww), axis=-1)  # rank: weight descending, candidate order on ties
    sel = np.take_along_axis(cand[..., :k], rank, axis=-1).astype(np.int16)
    w = np.take_along_axis(ww, rank, axis=-1).astype(np.float32)
    seq = np.sort(rng.integers(0, n_seq, size=T)).astype(np.int32)
    r = make_routing(sel, w, cand, seq, E)
    meta = dataclasses.replace(r.meta, gating="sigmoid" if sigmoid else "softmax")
    return dataclasses.replace(r, meta=meta, logits=x)


def _reference(routing, config, cost=None, rows=None):
    rule = config.reroute.split(":")
    ms, _, theta = config.miss.partition(":")
    run, wm, members, tokens = routing, None, None, None
    if config.batch > 1:  # the lock-step union, each member rerouted on its own
        run, wm, members = batch_routing(routing, config.batch)
        tokens = (routing.sel, routing.w, routing.cand, routing.logits)
    return reference_replay(
        run.sel, run.w, run.cand, run.seq, routing.n_experts, eviction=config.eviction_name, wm=wm,
        members=members, tokens=tokens,
        miss=ms, theta=float(theta or 0), slots=config.slots, admit=config.admit, allocation=config.allocation,
        warm=config.warm, reset_per_sequence=config.reset_per_sequence, step_pin=config.step_pin, cost=cost,
        reroute=(rule[0], float(rule[1])), reroute_pool=config.reroute_pool,
        reroute_resident=config.reroute_resident, reroute_weights=config.reroute_weights, logits=routing.logits,
        gating=routing.meta.gating, rows=rows)


def _clock(L):
    """A machine's CostParams with round numbers and the reference's cost keys for them (L layers)."""
    p = dataclasses.replace(cost_params("qwen3-30b-a3b", "q4_k_m", "rtx3090-pcie4"), s_dense=0.01 * L,
                            s_dense_per_seq=0.0, s_expert_vram=0.002, s_fetch_ram=0.05, s_fetch_nvme=0.2,
                            s_copy_link=0.04, s_copy_nvme=0.15, s_writeback=0.003, ram_expert_capacity=10 ** 6,
                            unified=False, s_router_sync=0.001)
    return p, dict.fromkeys(COST_KEYS, 0.0) | {
        "dense_layer": p.s_dense / L, "vram": p.s_expert_vram, "fetch_ram": p.s_fetch_ram,
        "fetch_nvme": p.s_fetch_nvme, "copy_ram": p.s_copy_link, "copy_nvme": p.s_copy_nvme,
        "writeback": p.s_writeback, "router_sync": p.s_router_sync}


def _check(res, layers, tokens, L):
    for i, name in enumerate(COUNTERS):
        assert res.counts[:, i].tolist() == [layers[l][name] for l in range(L)], name
        if len(res.token_counts):
            assert res.token_counts[:, i].tolist() == [tc[name] for tc in tokens], name
    np.testing.assert_allclose(res.mass, [layers[l]["mass"] for l in range(L)], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(res.displaced, [layers[l]["displaced"] for l in range(L)], rtol=1e-9, atol=1e-12)


RULES = ["bias:0.25", "bias:1.5", "keep:0", "keep:1", "keep:2"]
MISSES = ["fetch-all", "threshold:0.3", "first-choice", "substitute"]


@pytest.mark.parametrize("eviction", [n for n in registry.names() if not registry.get(n).schedules])
def test_kernel_matches_reference(eviction):
    with seeded_rng("reroute", eviction) as rng:
        routing = scored_routing(rng, 40, 2, 12, 3, 8, n_seq=2)
        for i, (rule, miss) in enumerate(itertools.product(RULES, MISSES)):
            config = SimConfig(eviction=eviction, miss=miss, slots=[2, 4, 6][i % 3], reroute=rule,
                               reroute_pool=[None, 5][i % 2], reroute_resident=["cache", "recent:3"][(i // 2) % 2],
                               reroute_weights=["original", "biased"][(i // 3) % 2],
                               admit=0.5 if miss in ("first-choice", "substitute") else None,
                               allocation=["per-layer", "global"][(i // 5) % 2], reset_per_sequence=i % 7 == 0)
            res = simulate(routing, config, record=True)
            rows: dict = {}
            layers, tokens = _reference(routing, config, rows=rows)
            _check(res, layers, tokens, routing.n_layers)
            got = res.decisions.selected
            for (t, l), row in rows.items():
                assert got[t, l].tolist() == row, (config.label(), t, l)
        assert res.counts[:, COUNTERS.index("rerouted")].sum() > 0


def test_sigmoid_gating_and_step_pin_and_the_clock():
    with seeded_rng("reroute-clock") as rng:
        for sigmoid in (False, True):
            routing = scored_routing(rng, 30, 2, 10, 3, 7, sigmoid=sigmoid)
            L = routing.n_layers
            p, cost = _clock(L)
            for eviction, step_pin in (("lru", False), ("belady", True), ("lfu", True), ("freq", False)):
                config = SimConfig(eviction=eviction, miss="threshold:0.2", slots=3, reroute="bias:0.5", admit=0.3,
                                   step_pin=step_pin, overlap="none")
                res = simulate(routing, config, cost=p)
                layers, tokens = _reference(routing, config, cost=cost)
                _check(res, layers, tokens, L)
                np.testing.assert_allclose(res.token_seconds, [tc["seconds"] for tc in tokens], rtol=1e-9)


@pytest.mark.parametrize("rule", ["bias:0", "keep:3"])
def test_the_identities_are_the_plain_replay(rule):
    with seeded_rng("reroute-identity", rule) as rng:
        routing = scored_routing(rng, 40, 3, 16, 3, 10)
        for eviction, miss in (("lru", "fetch-all"), ("belady", "threshold:0.3"), ("arc", "substitute")):
            plain = simulate(routing, SimConfig(eviction=eviction, miss=miss, slots=4, admit=0.5), record=True)
            rer = simulate(routing, SimConfig(eviction=eviction, miss=miss, slots=4, admit=0.5, reroute=rule),
                           record=True)
            assert (rer.counts[:, :len(COUNTERS) - 2] == plain.counts[:, :len(COUNTERS) - 2]).all()
            assert rer.counts[:, -2:].sum() == 0 and rer.displaced.sum() == 0
            assert (rer.decisions.outcome == plain.decisions.outcome).all()
            np.testing.assert_array_equal(rer.mass, plain.mass)


@pytest.mark.parametrize("eviction", ["lru", "belady", "freq", "arc"])
def test_batched_matches_reference(eviction):
    """Batched: each member's row rerouted at the step's residency, the step the union; counted per member."""
    with seeded_rng("reroute-batch", eviction) as rng:
        routing = scored_routing(rng, 48, 2, 12, 3, 8, n_seq=5)
    L = routing.n_layers
    p, cost = _clock(L)
    for i, (rule, miss) in enumerate(itertools.product(["bias:0.5", "keep:1", "keep:0"], MISSES)):
        config = SimConfig(eviction=eviction, miss=miss, slots=[3, 5][i % 2], reroute=rule, batch=[2, 3][i % 2],
                           reroute_resident=["cache", "recent:2"][(i // 2) % 2],
                           reroute_weights=["original", "biased"][(i // 3) % 2],
                           admit=0.5 if miss in ("first-choice", "substitute") else None,
                           allocation=["per-layer", "global"][(i // 4) % 2])
        rows: dict = {}
        clocked = i % 3 == 0
        res = simulate(routing, config, cost=p if clocked else None, record=True)
        layers, tokens = _reference(routing, config, cost=cost if clocked else None, rows=rows)
        _check(res, layers, tokens, L)
        if clocked:
            np.testing.assert_allclose(res.token_seconds, [tc["seconds"] for tc in tokens], rtol=1e-9)
        got = res.decisions.selected
        for (t, l), row in rows.items():
            assert got[t, l].tolist() == row, (config.label(), t, l)
    assert res.counts[:, COUNTERS.index("rerouted")].sum() > 0


def test_batched_identities_are_the_batched_replay():
    with seeded_rng("reroute-batch-identity") as rng:
        routing = scored_routing(rng, 40, 2, 14, 3, 8, n_seq=4)
    for rule in ("bias:0", "keep:3"):
        plain = simulate(routing, SimConfig(eviction="lru", miss="substitute", slots=4, batch=2), record=True)
        rer = simulate(routing, SimConfig(eviction="lru", miss="substitute", slots=4, batch=2, reroute=rule),
                       record=True)
        assert (rer.counts == plain.counts).all() and rer.displaced.sum() == 0
        np.testing.assert_array_equal(rer.mass, plain.mass)


def test_streamed_equals_in_memory(tmp_path):
    with seeded_rng("reroute-stream") as rng:
        routing = scored_routing(rng, 60, 2, 12, 3, 8, n_seq=3)
    config = SimConfig(eviction="belady", miss="first-choice", slots=3, admit=0.5, reroute="bias:0.4",
                       reroute_resident="recent:2")
    whole = simulate(routing, config)
    with DecodedStore.from_routing(routing) as store:
        streamed = simulate(store, config, chunk_tokens=7)
    assert (streamed.counts == whole.counts).all()
    np.testing.assert_allclose(streamed.displaced, whole.displaced, rtol=1e-12)


@pytest.mark.parametrize("kwargs, message", [
    (dict(reroute="bias:-1"), "λ >= 0"), (dict(reroute="bias:nan"), "λ >= 0"), (dict(reroute="keep:1.5"), "whole"),
    (dict(reroute="skew:1"), "unknown reroute"), (dict(reroute="keep:9"), "more than the k"),
    (dict(reroute="bias:0.1", reroute_pool=2), "pool"), (dict(reroute="bias:0.1", reroute_pool=99), "pool"),
    (dict(reroute="bias:0.1", reroute_resident="recent:0"), "W >= 1"),
    (dict(reroute="bias:0.1", reroute_resident="lately"), "unknown --reroute-resident"),
    (dict(reroute="bias:0.1", reroute_weights="mixed"), "--reroute-weights"),
    (dict(reroute_pool=4), "qualify --reroute"),
])
def test_bad_specs_are_one_line(kwargs, message):
    with seeded_rng("reroute-bad") as rng:
        routing = scored_routing(rng, 10, 1, 8, 3, 6)
    with pytest.raises(MoesimError, match=message):
        simulate(routing, SimConfig(slots=2, **kwargs))


def test_a_trace_without_scores_or_with_its_own_selection_is_refused():
    with seeded_rng("reroute-refused") as rng:
        routing = scored_routing(rng, 10, 1, 8, 3, 6)
    with pytest.raises(MoesimError, match="scores"):
        simulate(dataclasses.replace(routing, logits=None), SimConfig(slots=2, reroute="bias:0.1"))
    sel = routing.sel.copy()
    sel[0, 0, 2] = routing.cand[0, 0, 5]  # a model's own selection: not the top k of its candidates
    with pytest.raises(MoesimError, match="top k"):
        simulate(dataclasses.replace(routing, sel=sel), SimConfig(slots=2, reroute="bias:0.1"))
