"""Prefetch and the overlapped clock: the kernel against the reference (count for count, second for
second) on random seeded traces, per-layer and global pools, warm start, warm-up, reset per sequence,
background admission, a host-RAM tier, write-back and CPU hand-off; and the rules the options refuse."""

import itertools

import numpy as np
import pytest
from reference_replay import COUNTERS, random_routing_arrays, reference_replay
from replay_helpers import make_routing, seeded_rng
from test_replay_stream import write_trace
from test_replay_timed import fake_cost

from moesim.errors import MoesimError
from moesim.simulator import SimConfig, simulate

PREFETCHES = ["none", "prev-token", "next-layer", "lookahead", "oracle"]
OVERLAPS = ["none", "layer", "cross-layer"]
# (eviction, miss, admit): rotated over the (prefetch, overlap) pairs so every pair sees several
POLICIES = [("lru", "fetch-all", None), ("lfu", "first-choice", 0.4), ("belady", "threshold:0.3", 0.5),
            ("fifo", "substitute", 0.3), ("s3fifo", "cpu", None), ("static", "fetch-all", None),
            ("arc", "first-choice", 0.6), ("freq", "fetch-all", None)]


def cost_dict(cost, L):
    return {"dense_layer": cost.s_dense / L, "vram": cost.s_expert_vram, "fetch_ram": cost.s_fetch_ram,
            "fetch_nvme": cost.s_fetch_nvme, "cpu_ram": cost.s_expert_cpu, "cpu_nvme": cost.s_expert_cpu_nvme,
            "copy_ram": cost.s_copy_link, "copy_nvme": cost.s_copy_nvme, "cpu_handoff": cost.s_cpu_handoff,
            "writeback": cost.s_writeback}


def random_lookahead(rng, sel, E):
    """A lookahead column: next layer's true experts with some replaced at random (-1 at the last layer)."""
    T, L, k = sel.shape
    look = np.full_like(sel, -1)
    look[:, :-1] = sel[:, 1:]
    noise = rng.integers(-1, E, size=look.shape).astype(np.int16)
    swap = rng.random(look.shape) < 0.3
    look[swap] = noise[swap]
    look[:, -1] = -1
    for t in range(T):  # distinct ids per row, as a router's top-k
        for l in range(L - 1):
            seen = set()
            for r in range(k):
                if look[t, l, r] in seen:
                    look[t, l, r] = -1
                seen.add(int(look[t, l, r]))
    return look


def popular_ram(sel, L, E, ram_cap):
    counts: dict = {}
    for t in range(sel.shape[0]):
        for l in range(L):
            for e in sel[t, l]:
                counts[(l, int(e))] = counts.get((l, int(e)), 0) + 1
    popular = sorted(((l, e) for l in range(L) for e in range(E)), key=lambda o: (-counts.get(o, 0), o))
    return list(reversed(popular[:ram_cap or 0]))


@pytest.mark.parametrize("prefetch,overlap", list(itertools.product(PREFETCHES, OVERLAPS)))
def test_kernel_matches_reference(prefetch, overlap):
    with seeded_rng("prefetch", prefetch, overlap) as rng:
        _kernel_matches_reference(rng, prefetch, overlap)


def _kernel_matches_reference(rng, prefetch, overlap):
    shapes = [(50, 3, 10, 3, 7, 2, 3, 12, "per-layer", True, 0, 2),
              (40, 4, 8, 2, 6, 1, 2, 40, "global", False, 5, 1),
              (45, 3, 12, 3, 8, 3, 4, 0, "per-layer", True, 3, 1),
              (30, 2, 6, 2, 6, 1, 2, 5, "global", True, 0, 1)]
    for i, (T, L, E, k, M, n_seq, slots, ram_slots, alloc, engine, warmup, depth) in enumerate(shapes):
        ev, miss, admit = POLICIES[(PREFETCHES.index(prefetch) * 3 + OVERLAPS.index(overlap) + i) % len(POLICIES)]
        if prefetch == "lookahead":
            depth = 1
        sel, w, cand, seq = random_routing_arrays(rng, T, L, E, k, M, n_seq)
        routing = make_routing(sel, w, cand, seq, E)
        look = random_lookahead(rng, sel, E)
        routing.lookahead = look
        cost = fake_cost(L, E, rng, ram_slots, engine)
        ram_cap = ram_slots if ram_slots < L * E else None
        for priced in (False, True):
            config = SimConfig(eviction=ev, miss=miss, slots=slots, admit=admit, allocation=alloc, warm=i == 2,
                               reset_per_sequence=n_seq > 1, warmup_tokens=warmup, prefetch=prefetch,
                               prefetch_depth=depth, overlap=overlap)
            res = simulate(routing, config, cost=cost if priced else None)
            ref_layers, ref_tokens = reference_replay(
                sel, w, cand, seq, E, eviction=ev, miss=miss.partition(":")[0],
                theta=float(miss.partition(":")[2] or 0), slots=slots, admit=admit, allocation=alloc,
                reset_per_sequence=n_seq > 1, warmup_tokens=warmup, warm=i == 2,
                ram_cap=ram_cap if priced else None,
                ram_warm=popular_ram(sel, L, E, ram_cap) if priced else (),
                cost=cost_dict(cost, L) if priced else None, overlap=overlap, prefetch=prefetch,
                prefetch_depth=depth, lookahead=look)
            label = f"{config.label()} priced={priced} shape={i}"
            for c, name in enumerate(COUNTERS):
                assert res.counts[:, c].tolist() == [ref_layers[l][name] for l in range(L)], f"{label} {name}"
                assert res.token_counts[:, c].tolist() == [x[name] for x in ref_tokens], f"{label} {name} per token"
            if priced:
                np.testing.assert_allclose(res.token_seconds, [x["seconds"] for x in ref_tokens], rtol=1e-9,
                                           err_msg=label)
                np.testing.assert_allclose(res.token_stall, [x["stall"] for x in ref_tokens], rtol=1e-9, atol=1e-12,
                                           err_msg=label)
            if prefetch != "none" and ev != "static" and i != 2:  # a warm cache may hold every prediction
                assert res.counts[:, COUNTERS.index("prefetches")].sum() > 0 or prefetch == "prev-token", label


def test_prefetch_train_matches_reference(tmp_path):
    """--prefetch-train: the next-layer table learned from another trace file of the same geometry; a
    trace of another geometry is refused."""
    from moesim.traces import load_routing

    with seeded_rng("prefetch-train") as rng:
        T, L, E, k, M = 40, 3, 10, 3, 6
        sel, w, cand, seq = random_routing_arrays(rng, T, L, E, k, M, 1)
        routing = make_routing(sel, w, cand, seq, E)
        path = write_trace(tmp_path / "train.parquet", make_routing(*random_routing_arrays(rng, 60, L, E, k, M, 2), E),
                           64)
        tsel = load_routing(path).sel
        cost = fake_cost(L, E, rng, L * E, False)
        for depth in (1, 2):
            config = SimConfig(eviction="lru", miss="fetch-all", slots=3, prefetch="next-layer", prefetch_depth=depth,
                               prefetch_train=str(path), overlap="cross-layer")
            res = simulate(routing, config, cost=cost)
            ref_layers, ref_tokens = reference_replay(sel, w, cand, seq, E, eviction="lru", miss="fetch-all", slots=3,
                                                      cost=cost_dict(cost, L), overlap="cross-layer",
                                                      prefetch="next-layer", prefetch_depth=depth, prefetch_train=tsel)
            for c, name in enumerate(COUNTERS):
                assert res.counts[:, c].tolist() == [ref_layers[l][name] for l in range(L)], f"depth {depth} {name}"
            np.testing.assert_allclose(res.token_seconds, [x["seconds"] for x in ref_tokens], rtol=1e-9)
            assert res.totals()["prefetches"] > 0
        other = make_routing(*random_routing_arrays(rng, 5, 2, E, k, M, 1), E)
        with pytest.raises(MoesimError, match="prefetch-train"):
            simulate(other, SimConfig(eviction="lru", slots=2, prefetch="next-layer", prefetch_train=str(path)))


def test_refusals():
    with seeded_rng("prefetch-refusals") as rng:
        routing = make_routing(*random_routing_arrays(rng, 5, 2, 8, 2, 4, 1), 8)
    with pytest.raises(MoesimError, match="lookahead column"):
        simulate(routing, SimConfig(slots=2, prefetch="lookahead"))
    routing.lookahead = np.full_like(routing.sel, -1)
    with pytest.raises(MoesimError, match="depth 1"):
        simulate(routing, SimConfig(slots=2, prefetch="lookahead", prefetch_depth=2))
    for bad in ({"prefetch": "bogus"}, {"overlap": "full"}, {"prefetch_depth": 0},
                {"prefetch": "oracle", "prefetch_train": "x.parquet"}):
        with pytest.raises(MoesimError):
            SimConfig(slots=2, **bad)


def test_default_keys_unchanged():
    """Configs without prefetch or overlap keep the keys results were stored under."""
    c = SimConfig(eviction="lru", miss="fetch-all", budget=0.25)
    assert "prefetch" not in c.to_dict() and "overlap" not in c.to_dict()
    assert SimConfig(eviction="lru", budget=0.25, prefetch="oracle").key() != c.key()


def test_pinned_evictions_do_not_prefetch():
    with seeded_rng("prefetch-pinned") as rng:
        routing = make_routing(*random_routing_arrays(rng, 20, 3, 8, 2, 4, 1), 8)
    for ev in ("static", "static-layers"):
        res = simulate(routing, SimConfig(eviction=ev, slots=3, prefetch="oracle"))
        plain = simulate(routing, SimConfig(eviction=ev, slots=3))
        assert res.totals()["prefetches"] == 0
        np.testing.assert_array_equal(res.counts, plain.counts)


# ------------------------------------------------------------------------------------- hand-built clocks


def hand_cost(L, dense_layer=1.0, vram=0.5, copy=2.0, writeback=0.0):
    """Round seconds per operation: every expert fits host RAM, fetches and copies take ``copy``."""
    import dataclasses

    from moesim.costmodel.timing import cost_params

    base = cost_params("qwen3-30b-a3b", "q4_k_m", "rtx3090-pcie4")
    return dataclasses.replace(base, s_dense=dense_layer * L, s_dense_per_seq=0.0, s_expert_vram=vram,
                               s_fetch_ram=copy, s_fetch_nvme=copy, s_copy_link=copy, s_copy_nvme=copy,
                               s_expert_cpu=3.0, s_expert_cpu_nvme=3.0, ram_expert_capacity=10**6, unified=False,
                               s_cpu_handoff=0.0, s_writeback=writeback)


def hand_routing(rows, E):
    """Tokens of one sequence; rows[t][l] = the selected experts of (t, l) in rank order."""
    sel = np.array(rows, np.int16)
    T, L, k = sel.shape
    w = np.full((T, L, k), 1.0 / k, np.float32)
    cand = np.tile(np.arange(E, dtype=np.int16), (T, L, 1))
    return make_routing(sel, w, cand, np.zeros(T, np.int32), E)


def test_overlap_within_a_layer_by_hand():
    """One layer, three cold misses then two hits and a miss. dense 1 s, expert 0.5 s, copy 2 s.
    none: token 0 = 1 + 3 x (2 + 0.5) = 8.5 s; token 1: dense to 9.5, hit 10, copy 10-12, run to 12.5,
    hit 13 -> 4.5 s. layer: copies issued at 1 land at 3, 5, 7, each run as it lands: 7.5 s; token 1: router
    at 8.5, hits run to 9.5, the copy lands at 10.5 and runs to 11 -> 3.5 s."""
    routing = hand_routing([[[0, 1, 2]], [[0, 3, 1]]], 8)
    cost = hand_cost(1)
    want = {"none": [8.5, 4.5], "layer": [7.5, 3.5], "cross-layer": [7.5, 3.5]}
    for mode, seconds in want.items():
        res = simulate(routing, SimConfig(eviction="lru", slots=4, overlap=mode), cost=cost)
        np.testing.assert_allclose(res.token_seconds, seconds, rtol=1e-12, err_msg=mode)
        np.testing.assert_allclose(res.token_stall, [0.0, 0.0], atol=1e-12, err_msg=mode)


def test_prefetch_clock_by_hand():
    """Two layers, top-1: token 0 selects expert 0 at layer 0 and expert 1 at layer 1; oracle prefetch of
    the next layer. dense 1 s per layer, expert 0.5 s, copy 2 s.

    - no prefetch, none: layer 0 copies 1-3, runs to 3.5; layer 1 at 4.5 copies to 6.5, runs to 7: 7 s.
    - oracle, none: layer 0 as before, the prefetch of expert 1 is issued at 1 behind the fetch: 3-5.
      Layer 1 asks at 4.5: late by 0.5 (stall), runs 5-5.5: 5.5 s, stall 0.5.
    - oracle, cross-layer: the same link; layer 0 ends at 3.5, layer 1's router at 4.5 waits for the landing
      at 5: 5.5 s, stall 0.5, the prefetch late.
    - oracle, layer: the link is synchronized at the end of layer 0 (5, stall 1.5); layer 1 at 6 finds
      expert 1 landed: a hit, on time, ends at 6.5: 6.5 s."""
    routing = hand_routing([[[0], [1]]], 4)
    cost = hand_cost(2)
    plain = simulate(routing, SimConfig(eviction="lru", slots=2), cost=cost)
    assert plain.token_seconds.tolist() == [7.0]
    want = {"none": (5.5, 0.5, 1), "cross-layer": (5.5, 0.5, 1), "layer": (6.5, 1.5, 0)}
    for mode, (seconds, stall, late) in want.items():
        res = simulate(routing, SimConfig(eviction="lru", slots=2, prefetch="oracle", overlap=mode), cost=cost)
        t = res.totals()
        assert (t["prefetches"], t["prefetch_used"], t["prefetch_late"]) == (1, 1, late), mode
        assert (t["hits"], t["fetches"], t["misses"]) == (1, 1, 1), mode
        np.testing.assert_allclose(res.token_seconds, [seconds], rtol=1e-12, err_msg=mode)
        np.testing.assert_allclose(res.token_stall, [stall], rtol=1e-12, err_msg=mode)


def test_prefetch_delays_a_fetch_by_hand():
    """A prefetch occupies the link: token 0's lookahead names expert 1 for layer 1, which asks for 2.
    Layer 0: dense to 1, copy 1-3, run to 3.5, prefetch of 1 on the link 3-5. Layer 1: router at 4.5, the
    fetch of 2 waits for the link until 5 (stall 0.5), copies 5-7, runs to 7.5: 7.5 s (7 s without the
    prefetch). Token 1 (no lookahead): layer 0 hits (8.5 -> 9); at layer 1 (10) the prefetched expert 1 has
    landed: a hit, used on time, 10.5: 3 s."""
    routing = hand_routing([[[0], [2]], [[0], [1]]], 4)
    routing.lookahead = np.array([[[1], [-1]], [[-1], [-1]]], np.int16)
    cost = hand_cost(2)
    res = simulate(routing, SimConfig(eviction="lru", slots=2, prefetch="lookahead"), cost=cost)
    np.testing.assert_allclose(res.token_seconds, [7.5, 3.0], rtol=1e-12)
    np.testing.assert_allclose(res.token_stall, [0.5, 0.0], rtol=1e-12)
    t = res.totals()
    assert (t["prefetches"], t["prefetch_used"], t["prefetch_late"], t["hits"], t["fetches"]) == (1, 1, 0, 2, 2)
    plain = simulate(routing, SimConfig(eviction="lru", slots=2), cost=cost)
    assert plain.token_seconds.tolist()[0] == 7.0


# ------------------------------------------------------------------------------------------------- the CLI


def test_simulate_cli_prefetch_and_overlap(tmp_path):
    """simulate prints precision/recall/timeliness, its JSON totals carry the prefetch counters and bytes;
    lookahead on a trace without the column is one line, exit 2; the engine profile sets the overlap."""
    import json
    import subprocess

    from sweep_helpers import MOESIM, run_cli, small_trace

    trace = small_trace(tmp_path)
    res = run_cli("simulate", trace, "-e", "lru", "-b", "0.25", "--prefetch", "oracle", "--overlap", "cross-layer")
    assert "prefetch " in res.stdout and "precision" in res.stdout and "timeliness" in res.stdout
    doc = json.loads(run_cli("simulate", trace, "-e", "lru", "-b", "0.25", "--prefetch", "next-layer",
                             "--format", "json").stdout)
    t = doc["totals"]
    assert t["prefetches"] > 0 and t["prefetch_bytes"] == t["prefetches"] * doc["timing"]["bytes_per_expert"]
    assert 0 <= t["prefetch_used"] <= t["prefetches"] and t["prefetch_late"] <= t["prefetch_used"]
    assert doc["config"]["prefetch"] == "next-layer" and doc["timing"]["overlap"] == "none"
    doc = json.loads(run_cli("simulate", trace, "-e", "lru", "-b", "0.25", "--engine", "mixtral-offloading",
                             "--format", "json").stdout)
    assert doc["timing"]["overlap"] == "layer"
    bad = subprocess.run([*MOESIM, "simulate", str(trace), "-b", "0.25", "--prefetch", "lookahead"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert bad.stderr.startswith("moesim: error: --prefetch lookahead needs a trace with the lookahead column")


def test_overlap_engine_default_and_override():
    """--overlap given beats the engine profile's; without a cost model there is no clock to overlap."""
    import dataclasses

    with seeded_rng("overlap-engine") as rng:
        routing = make_routing(*random_routing_arrays(rng, 30, 2, 8, 2, 4, 1), 8)
    cost = dataclasses.replace(hand_cost(2), overlap="layer")
    by_engine = simulate(routing, SimConfig(slots=2), cost=cost)
    assert by_engine.token_seconds.tolist() == simulate(routing, SimConfig(slots=2, overlap="layer"),
                                                         cost=hand_cost(2)).token_seconds.tolist()
    assert simulate(routing, SimConfig(slots=2, overlap="none"), cost=cost).token_seconds.tolist() == \
        simulate(routing, SimConfig(slots=2), cost=hand_cost(2)).token_seconds.tolist()
    assert by_engine.timing["overlap"] == "layer"


def test_sweep_prefetch_variants_and_lower_bound(tmp_path):
    """The default grid holds the three prefetch variants; belady + oracle is named as the lower bound
    (table note and JSON header); --prefetch makes an axis; the API passes the options through."""
    import json

    from sweep_helpers import run_cli, small_trace

    import moesim

    trace = small_trace(tmp_path)
    doc = json.loads(run_cli("sweep", trace, "-b", "0.25", "--format", "json", "--jobs", "1").stdout)
    rows = {r["policy"]: r for r in doc["rows"]}
    variants = {"lru / fetch-all / pf oracle", "lru / fetch-all / pf next-layer", "belady / fetch-all / pf oracle"}
    assert variants <= set(rows)
    bound = rows["belady / fetch-all / pf oracle"]
    assert doc["lower_bound"][0]["ms_per_token"] == bound["ms_per_token"]
    assert bound["prefetch_precision"] == 1.0 and bound["prefetches"] > 0
    assert rows["lru / fetch-all"]["preset"] == "fetch-all" and rows["lru / fetch-all / pf oracle"]["preset"] == ""
    text = run_cli("sweep", trace, "-b", "0.25", "--jobs", "1").stdout
    assert "Lower bound on time per token" in text
    axis = json.loads(run_cli("sweep", trace, "-b", "0.25", "-e", "lru", "-m", "fetch-all", "--prefetch",
                              "none,prev-token", "--overlap", "cross-layer", "--format", "json").stdout)["rows"]
    assert {r["policy"] for r in axis if r["eviction"] == "lru" and r["miss"] == "fetch-all"} == \
        {"lru / fetch-all", "lru / fetch-all / pf prev-token"}
    assert {r["overlap"] for r in axis} == {"cross-layer"}
    row = moesim.simulate(trace, eviction="lru", budget=0.25, prefetch="oracle", overlap="layer")
    assert row["prefetch"][0] == "oracle" and row["overlap"][0] == "layer" and row["speedup"][0] > 0


def test_batched_prefetch_runs_on_the_union():
    """--batch: prediction reads the lock-step union's rows (oracle: the union's experts of the target)."""
    with seeded_rng("prefetch-batch") as rng:
        routing = make_routing(*random_routing_arrays(rng, 40, 3, 10, 2, 5, 4), 10)
    t = simulate(routing, SimConfig(slots=4, batch=2, prefetch="oracle")).totals()
    assert t["prefetch_used"] > 0 and t["prefetches"] >= t["prefetch_used"] and t["misses"] == t["fetches"]


def test_emulator_refuses_prefetch():
    from moesim.emulator.policy import check_config

    with pytest.raises(MoesimError, match="prefetch"):
        check_config(SimConfig(slots=2, prefetch="oracle"))
