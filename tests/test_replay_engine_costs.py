"""Engine costs of a dynamic cache in the replay's clock (issue 29).

Per-copy latencies, per-fetch fixed costs and the per-step cost fold into the seconds the kernel already charges
(CostParams.s_fetch_*, s_copy_*, s_writeback, s_dense): the kernel must match the reference second for second with
those seconds computed here from first principles. The router read-back, hybrid misses and CPU/GPU overlap are
per-step logic: their semantics are pinned down on the reference, and the kernels must match it
(docs/replay-semantics.md, "Engine costs of a dynamic cache")."""

import dataclasses

import numpy as np
import pytest
from reference_replay import COUNTERS, random_routing_arrays, reference_replay
from replay_helpers import make_routing, seeded_rng

from moesim.costmodel.hardware import load_hardware
from moesim.costmodel.models import load_model
from moesim.costmodel.timing import KERNEL_V2_COSTS, cost_params
from moesim.simulator import SimConfig, simulate

MODEL, QUANT, HW = "qwen3-30b-a3b", "q4_k_m", "rtx3090-pcie4"


def engine_file(tmp_path, **keys):
    lines = ['name = "test-engine"']
    for k, v in keys.items():
        lines.append(f"{k} = " + (f'"{v}"' if isinstance(v, str) else str(v).lower() if isinstance(v, bool)
                                  else repr(v)))
    path = tmp_path / "engine.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def first_principles(fixed_us, copies, writeback):
    """Seconds per fetch, background copy and write-back of one expert, from the machine and model files."""
    h, m = load_hardware(HW), load_model(MODEL)
    bpe = float(m.bytes_per_expert(QUANT))
    link = h.link.pinned_bandwidth
    lat = copies * h.link.latency
    fetch_ram = lat + h.ram.latency + fixed_us * 1e-6 + bpe / link
    fetch_nvme = h.nvme.latency + lat + fixed_us * 1e-6 + bpe / min(h.nvme.bandwidth, link)
    return {"fetch_ram": fetch_ram, "fetch_nvme": fetch_nvme, "copy_ram": fetch_ram, "copy_nvme": fetch_nvme,
            "writeback": (lat + bpe / link) if writeback else 0.0}


def test_per_copy_and_per_fetch_costs_fold_into_the_fetch_seconds(tmp_path):
    base = cost_params(MODEL, QUANT, HW, engine=engine_file(tmp_path, miss="fetch", copy="pinned"))
    p = cost_params(MODEL, QUANT, HW, engine=engine_file(tmp_path, miss="fetch", copy="pinned", fetch_expert_us=40.0,
                                                         expert_copies="matrix", token_us=300.0, writeback=True))
    want = first_principles(40.0, 3, True)
    assert p.copies_per_expert == 3 and p.s_fetch_fixed == pytest.approx(40e-6)
    for key, field in (("fetch_ram", "s_fetch_ram"), ("fetch_nvme", "s_fetch_nvme"), ("copy_ram", "s_copy_link"),
                       ("copy_nvme", "s_copy_nvme"), ("writeback", "s_writeback")):
        assert getattr(p, field) == pytest.approx(want[key], rel=1e-12), field
    assert p.s_dense == pytest.approx(base.s_dense + 300e-6, rel=1e-12)
    assert p.s_token == pytest.approx(300e-6)
    # a copy per matrix costs two more link latencies than one per expert, nothing else
    assert p.s_fetch_ram - base.s_fetch_ram == pytest.approx(2 * load_hardware(HW).link.latency + 40e-6)


@pytest.mark.parametrize("eviction,miss", [("lru", "fetch-all"), ("freq", "threshold:0.3"), ("lfu", "substitute")])
def test_kernel_clock_charges_the_folded_engine_costs(tmp_path, eviction, miss):
    """The kernel's seconds with a per-matrix, per-fetch and per-step costing engine = the reference's, second for
    second, with the seconds per operation computed from first principles (not read back from CostParams)."""
    with seeded_rng("engine-costs", eviction, miss) as rng:
        T, L, E, k, M, ram_slots = 60, 2, 12, 3, 8, 6
        sel, w, cand, seq = random_routing_arrays(rng, T, L, E, k, M, 1)
        routing = make_routing(sel, w, cand, seq, E)
        p = cost_params(MODEL, QUANT, HW, engine=engine_file(tmp_path, miss="fetch", copy="pinned",
                                                             fetch_expert_us=25.0, expert_copies="matrix",
                                                             token_us=500.0, writeback=True))
        p = dataclasses.replace(p, ram_expert_capacity=ram_slots)
        admit = None if miss == "fetch-all" else 0.4
        config = SimConfig(eviction=eviction, miss=miss, slots=3, admit=admit)
        res = simulate(routing, config, cost=p)
        counts = {}
        for t in range(T):
            for l in range(L):
                for e in sel[t, l]:
                    counts[(l, int(e))] = counts.get((l, int(e)), 0) + 1
        popular = sorted(((l, e) for l in range(L) for e in range(E)), key=lambda o: (-counts.get(o, 0), o))
        base = cost_params(MODEL, QUANT, HW, engine=engine_file(tmp_path, miss="fetch", copy="pinned",
                                                                writeback=True))
        cost = first_principles(25.0, 3, True) | {
            "dense_layer": (base.s_dense + 500e-6) / L, "vram": p.s_expert_vram, "cpu_ram": p.s_expert_cpu,
            "cpu_nvme": p.s_expert_cpu_nvme}
        ref_layers, ref_tokens = reference_replay(
            sel, w, cand, seq, E, eviction=eviction, miss=miss.partition(":")[0],
            theta=float(miss.partition(":")[2] or 0), slots=3, admit=admit, ram_cap=ram_slots,
            ram_warm=list(reversed(popular[:ram_slots])), cost=cost)
        for i, name in enumerate(COUNTERS):
            assert res.counts[:, i].tolist() == [ref_layers[l][name] for l in range(L)], name
        np.testing.assert_allclose(res.token_seconds, [x["seconds"] for x in ref_tokens], rtol=1e-9)


# ---- the reference's semantics of the kernel-v2 terms ------------------------------------------------------------

def _routing(seed, T=40, L=3, E=8, k=2, M=6):
    rng = np.random.default_rng(seed)
    return random_routing_arrays(rng, T, L, E, k, M, 1)


def test_router_sync_once_per_step_of_a_layer_not_wholly_resident():
    sel, w, cand, seq = _routing(1)
    T, L, _ = sel.shape
    # static-layers with 8 slots of 8 experts: every layer wholly resident, nothing to read back
    _, tok = reference_replay(sel, w, cand, seq, 8, eviction="static-layers", miss="cpu", slots=8,
                              cost={"router_sync": 1.0})
    assert sum(x["seconds"] for x in tok) == 0.0
    # 3 of 8 slots per layer of an 8-expert layer: no layer is ever wholly resident, every step pays once
    _, tok = reference_replay(sel, w, cand, seq, 8, eviction="lru", miss="fetch-all", slots=3,
                              cost={"router_sync": 1.0})
    assert [x["seconds"] for x in tok] == [float(L)] * T
    # static-layers pinning one of three layers whole (8 of 24 slots): two layers pay per token
    _, tok = reference_replay(sel, w, cand, seq, 8, eviction="static-layers", miss="cpu", slots=8 // 3 + 1,
                              cost={"router_sync": 1.0})
    assert [x["seconds"] for x in tok] == [2.0] * T


def test_router_sync_delays_the_steps_copies():
    """Under overlap the copies are issued at the router decision, which comes after the read-back."""
    sel, w, cand, seq = _routing(2)
    cost = {"dense_layer": 0.1, "vram": 0.01, "fetch_ram": 0.2}
    _, plain = reference_replay(sel, w, cand, seq, 8, eviction="lru", miss="fetch-all", slots=3, cost=cost,
                                overlap="layer")
    _, synced = reference_replay(sel, w, cand, seq, 8, eviction="lru", miss="fetch-all", slots=3,
                                 cost=cost | {"router_sync": 0.05}, overlap="layer")
    L = sel.shape[1]
    np.testing.assert_allclose([x["seconds"] for x in synced], [x["seconds"] + 0.05 * L for x in plain])


def test_hybrid_miss_runs_on_the_cpu_and_uploads_in_the_background():
    sel, w, cand, seq = _routing(3, T=80)
    cost = {"dense_layer": 1.0, "vram": 0.1, "cpu_ram": 0.5, "copy_ram": 0.3}
    cpu_layers, cpu_tok = reference_replay(sel, w, cand, seq, 8, eviction="lru", miss="cpu", slots=3, cost=cost)
    layers, tok = reference_replay(sel, w, cand, seq, 8, eviction="lru", miss="hybrid", slots=3, cost=cost)
    L = sel.shape[1]
    tot = {n: sum(layers[l][n] for l in range(L)) for n in COUNTERS}
    assert tot["cpu"] == tot["misses"] > 0 and tot["fetches"] == 0
    assert 0 < tot["admissions"] <= tot["copies"] <= tot["misses"]
    # a plain cpu miss never admits: the cache stays empty; the uploads make later requests hit
    assert sum(cpu_layers[l]["hits"] for l in range(L)) == 0 < tot["hits"]
    # the uploads are background copies: each step costs its dense share, its experts and nothing for the link
    for x in tok:
        assert x["seconds"] == pytest.approx(L * 1.0 + 0.1 * x["hits"] + 0.5 * x["cpu"])
    assert sum(x["seconds"] for x in tok) < sum(x["seconds"] for x in cpu_tok)


def test_hybrid_uploads_are_capped_per_step():
    sel, w, cand, seq = _routing(4, T=60, k=3)
    cost = {"dense_layer": 1.0, "vram": 0.1, "cpu_ram": 0.5, "copy_ram": 0.01}
    layers, tok = reference_replay(sel, w, cand, seq, 8, eviction="lru", miss="hybrid", slots=4, cost=cost,
                                   max_uploads=1)
    L = sel.shape[1]
    assert all(x["copies"] <= L for x in tok)  # one upload per layer per step at most
    assert sum(layers[l]["capped"] for l in range(L)) > 0


def test_cpu_overlap_ends_the_experts_at_the_later_side():
    sel, w, cand, seq = _routing(5, T=50)
    cost = {"dense_layer": 1.0, "vram": 0.1, "cpu_ram": 0.5, "cpu_handoff": 0.05}
    for miss in ("cpu", "hybrid"):
        layers, tok = reference_replay(sel, w, cand, seq, 8, eviction="lru", miss=miss, slots=3, cost=cost,
                                       cpu_overlap=True, decisions=(dec := {}))
        T, L, k = sel.shape
        for t in range(T):
            want = 0.0
            for l in range(L):
                outs = [dec[(t, l, r)][0] for r in range(k)]
                gpu, cpu = 0.1 * outs.count("hit"), 0.5 * outs.count("cpu")
                want += 1.0 + max(gpu, cpu) + (0.05 if cpu else 0.0)
            assert tok[t]["seconds"] == pytest.approx(want)


def test_kernel_v2_names_what_the_kernel_lacks(tmp_path):
    p = cost_params(MODEL, QUANT, HW, engine=engine_file(tmp_path, miss="hybrid", router_sync_us=30.0,
                                                         uploads_per_layer=2, cpu_overlap=True))
    assert KERNEL_V2_COSTS == ("router_sync",)
    assert p.kernel_v2() == {"router_sync": pytest.approx(30e-6), "cpu_overlap": True, "uploads_per_layer": 2,
                             "hybrid": True}


# ---- the kernel's side ---------------------------------------------------------------------------------------------

def _kernel_vs_reference(tmp_path, miss, engine, cpu_overlap=False, max_uploads=None):
    sel, w, cand, seq = _routing(6, T=60)
    routing = make_routing(sel, w, cand, seq, 8)
    p = cost_params(MODEL, QUANT, HW, engine=engine_file(tmp_path, **engine))
    res = simulate(routing, SimConfig(eviction="lru", miss=miss, slots=3, max_uploads=max_uploads), cost=p)
    L = sel.shape[1]
    cost = {"dense_layer": p.s_dense / L, "vram": p.s_expert_vram, "fetch_ram": p.s_fetch_ram,
            "fetch_nvme": p.s_fetch_nvme, "cpu_ram": p.s_expert_cpu, "cpu_nvme": p.s_expert_cpu_nvme,
            "copy_ram": p.s_copy_link, "copy_nvme": p.s_copy_nvme, "cpu_handoff": p.s_cpu_handoff,
            "writeback": p.s_writeback, "router_sync": p.s_router_sync}
    layers, tok = reference_replay(sel, w, cand, seq, 8, eviction="lru", miss=miss, slots=3, cost=cost,
                                   cpu_overlap=cpu_overlap, max_uploads=max_uploads)
    for i, name in enumerate(COUNTERS):
        assert res.counts[:, i].tolist() == [layers[l][name] for l in range(L)], name
    np.testing.assert_allclose(res.token_seconds, [x["seconds"] for x in tok], rtol=1e-9)


def test_kernel_router_sync(tmp_path):
    """Needs: kernel.COST_NAMES += "router_sync"; args.kernel_costs sets it from CostParams.s_router_sync; the
    kernel charges it per step of a layer not wholly resident, before the step's router decision."""
    _kernel_vs_reference(tmp_path, "fetch-all", {"miss": "fetch", "router_sync_us": 40.0})


def test_kernel_hybrid_miss(tmp_path):
    """Needs: a miss policy "hybrid" (policies/miss.py code, kernel branch: CPU compute + a background copy admitted
    on landing), SimConfig accepting it, and --max-uploads defaulting to CostParams.uploads_per_layer."""
    _kernel_vs_reference(tmp_path, "hybrid", {"miss": "hybrid", "uploads_per_layer": 2}, max_uploads=2)


def test_kernel_cpu_overlap(tmp_path):
    """Needs: Policy.cpu_overlap from CostParams.cpu_overlap; the kernel keeps the host's timeline per step."""
    _kernel_vs_reference(tmp_path, "cpu", {"miss": "cpu", "cpu_overlap": True, "cpu_handoff": True},
                         cpu_overlap=True)
