"""The numba kernel against the plain-Python reference, count for count."""

import itertools

import numpy as np
import pytest
from reference_replay import COUNTERS, random_routing_arrays, reference_replay
from replay_helpers import make_routing, seeded_rng

from moesim.policies import registry
from moesim.simulator import SimConfig, simulate

EVICTIONS = [n for n in registry.names() if not registry.get(n).schedules]  # re-pinning: test_repin.py
MISSES = ["fetch-all", "threshold:0.3", "first-choice", "substitute", "drop", "cpu"]
GEOMETRIES = [  # T, L, E, k, M, sequences
    (50, 1, 4, 1, 4, 1),
    (40, 2, 8, 2, 6, 2),
    (30, 3, 16, 4, 12, 3),
    (30, 2, 33, 3, 8, 1),
]


def _compare(routing, ref_args, config):
    res = simulate(routing, config)
    ref_layers, ref_tokens = reference_replay(routing.sel, routing.w, routing.cand, routing.seq,
                                              routing.n_experts, **ref_args)
    for i, name in enumerate(COUNTERS):
        got = res.counts[:, i].tolist()
        want = [ref_layers[l][name] for l in range(routing.n_layers)]
        assert got == want, f"{config.label()}: {name} per layer {got} != reference {want}"
        got_t = res.token_counts[:, i].tolist()
        want_t = [tc[name] for tc in ref_tokens]
        assert got_t == want_t, f"{config.label()}: {name} per token differs from the reference"
    np.testing.assert_allclose(res.mass, [ref_layers[l]["mass"] for l in range(routing.n_layers)], rtol=1e-9,
                               atol=1e-9)
    np.testing.assert_allclose(res.token_mass, [tc["mass"] for tc in ref_tokens], rtol=1e-9, atol=1e-9)
    return res


@pytest.mark.parametrize("eviction,miss", list(itertools.product(EVICTIONS, MISSES)))
def test_kernel_matches_reference(eviction, miss):
    with seeded_rng("reference", eviction, miss) as rng:
        _kernel_matches_reference(rng, eviction, miss)


def _kernel_matches_reference(rng, eviction, miss):
    for gi, (T, L, E, k, M, n_seq) in enumerate(GEOMETRIES):
        sel, w, cand, seq = random_routing_arrays(rng, T, L, E, k, M, n_seq)
        routing = make_routing(sel, w, cand, seq, E)
        slot_choices = sorted({1, max(1, E // 4), E // 2, E})
        for slots in slot_choices:
            allocation = ["per-layer", "global"][(gi + slots) % 2]
            admit = [None, 0.4, 1.0][(gi + slots) % 3] if miss not in ("fetch-all", "cpu") else None
            warm = bool((gi + slots) % 2)
            warmup = [0, 3][gi % 2]
            reset = n_seq > 1 and slots % 2 == 0
            config = SimConfig(eviction=eviction, miss=miss, slots=slots, admit=admit, allocation=allocation,
                               warm=warm, warmup_tokens=warmup, reset_per_sequence=reset)
            ms, _, theta = miss.partition(":")
            _compare(routing, dict(eviction=eviction, miss=ms, theta=float(theta or 0), slots=slots, admit=admit,
                                   allocation=allocation, warm=warm, warmup_tokens=warmup,
                                   reset_per_sequence=reset), config)


@pytest.mark.parametrize("half_life", [0.5, 3.0, 40.0])
def test_freq_decay_matches_reference(half_life):
    rng = np.random.default_rng(7)
    sel, w, cand, seq = random_routing_arrays(rng, 400, 2, 12, 3, 6, 1)
    routing = make_routing(sel, w, cand, seq, 12)
    for miss, slots, alloc in [("fetch-all", 3, "per-layer"), ("threshold:0.3", 5, "global")]:
        config = SimConfig(eviction=f"freq:{half_life}", miss=miss, slots=slots, allocation=alloc, admit=0.5)
        ms, _, theta = miss.partition(":")
        _compare(routing, dict(eviction="freq", miss=ms, theta=float(theta or 0), slots=slots, admit=0.5,
                               allocation=alloc, half_life=half_life), config)


def test_static_prefix_matches_reference():
    rng = np.random.default_rng(3)
    sel, w, cand, seq = random_routing_arrays(rng, 80, 2, 10, 2, 5, 1)
    routing = make_routing(sel, w, cand, seq, 10)
    config = SimConfig(eviction="static:20", miss="substitute", slots=3)
    res = _compare(routing, dict(eviction="static", miss="substitute", slots=3, static_prefix=20), config)
    assert res.totals()["admissions"] == 0


def test_invariants_on_random_traces():
    rng = np.random.default_rng(11)
    sel, w, cand, seq = random_routing_arrays(rng, 120, 2, 12, 3, 8, 2)
    routing = make_routing(sel, w, cand, seq, 12)
    distinct = len({(l, int(e)) for l in range(2) for e in np.unique(sel[:, l])})
    fetch_all_misses = {}
    for eviction in EVICTIONS:
        for miss in MISSES:
            for slots in (1, 4, 12):
                tot = simulate(routing, eviction=eviction, miss=miss, slots=slots, admit=0.5).totals()
                assert tot["hits"] + tot["misses"] == tot["requests"] == 120 * 2 * 3
                assert tot["misses"] == tot["fetches"] + tot["substitutions"] + tot["drops"] + tot["cpu"]
                if eviction.startswith("static"):
                    assert tot["admissions"] == 0
                if miss == "fetch-all":
                    fetch_all_misses[(eviction, slots)] = tot["misses"]
                    # E slots: compulsory misses only (s3fifo admits nothing below 20 slots, as libCacheSim)
                    if slots == 12 and not eviction.startswith("static") and eviction != "s3fifo":
                        assert tot["misses"] == distinct
                    if eviction == "s3fifo":
                        assert tot["admissions"] == tot["evictions"] == 0 and tot["hits"] == 0
    for slots in (1, 4, 12):
        best = fetch_all_misses[("belady", slots)]
        assert all(best <= fetch_all_misses[(ev, slots)] for ev in EVICTIONS if not ev.startswith("static"))


PARAMETRIZED = [("lruk:1", {"k": 1}), ("lruk:3", {"k": 3}), ("lfru:2", {"decay_tokens": 2}),
                ("lfru:5", {"decay_tokens": 5})]


@pytest.mark.parametrize("spec,params", PARAMETRIZED, ids=[s for s, _ in PARAMETRIZED])
@pytest.mark.parametrize("miss", ["fetch-all", "substitute", "first-choice"])
def test_kernel_matches_reference_with_a_parameter(spec, params, miss):
    """The evictions whose parameter changes their order (lruk's K, lfru's decay period in tokens: the kernel's
    ticks per token against the reference's tokens)."""
    name = spec.partition(":")[0]
    with seeded_rng("reference-param", spec, miss) as rng:
        for gi, (T, L, E, k, M, n_seq) in enumerate(GEOMETRIES):
            sel, w, cand, seq = random_routing_arrays(rng, T, L, E, k, M, n_seq)
            routing = make_routing(sel, w, cand, seq, E)
            for slots in sorted({1, max(1, E // 4), E // 2}):
                allocation = ["per-layer", "global"][(gi + slots) % 2]
                warm, reset = bool((gi + slots) % 2), n_seq > 1 and slots % 2 == 0
                config = SimConfig(eviction=spec, miss=miss, slots=slots, allocation=allocation, warm=warm,
                                   reset_per_sequence=reset)
                ms, _, theta = miss.partition(":")
                _compare(routing, dict(eviction=name, miss=ms, theta=float(theta or 0), slots=slots,
                                       allocation=allocation, warm=warm, reset_per_sequence=reset, params=params),
                         config)
