"""The kernel's clock (link queue, background copies, host-RAM tier) against the reference."""

import dataclasses
import itertools

import numpy as np
import pytest
from reference_replay import COUNTERS, random_routing_arrays, reference_replay
from replay_helpers import make_routing, seeded_rng

from moesim.costmodel.timing import cost_params
from moesim.policies import registry
from moesim.policies.miss import OUTCOMES
from moesim.simulator import SimConfig, simulate

EVICTIONS = [n for n in registry.names() if not registry.get(n).schedules]  # re-pinning: test_repin.py
MISSES = ["fetch-all", "threshold:0.3", "first-choice", "substitute", "cpu"]


def fake_cost(L, E, rng, ram_slots, engine_costs=False):
    """Random seconds per operation; with ``engine_costs`` also a CPU-layer hand-off and write-back."""
    base = cost_params("qwen3-30b-a3b", "q4_k_m", "rtx3090-pcie4")
    v = rng.uniform(0.5, 2.0, size=10)
    return dataclasses.replace(
        base, s_dense=v[0] * L, s_dense_per_seq=0.0, s_expert_vram=v[1] * 0.1, s_fetch_ram=v[2],
        s_fetch_nvme=v[3] * 3, s_expert_cpu=v[4], s_expert_cpu_nvme=v[5] * 3, s_copy_link=v[6] * 2,
        s_copy_nvme=v[7] * 5, ram_expert_capacity=ram_slots, unified=False,
        s_cpu_handoff=v[8] * 0.5 if engine_costs else 0.0, s_writeback=v[9] if engine_costs else 0.0)


@pytest.mark.parametrize("eviction,miss", list(itertools.product(EVICTIONS, MISSES)))
def test_timed_kernel_matches_reference(eviction, miss):
    with seeded_rng("timed", eviction, miss) as rng:
        _timed_kernel_matches_reference(rng, eviction, miss)


def _timed_kernel_matches_reference(rng, eviction, miss):
    for T, L, E, k, M, n_seq, slots, ram_slots, alloc, engine in [(60, 2, 12, 3, 8, 2, 3, 5, "per-layer", False),
                                                                 (50, 3, 8, 2, 6, 1, 2, 30, "global", True),
                                                                 (40, 1, 16, 4, 10, 1, 4, 0, "per-layer", True)]:
        sel, w, cand, seq = random_routing_arrays(rng, T, L, E, k, M, n_seq)
        routing = make_routing(sel, w, cand, seq, E)
        cost = fake_cost(L, E, rng, ram_slots, engine)
        admit = None if miss in ("fetch-all", "cpu") else 0.4
        config = SimConfig(eviction=eviction, miss=miss, slots=slots, admit=admit, allocation=alloc,
                           reset_per_sequence=n_seq > 1)
        res = simulate(routing, config, cost=cost)
        ram_cap = ram_slots if ram_slots < L * E else None
        counts = {}
        for t in range(T):
            for l in range(L):
                for e in sel[t, l]:
                    counts[(l, int(e))] = counts.get((l, int(e)), 0) + 1
        popular = sorted(((l, e) for l in range(L) for e in range(E)), key=lambda o: (-counts.get(o, 0), o))
        ref_layers, ref_tokens = reference_replay(
            sel, w, cand, seq, E, eviction=eviction, miss=miss.partition(":")[0],
            theta=float(miss.partition(":")[2] or 0), slots=slots, admit=admit, allocation=alloc,
            reset_per_sequence=n_seq > 1, ram_cap=ram_cap, ram_warm=list(reversed(popular[:ram_cap or 0])),
            cost={"dense_layer": cost.s_dense / L, "vram": cost.s_expert_vram, "fetch_ram": cost.s_fetch_ram,
                  "fetch_nvme": cost.s_fetch_nvme, "cpu_ram": cost.s_expert_cpu,
                  "cpu_nvme": cost.s_expert_cpu_nvme, "copy_ram": cost.s_copy_link, "copy_nvme": cost.s_copy_nvme,
                  "cpu_handoff": cost.s_cpu_handoff, "writeback": cost.s_writeback})
        for i, name in enumerate(COUNTERS):
            assert res.counts[:, i].tolist() == [ref_layers[l][name] for l in range(L)], f"{config.label()} {name}"
        np.testing.assert_allclose(res.token_seconds, [x["seconds"] for x in ref_tokens], rtol=1e-9)
        np.testing.assert_allclose(res.token_stall, [x["stall"] for x in ref_tokens], rtol=1e-9, atol=1e-12)
        assert res.timing["s_per_token"] == pytest.approx(sum(x["seconds"] for x in ref_tokens) / T)


def test_slow_link_delays_admission():
    """With copies slower than a token, an admitted expert arrives later than the next step."""
    rng = np.random.default_rng(5)
    sel, w, cand, seq = random_routing_arrays(rng, 80, 1, 16, 4, 12, 1)
    routing = make_routing(sel, w, cand, seq, 16)
    free = simulate(routing, eviction="lru", miss="substitute", slots=4, admit=0.3)
    slow = simulate(routing, eviction="lru", miss="substitute", slots=4, admit=0.3,
                    cost=dataclasses.replace(fake_cost(1, 16, rng, 0), s_copy_link=50.0))
    assert free.totals()["admissions"] > slow.totals()["admissions"] > 0


@pytest.mark.parametrize("eviction", ["lru", "fifo", "lfu"])
def test_plain_replay_records_the_reference_decisions(eviction):
    """The plain kernels' request loops (simulator/kernel_plain.py, compiled per policy): every
    request's recorded outcome, the clock with a host-RAM tier and write-backs, and the untouched mass."""
    with seeded_rng("plain-record", eviction) as rng:
        sel, w, cand, seq = random_routing_arrays(rng, 60, 2, 12, 3, 8, 1)
        routing = make_routing(sel, w, cand, seq, 12)
        cost = fake_cost(2, 12, rng, 7, engine_costs=True)
        res = simulate(routing, SimConfig(eviction=eviction, miss="fetch-all", slots=3), cost=cost, record=True)
        decisions = {}
        _, ref_tokens = reference_replay(
            sel, w, cand, seq, 12, eviction=eviction, miss="fetch-all", slots=3, ram_cap=7, decisions=decisions,
            ram_warm=_ram_warm(sel, 12, 7),
            cost={"dense_layer": cost.s_dense / 2, "vram": cost.s_expert_vram, "fetch_ram": cost.s_fetch_ram,
                  "fetch_nvme": cost.s_fetch_nvme, "writeback": cost.s_writeback})
        got = {key: OUTCOMES[res.decisions.outcome[key]] for key in np.ndindex(res.decisions.outcome.shape)}
        assert got == {key: outcome for key, (outcome, _) in decisions.items()}
        np.testing.assert_allclose(res.token_seconds, [x["seconds"] for x in ref_tokens], rtol=1e-9)
        np.testing.assert_allclose(res.token_stall, [x["stall"] for x in ref_tokens], rtol=1e-9, atol=1e-12)
        assert not res.token_mass.any() and not res.mass.any()
        assert res.totals()["fetches_nvme"] > 0 and res.totals()["evictions"] > 0


def _ram_warm(sel, E, n):
    """The host-RAM tier's initial content as the builder fills it: the n most requested experts, least
    popular first."""
    L = sel.shape[1]
    counts = {}
    for t in range(sel.shape[0]):
        for l in range(L):
            for e in sel[t, l]:
                counts[(l, int(e))] = counts.get((l, int(e)), 0) + 1
    popular = sorted(((l, e) for l in range(L) for e in range(E)), key=lambda o: (-counts.get(o, 0), o))
    return list(reversed(popular[:n]))
