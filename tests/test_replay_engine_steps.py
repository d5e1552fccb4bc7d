"""--step-pin, --max-uploads and the lowbit:Q miss policy: the kernel against the plain-Python reference, count
for count and (clocked) second for second, per layer and with a global pool, with warm-up, reset per sequence,
--warm and --admit; and the options' errors."""

import itertools

import numpy as np
import pytest
from reference_replay import COUNTERS, random_routing_arrays, reference_replay
from replay_helpers import make_routing, seeded_rng
from test_replay_timed import fake_cost

from moesim.errors import MoesimError
from moesim.simulator import SimConfig, simulate
from moesim.simulator.config import STEP_PIN_REFUSED

PINNABLE = ["lru", "fifo", "lfu", "freq", "belady", "static", "static-layers"]
MISSES = ["fetch-all", "threshold:0.3", "lowbit:q4_k", "cpu"]
GEOMETRIES = [  # T, L, E, k, M, sequences
    (40, 2, 8, 2, 6, 2),
    (30, 3, 16, 4, 12, 3),
    (30, 2, 33, 3, 8, 1),
]


def _ref_cost(cost, L, quant):
    fl, lv = cost.lowbit_seconds(quant) if quant else (0.0, 0.0)
    return {"dense_layer": cost.s_dense / L, "vram": cost.s_expert_vram, "fetch_ram": cost.s_fetch_ram,
            "fetch_nvme": cost.s_fetch_nvme, "cpu_ram": cost.s_expert_cpu, "cpu_nvme": cost.s_expert_cpu_nvme,
            "copy_ram": cost.s_copy_link, "copy_nvme": cost.s_copy_nvme, "cpu_handoff": cost.s_cpu_handoff,
            "writeback": cost.s_writeback, "fetch_lowbit": fl, "lowbit_vram": lv}


def _check(routing, config, cost=None, ram_cap=None, ram_warm=()):
    L = routing.n_layers
    res = simulate(routing, config, cost=cost)
    ms, _, arg = config.miss.partition(":")
    slots, n_low = config.slots, 0
    if config.lowbit_share is not None:
        slots, n_low = config.lowbit_tier(config.slots, routing.n_experts, cost.bytes_per_expert,
                                          cost.expert_bytes_by_quant[config.low_quant])
    ref_layers, ref_tokens = reference_replay(
        routing.sel, routing.w, routing.cand, routing.seq, routing.n_experts, eviction=config.eviction_name,
        miss=ms, theta=float(arg) if ms == "threshold" else 0.0, slots=slots, admit=config.admit,
        allocation=config.allocation, warm=config.warm, warmup_tokens=config.warmup_tokens,
        reset_per_sequence=config.reset_per_sequence, step_pin=config.step_pin, max_uploads=config.max_uploads,
        lowbit_tier=n_low, overlap=config.overlap or "none",
        cost=None if cost is None else _ref_cost(cost, L, config.low_quant), ram_cap=ram_cap, ram_warm=ram_warm)
    for i, name in enumerate(COUNTERS):
        assert res.counts[:, i].tolist() == [ref_layers[l][name] for l in range(L)], f"{config.label()}: {name}"
        assert res.token_counts[:, i].tolist() == [x[name] for x in ref_tokens], f"{config.label()}: {name}/token"
    np.testing.assert_allclose(res.mass, [ref_layers[l]["mass"] for l in range(L)], rtol=1e-9, atol=1e-9)
    if cost is not None:
        np.testing.assert_allclose(res.token_seconds, [x["seconds"] for x in ref_tokens], rtol=1e-9)
        np.testing.assert_allclose(res.token_stall, [x["stall"] for x in ref_tokens], rtol=1e-9, atol=1e-12)
    return res


@pytest.mark.parametrize("eviction,miss", list(itertools.product(PINNABLE, MISSES)))
def test_engine_steps_match_reference(eviction, miss):
    with seeded_rng("engine-steps", eviction, miss) as rng:
        for gi, (T, L, E, k, M, n_seq) in enumerate(GEOMETRIES):
            sel, w, cand, seq = random_routing_arrays(rng, T, L, E, k, M, n_seq)
            routing = make_routing(sel, w, cand, seq, E)
            for slots in sorted({1, max(1, E // 4), E // 2}):
                for step_pin, max_up in [(True, None), (False, 1), (True, 2), (False, None)]:
                    allocation = ["per-layer", "global"][(gi + slots) % 2]
                    admit = [None, 0.4, 1.0][(gi + slots) % 3] if miss not in ("fetch-all", "cpu") else None
                    config = SimConfig(eviction=eviction, miss=miss, slots=slots, admit=admit, allocation=allocation,
                                       warm=bool((gi + slots) % 2) and not eviction.startswith("static"),
                                       warmup_tokens=[0, 3][gi % 2], reset_per_sequence=n_seq > 1 and slots % 2 == 0,
                                       step_pin=step_pin, max_uploads=max_up)
                    _check(routing, config)


@pytest.mark.parametrize("eviction,miss", list(itertools.product(PINNABLE, MISSES)))
def test_engine_steps_timed_match_reference(eviction, miss):
    with seeded_rng("engine-steps-timed", eviction, miss) as rng:
        for T, L, E, k, M, n_seq, slots, ram_slots, alloc, engine in [
                (50, 2, 12, 3, 8, 2, 3, 5, "per-layer", False), (40, 3, 8, 2, 6, 1, 2, 30, "global", True),
                (30, 1, 16, 4, 10, 1, 4, 0, "per-layer", True)]:
            sel, w, cand, seq = random_routing_arrays(rng, T, L, E, k, M, n_seq)
            routing = make_routing(sel, w, cand, seq, E)
            cost = fake_cost(L, E, rng, ram_slots, engine)
            ram_cap = ram_slots if ram_slots < L * E else None
            counts: dict = {}
            for e_l in itertools.product(range(T), range(L)):
                for e in sel[e_l]:
                    counts[(e_l[1], int(e))] = counts.get((e_l[1], int(e)), 0) + 1
            popular = sorted(((l, e) for l in range(L) for e in range(E)), key=lambda o: (-counts.get(o, 0), o))
            for step_pin, max_up, overlap in [(True, None, None), (True, 1, None), (False, 2, None),
                                              (True, 2, "layer"), (True, None, "cross-layer")]:
                if overlap and miss.startswith("lowbit"):
                    continue  # refused: lowbit:Q is not modelled under an overlapped clock
                config = SimConfig(eviction=eviction, miss=miss, slots=slots, allocation=alloc,
                                   admit=None if miss in ("fetch-all", "cpu") else 0.4,
                                   reset_per_sequence=n_seq > 1, step_pin=step_pin, max_uploads=max_up,
                                   overlap=overlap)
                _check(routing, config, cost, ram_cap, list(reversed(popular[:ram_cap or 0])))


TIER_MISSES = ["fetch-all", "threshold:0.3", "lowbit:q2_k", "cpu"]


@pytest.mark.parametrize("eviction,miss", list(itertools.product(PINNABLE + ["arc", "sieve"], TIER_MISSES)))
def test_lowbit_tier_matches_reference(eviction, miss):
    """--lowbit-share: a share of the slots holds low-bit copies of the most requested experts (after the pinned
    ones); a miss of one runs it whatever the miss policy."""
    with seeded_rng("lowbit-tier", eviction, miss) as rng:
        for T, L, E, k, M, n_seq, slots, alloc, share in [(50, 2, 16, 3, 8, 2, 8, "per-layer", 0.25),
                                                           (40, 3, 32, 4, 10, 1, 6, "global", 0.5)]:
            sel, w, cand, seq = random_routing_arrays(rng, T, L, E, k, M, n_seq)
            routing = make_routing(sel, w, cand, seq, E)
            cost = fake_cost(L, E, rng, 10 * L * E, False)
            pin = eviction not in STEP_PIN_REFUSED
            for step_pin, admit, overlap in [(False, None, None), (pin, 0.4, None), (pin, 0.4, "cross-layer")]:
                if overlap and miss.startswith("lowbit"):
                    continue
                config = SimConfig(eviction=eviction, miss=miss, slots=slots, allocation=alloc, lowbit_share=share,
                                   lowbit_quant="q2_k", admit=admit if miss != "fetch-all" else None,
                                   reset_per_sequence=n_seq > 1, step_pin=step_pin, warmup_tokens=2, overlap=overlap)
                res = _check(routing, config, cost)
                assert res.totals()["lowbit_tier"] > 0


def test_lowbit_tier_sizes_by_bytes_and_needs_a_price():
    config = SimConfig(slots=8, lowbit_share=0.25, lowbit_quant="q2_k")
    assert config.lowbit_tier(8, 128, 4.84375, 2.8958333) == (6, 3)  # 2 slots of q4_k_m bytes hold 3 q2_k copies
    assert config.lowbit_tier(8, 2, 4.84375, 1.0) == (6, 2)  # at most E
    with pytest.raises(MoesimError, match="needs a priced replay"):
        config.lowbit_tier(8, 128, None, None)
    assert SimConfig(slots=1, lowbit_share=0.9, lowbit_quant="q2_k").lowbit_tier(1, 8, 2.0, 1.0) == (1, 0)
    for kw, msg in [({"lowbit_share": 0.2}, "needs the copies' quantization"), ({"lowbit_quant": "q2_k"},
                    "give --lowbit-share"), ({"lowbit_share": 1.0, "lowbit_quant": "q2_k"}, "fraction in"),
                    ({"miss": "lowbit:q4_k", "lowbit_share": 0.2, "lowbit_quant": "q2_k"}, "differs")]:
        with pytest.raises(MoesimError, match=msg):
            SimConfig(slots=8, **kw)


def test_step_pin_keeps_the_steps_experts():
    """One slot, two experts a step: without pinning the second miss evicts the first (a stream); with it the
    second is fetched for this use only (pin_full) and the first stays."""
    sel = np.array([[[0, 1]], [[0, 1]]], np.int16)
    w = np.array([[[0.6, 0.4]], [[0.6, 0.4]]], np.float32)
    routing = make_routing(sel, w, sel.copy(), np.zeros(2, np.int32), 4)
    plain = simulate(routing, SimConfig(eviction="lru", slots=1)).totals()
    pinned = simulate(routing, SimConfig(eviction="lru", slots=1, step_pin=True)).totals()
    assert (plain["hits"], plain["evictions"]) == (0, 3)
    assert (pinned["hits"], pinned["pin_full"], pinned["evictions"]) == (1, 2, 0)


def test_max_uploads_caps_admissions():
    sel = np.array([[[0, 1, 2]]] * 3, np.int16)
    w = np.full((3, 1, 3), 1 / 3, np.float32)
    routing = make_routing(sel, w, sel.copy(), np.zeros(3, np.int32), 6)
    tot = simulate(routing, SimConfig(eviction="lru", slots=3, max_uploads=1)).totals()
    assert tot["capped"] == 2 + 1 and tot["hits"] == 0 + 1 + 2  # one more expert admitted a token


def test_lowbit_is_never_admitted_and_counts():
    with seeded_rng("lowbit-counts") as rng:
        sel, w, cand, seq = random_routing_arrays(rng, 40, 2, 8, 2, 6, 1)
        routing = make_routing(sel, w, cand, seq, 8)
        tot = simulate(routing, SimConfig(eviction="lru", miss="lowbit:q2_k", slots=2)).totals()
        assert tot["lowbit"] == tot["misses"] > 0 and tot["fetches"] == tot["admissions"] == tot["evictions"] == 0
        assert tot["mass_per_step"] == 0.0


@pytest.mark.parametrize("eviction", STEP_PIN_REFUSED)
def test_step_pin_refused_where_undefined(eviction):
    with pytest.raises(MoesimError, match="--step-pin is not defined"):
        SimConfig(eviction=eviction, slots=2, step_pin=True)


@pytest.mark.parametrize("spec,msg", [("lowbit", "needs a quantization"), ("lowbit:q3_xyz", "unknown quantization"),
                                      ("lowbit:q4 k", "bad quantization")])
def test_lowbit_quant_validated(spec, msg):
    with pytest.raises(MoesimError, match=msg):
        SimConfig(miss=spec, slots=2)


def test_refused_combinations():
    with pytest.raises(MoesimError, match="--step-pin with --prefetch"):
        SimConfig(slots=2, step_pin=True, prefetch="oracle")
    sel = np.array([[[0, 1]]], np.int16)
    routing = make_routing(sel, np.full((1, 1, 2), 0.5, np.float32), sel.copy(), np.zeros(1, np.int32), 4)
    cost = fake_cost(1, 4, np.random.default_rng(0), 4)
    with pytest.raises(MoesimError, match="overlapped clock"):
        simulate(routing, SimConfig(slots=2, miss="lowbit:q2_k", overlap="layer"), cost=cost)


def test_lowbit_needs_a_smaller_quant():
    from moesim.costmodel.timing import cost_params

    cost = cost_params("qwen3-30b-a3b", "q4_k_m", "rtx3090-pcie4")
    with pytest.raises(MoesimError, match="not smaller"):
        cost.lowbit_seconds("q8_0")
    fetch, run = cost.lowbit_seconds("q2_k")
    assert 0 < fetch < cost.s_fetch_ram and 0 < run < cost.s_expert_vram


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_max_uploads_validated(value):
    with pytest.raises(MoesimError, match="max_uploads"):
        SimConfig(slots=2, max_uploads=value)


def test_new_options_keep_old_keys():
    """Results stored before these options existed keep their keys (defaults are left out of the key)."""
    assert "step_pin" not in SimConfig(slots=2).to_dict()
    assert SimConfig(slots=2).key() != SimConfig(slots=2, step_pin=True).key()
