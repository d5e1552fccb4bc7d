"""--admission second-touch[:W]: the kernels against the reference (tests/reference_replay.py) with and without the
clock, under every miss policy that fetches, --step-pin and --max-uploads; against libCacheSim 0.3.5's Bloom-filter
admissioner where the two rules coincide (no window, fetch-all, a cold start: an expert is admitted on a miss iff
it was requested before, which for a cold cache is iff it missed before); bad windows refused with one line."""

import dataclasses

import numpy as np
import pytest
from click.testing import CliRunner
from reference_replay import COUNTERS, random_routing_arrays, reference_replay
from replay_helpers import fast_random_routing, libcachesim_misses, make_routing, oracle_trace, seeded_rng
from test_replay_timed import fake_cost

from moesim.cli import cli
from moesim.policies import registry
from moesim.simulator import SimConfig, simulate

EVICTIONS = ["lru", "fifo", "lfu", "freq", "belady", "arc", "s3fifo", "lirs", "slru", "mq", "lfuda", "lcp", "static"]
WINDOWS = [("second-touch", np.inf), ("second-touch:3", 3), ("second-touch:12", 12)]


def _window(spec):
    """The reference's window: 'second-touch' -> inf, 'second-touch:W' -> W."""
    _, _, w = spec.partition(":")
    return float(w) if w else np.inf


def _cost_dict(cost, L):
    return {"dense_layer": cost.s_dense / L, "vram": cost.s_expert_vram, "fetch_ram": cost.s_fetch_ram,
            "fetch_nvme": cost.s_fetch_nvme, "cpu_ram": cost.s_expert_cpu, "cpu_nvme": cost.s_expert_cpu_nvme,
            "copy_ram": cost.s_copy_link, "copy_nvme": cost.s_copy_nvme, "cpu_handoff": cost.s_cpu_handoff,
            "writeback": cost.s_writeback}


def _check(routing, config, ref, cost=None):
    res = simulate(routing, config, cost=cost)
    L = routing.n_layers
    layers, tokens = ref
    for i, name in enumerate(COUNTERS):
        assert res.counts[:, i].tolist() == [layers[l][name] for l in range(L)], f"{config.label()} {name}"
        assert res.token_counts[:, i].tolist() == [x[name] for x in tokens], f"{config.label()} {name} per token"
    if cost is not None:
        np.testing.assert_allclose(res.token_seconds, [x["seconds"] for x in tokens], rtol=1e-9)
    return res


@pytest.mark.parametrize("eviction", EVICTIONS)
@pytest.mark.parametrize("spec", [s for s, _ in WINDOWS])
def test_kernel_matches_reference(eviction, spec):
    with seeded_rng("admission", eviction, spec) as rng:
        for gi, (T, L, E, k, M, n_seq) in enumerate([(40, 2, 8, 2, 6, 2), (30, 3, 16, 4, 12, 3), (30, 1, 33, 3, 8, 1)]):
            sel, w, cand, seq = random_routing_arrays(rng, T, L, E, k, M, n_seq)
            routing = make_routing(sel, w, cand, seq, E)
            for slots, miss in ((max(1, E // 4), "fetch-all"), (E // 2, "threshold:0.3"), (2, "first-choice")):
                allocation = ["per-layer", "global"][(gi + slots) % 2]
                warm, reset = bool((gi + slots) % 2), n_seq > 1 and slots % 2 == 0
                admit = 0.4 if miss != "fetch-all" else None
                config = SimConfig(eviction=eviction, miss=miss, slots=slots, allocation=allocation, warm=warm,
                                   reset_per_sequence=reset, admit=admit, admission=spec)
                ms, _, theta = miss.partition(":")
                ref = reference_replay(sel, w, cand, seq, E, eviction=eviction, miss=ms, theta=float(theta or 0),
                                       slots=slots, allocation=allocation, warm=warm, reset_per_sequence=reset,
                                       admit=admit, admission=None if eviction == "static" else _window(spec))
                _check(routing, config, ref)


@pytest.mark.parametrize("eviction", ["lru", "lfu", "belady", "mq", "slru"])
def test_kernel_matches_reference_with_the_clock(eviction):
    """Timed, with engine costs (write-back of every eviction, slru's on hits too), a host-RAM tier, --max-uploads
    and (where the eviction defines it) --step-pin."""
    with seeded_rng("admission-timed", eviction) as rng:
        for T, L, E, k, M, slots, ram, alloc, spec in [(50, 2, 12, 3, 8, 3, 5, "per-layer", "second-touch:6"),
                                                       (40, 3, 8, 2, 6, 2, 30, "global", "second-touch"),
                                                       (40, 1, 16, 4, 10, 5, 0, "per-layer", "second-touch:2")]:
            sel, w, cand, seq = random_routing_arrays(rng, T, L, E, k, M, 1)
            routing = make_routing(sel, w, cand, seq, E)
            cost = fake_cost(L, E, rng, ram, engine_costs=True)
            counts: dict = {}
            for t in range(T):
                for l in range(L):
                    for e in sel[t, l]:
                        counts[(l, int(e))] = counts.get((l, int(e)), 0) + 1
            popular = sorted(((l, e) for l in range(L) for e in range(E)), key=lambda o: (-counts.get(o, 0), o))
            ram_cap = ram if ram < L * E else None
            step_pin = eviction in ("lru", "lfu", "belady")
            for max_up, pin in ((None, False), (1, False), (None, step_pin), (2, step_pin)):
                config = SimConfig(eviction=eviction, miss="fetch-all", slots=slots, allocation=alloc, admission=spec,
                                   max_uploads=max_up, step_pin=pin)
                ref = reference_replay(sel, w, cand, seq, E, eviction=eviction, miss="fetch-all", slots=slots,
                                       allocation=alloc, admission=_window(spec), cost=_cost_dict(cost, L),
                                       ram_cap=ram_cap, ram_warm=list(reversed(popular[:ram_cap or 0])),
                                       max_uploads=max_up, step_pin=pin)
                _check(routing, config, ref, cost=dataclasses.replace(cost))


@pytest.mark.parametrize("eviction", ["lru", "lfu", "arc", "slru", "lirs", "mq", "lfuda"])
def test_streamed_equals_in_memory(eviction):
    """The pools' request counts and each expert's last request carry across chunks (per layer, global, clocked,
    reset per sequence, a warm start, --step-pin and --max-uploads)."""
    from test_replay_stream import assert_same

    from moesim.simulator.config import STEP_PIN_REFUSED
    from moesim.traces.stream import DecodedStore

    with seeded_rng("admission-stream", eviction) as rng:
        sel, w, cand, seq = random_routing_arrays(rng, 45, 3, 10, 3, 7, 8)
        routing = make_routing(sel, w, cand, seq, 10)
        cost = fake_cost(3, 10, rng, 12, engine_costs=True)
        pin = eviction not in STEP_PIN_REFUSED
        configs = [SimConfig(eviction=eviction, slots=3, admission="second-touch:7"),
                   SimConfig(eviction=eviction, slots=2, allocation="global", admission="second-touch", warm=True,
                             warmup_tokens=4),
                   SimConfig(eviction=eviction, miss="threshold:0.3", admit=0.4, slots=3, admission="second-touch:4",
                             reset_per_sequence=True),
                   SimConfig(eviction=eviction, slots=3, admission="second-touch:9", step_pin=pin, max_uploads=1)]
        with DecodedStore.from_routing(routing) as store:
            for config in configs:
                for c in (None, cost):
                    want = simulate(routing, config, cost=c)
                    for chunk in (1, 4, 7):
                        got = simulate(store, config, cost=c, chunk_tokens=chunk)
                        assert_same(want, got, f"{config.label()} priced={c is not None} chunk={chunk}")


def test_second_touch_refuses_one_time_experts():
    """An expert requested once is never cached; one requested again within W requests is."""
    sel = np.array([[[0]], [[1]], [[0]], [[2]], [[3]], [[4]], [[2]]], np.int16)  # one layer, top-1
    routing = make_routing(sel, np.ones_like(sel, np.float32), sel.copy(), np.zeros(7, np.int32), 8)
    always = simulate(routing, eviction="lru", slots=4)
    second = simulate(routing, eviction="lru", slots=4, admission="second-touch")
    window = simulate(routing, eviction="lru", slots=4, admission="second-touch:2")
    assert always.totals()["hits"] == 2 and second.totals()["hits"] == 0  # 0 and 2 fetched again, then admitted
    assert second.totals()["evictions"] == 0 and window.totals()["fetches"] == 7


TWINS = [n for n, c in registry.libcachesim_twins().items() if n != "belady"]  # Belady needs next-access times


@pytest.mark.parametrize("policy", TWINS)
def test_unbounded_second_touch_equals_libcachesim_bloom_filter(tmp_path, policy):
    """libCacheSim's BloomFilterAdmissioner (admission/bloomfilter.c) admits an object on a miss when it has missed
    before; from a cold start under fetch-all that is moesim's second-touch without a window. Per layer and with a
    global pool, on random routing."""
    import libcachesim as lcs

    routing = fast_random_routing(np.random.default_rng(7), 300, 2, 32, 4)
    L, E = routing.n_layers, routing.n_experts
    for slots in (2, 5, 8, 16):
        if policy == "lirs" and slots == 2:
            continue  # libCacheSim's stale NH entry at 2 slots (policies/lirs.py)
        res = simulate(routing, eviction=policy, slots=slots, admission="second-touch")
        glob = simulate(routing, eviction=policy, slots=slots, allocation="global", admission="second-touch")
        for l in range(L):
            stream = routing.sel[:, l, :].reshape(-1).astype(np.int64)
            oracle_trace(tmp_path / "s.oracle", stream)
            want = libcachesim_misses(tmp_path / "s.oracle", policy, slots, len(stream),
                                      admissioner=lcs.BloomFilterAdmissioner())
            assert int(res.counts[l, 2]) == want, f"{policy} slots {slots} layer {l}"
        stream = (routing.sel.astype(np.int64) + (np.arange(L) * E)[None, :, None]).reshape(-1)
        oracle_trace(tmp_path / "g.oracle", stream)
        want = libcachesim_misses(tmp_path / "g.oracle", policy, slots * L, len(stream),
                                  admissioner=lcs.BloomFilterAdmissioner())
        assert glob.totals()["misses"] == want, f"{policy} global slots {slots}"


def test_unbounded_second_touch_equals_bloom_filter_on_real_flame(flame_dir, tmp_path):
    import libcachesim as lcs

    from moesim.traces import load_routing
    from moesim.traces.importers.flame import import_flame

    out = tmp_path / "prefill.parquet"
    import_flame(flame_dir, out, layout="prefill")
    routing = load_routing(out)
    L, E = routing.n_layers, routing.n_experts
    for policy in ("lru", "arc", "lirs", "s3fifo"):
        for slots in (8, 32):
            res = simulate(routing, eviction=policy, slots=slots, admission="second-touch")
            for l in (0, L - 1):
                stream = routing.sel[:, l, :].reshape(-1).astype(np.int64)
                oracle_trace(tmp_path / "s.oracle", stream)
                want = libcachesim_misses(tmp_path / "s.oracle", policy, slots, len(stream),
                                          admissioner=lcs.BloomFilterAdmissioner())
                assert int(res.counts[l, 2]) == want, f"{policy} slots {slots} layer {l}"
            glob = simulate(routing, eviction=policy, slots=slots, allocation="global", admission="second-touch")
            stream = (routing.sel.astype(np.int64) + (np.arange(L) * E)[None, :, None]).reshape(-1)
            oracle_trace(tmp_path / "g.oracle", stream)
            want = libcachesim_misses(tmp_path / "g.oracle", policy, slots * L, len(stream),
                                      admissioner=lcs.BloomFilterAdmissioner())
            assert glob.totals()["misses"] == want, f"{policy} global slots {slots}"


def test_a_window_is_where_the_bloom_filter_differs(tmp_path):
    """The Bloom filter never forgets: an expert missed long ago is admitted; second-touch:W refuses it."""
    import libcachesim as lcs

    stream = np.tile(np.arange(6), 3).astype(np.int64)  # every id returns 6 requests later, three times
    sel = stream.reshape(-1, 1, 1).astype(np.int16)
    routing = make_routing(sel, np.ones_like(sel, np.float32), sel.copy(), np.zeros(len(stream), np.int32), 6)
    oracle_trace(tmp_path / "s.oracle", stream)
    bloom = libcachesim_misses(tmp_path / "s.oracle", "lru", 6, len(stream), admissioner=lcs.BloomFilterAdmissioner())
    assert bloom == simulate(routing, eviction="lru", slots=6, admission="second-touch").totals()["misses"] == 12
    few = simulate(routing, eviction="lru", slots=6, admission="second-touch:5")
    assert few.totals()["misses"] == 18 and few.totals()["hits"] == 0


@pytest.mark.parametrize("spec", ["second-touch:0", "second-touch:-3", "second-touch:2.5", "second-touch:nan",
                                  "second-touch:inf", "often", "always:2"])
@pytest.mark.parametrize("command", ["simulate", "sweep"])
def test_bad_admission_is_one_line(shipped_trace, tmp_path, spec, command):
    args = [command, str(shipped_trace), "--slots", "8", "--admission", spec]
    if command == "sweep":
        args += ["-e", "lru", "-m", "fetch-all", "-o", str(tmp_path / "out.parquet")]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 2, out.output
    lines = [x for x in out.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("moesim: error: "), out.output


def test_sweep_admission_spares_the_baseline(tmp_path):
    """--admission applies to every row but the baseline, which keeps its speed-up of 1; rows that admit on a
    second touch are not the (always-admitting) presets."""
    from sweep_helpers import small_trace

    from moesim import api

    trace = small_trace(tmp_path)
    rows = api.sweep(trace, budgets=0.25, evictions=["lru", "freq"], misses=["fetch-all", "first-choice"],
                     admission="second-touch:64")
    base = rows.filter((rows["eviction"] == "lru") & (rows["miss"] == "fetch-all") & (rows["admission"] == "always"))
    assert base.height == 1 and base["speedup"][0] == pytest.approx(1.0)
    touched = rows.filter(rows["admission"] == "second-touch:64")
    assert touched.height and set(touched["preset"]) == {""}
    assert all("second-touch:64" in p for p in touched["policy"])
