"""Re-pinning placements (repin:N[,G], static-domain[:W]): the kernels against the reference
(tests/reference_replay.py) with and without the clock, per layer and with a global pool; bad parameters and
static-domain on a trace without domains refused with one line."""

import dataclasses

import numpy as np
import pytest
from click.testing import CliRunner
from reference_replay import COUNTERS, random_routing_arrays, reference_replay
from replay_helpers import make_routing, seeded_rng
from test_replay_timed import fake_cost

from moesim.cli import cli
from moesim.errors import MoesimError
from moesim.simulator import SimConfig, simulate


def _cost_dict(cost, L):
    return {"dense_layer": cost.s_dense / L, "vram": cost.s_expert_vram, "fetch_ram": cost.s_fetch_ram,
            "fetch_nvme": cost.s_fetch_nvme, "cpu_ram": cost.s_expert_cpu, "cpu_nvme": cost.s_expert_cpu_nvme,
            "copy_ram": cost.s_copy_link, "copy_nvme": cost.s_copy_nvme, "cpu_handoff": cost.s_cpu_handoff,
            "writeback": cost.s_writeback}


def _popular(sel, L, E):
    counts: dict = {}
    for t in range(sel.shape[0]):
        for l in range(L):
            for e in sel[t, l]:
                counts[(l, int(e))] = counts.get((l, int(e)), 0) + 1
    return sorted(((l, e) for l in range(L) for e in range(E)), key=lambda o: (-counts.get(o, 0), o))


def _check(routing, config, ref, cost=None):
    res = simulate(routing, config, cost=cost)
    layers, tokens = ref
    for i, name in enumerate(COUNTERS):
        assert res.counts[:, i].tolist() == [layers[l][name] for l in range(routing.n_layers)], \
            f"{config.label()} {name}"
        assert res.token_counts[:, i].tolist() == [x[name] for x in tokens], f"{config.label()} {name} per token"
    if cost is not None:
        np.testing.assert_allclose(res.token_seconds, [x["seconds"] for x in tokens], rtol=1e-9)
        np.testing.assert_allclose(res.token_stall, [x["stall"] for x in tokens], rtol=1e-9, atol=1e-12)
    return res


def _domains(rng, T, n_domains):
    """Runs of a few tokens per domain, some tokens without one (-1)."""
    out = np.empty(T, np.int16)
    t = 0
    while t < T:
        n = int(rng.integers(1, 7))
        out[t:t + n] = rng.integers(-1, n_domains)
        t += n
    out[0] = max(out[0], 0)
    return out


GEOMETRIES = [(40, 2, 8, 2, 6), (30, 3, 16, 4, 12), (30, 1, 33, 3, 8)]
MISSES = ["fetch-all", "threshold:0.3", "first-choice", "substitute", "cpu"]


@pytest.mark.parametrize("miss", MISSES)
@pytest.mark.parametrize("spec", ["repin:1", "repin:4", "repin:5,3", "repin:7,0", "static-domain", "static-domain:12"])
def test_kernel_matches_reference(spec, miss):
    name, _, arg = spec.partition(":")
    with seeded_rng("repin", spec, miss) as rng:
        for gi, (T, L, E, k, M) in enumerate(GEOMETRIES):
            sel, w, cand, seq = random_routing_arrays(rng, T, L, E, k, M, 1)
            routing = make_routing(sel, w, cand, seq, E)
            domain = _domains(rng, T, 3)
            routing = dataclasses.replace(routing, domain=domain, domain_names=["a", "b", "c"])
            for slots in sorted({1, max(1, E // 4), E // 2}):
                allocation = ["per-layer", "global"][(gi + slots) % 2]
                warmup = [0, 3][gi % 2]
                admit = 0.4 if miss not in ("fetch-all", "cpu") else None
                config = SimConfig(eviction=spec, miss=miss, slots=slots, allocation=allocation, warmup_tokens=warmup,
                                   admit=admit)
                ms, _, theta = miss.partition(":")
                extra = {"repin": tuple(float(x) for x in (arg + ",1").split(",")[:2])} if name == "repin" else \
                    {"domain": domain, "static_prefix": int(arg) if arg else None}
                if name == "repin":
                    extra["repin"] = (int(extra["repin"][0]), extra["repin"][1])
                ref = reference_replay(sel, w, cand, seq, E, eviction=name, miss=ms, theta=float(theta or 0),
                                       slots=slots, allocation=allocation, warmup_tokens=warmup, admit=admit, **extra)
                _check(routing, config, ref)


@pytest.mark.parametrize("spec", ["repin:3", "repin:6,2", "static-domain", "static-domain:10"])
def test_kernel_matches_reference_with_the_clock(spec):
    """Uploads wait for the link and the token waits for them; evictions are written back; a host-RAM tier
    (NVMe reads) and the engine's step semantics."""
    name, _, arg = spec.partition(":")
    with seeded_rng("repin-timed", spec) as rng:
        for T, L, E, k, M, slots, ram, alloc, miss in [(50, 2, 12, 3, 8, 3, 5, "per-layer", "fetch-all"),
                                                       (40, 3, 8, 2, 6, 2, 30, "global", "cpu"),
                                                       (40, 1, 16, 4, 10, 5, 0, "per-layer", "fetch-all"),
                                                       (40, 2, 12, 3, 8, 4, 9, "per-layer", "threshold:0.3")]:
            sel, w, cand, seq = random_routing_arrays(rng, T, L, E, k, M, 1)
            routing = make_routing(sel, w, cand, seq, E)
            domain = _domains(rng, T, 4)
            routing = dataclasses.replace(routing, domain=domain, domain_names=list("abcd"))
            cost = fake_cost(L, E, rng, ram, engine_costs=True)
            ram_cap = ram if ram < L * E else None
            popular = _popular(sel, L, E)
            if name == "repin":
                n, _, g = arg.partition(",")
                extra = {"repin": (int(n), float(g or 1))}
            else:
                extra = {"domain": domain, "static_prefix": int(arg) if arg else None}
            ms, _, theta = miss.partition(":")
            admit = 0.4 if ms == "threshold" else None
            config = SimConfig(eviction=spec, miss=miss, slots=slots, allocation=alloc, admit=admit)
            ref = reference_replay(sel, w, cand, seq, E, eviction=name, miss=ms, theta=float(theta or 0), slots=slots,
                                   allocation=alloc, admit=admit, cost=_cost_dict(cost, L), ram_cap=ram_cap,
                                   ram_warm=list(reversed(popular[:ram_cap or 0])), **extra)
            res = _check(routing, config, ref, cost=dataclasses.replace(cost))
            if name == "repin":
                assert res.totals()["copies"] > 0  # the swaps were priced


def test_repin_swaps_only_past_the_gain():
    """Two experts alternate in dominance every 4 tokens: repin:4 follows them; a gain above the window's
    difference keeps the first set."""
    a = [[[0]], [[0]], [[0]], [[1]]] * 2 + [[[1]], [[1]], [[1]], [[0]]] * 2  # 0 hot, then 1 hot
    sel = np.array(a, np.int16)
    routing = make_routing(sel, np.ones_like(sel, np.float32), sel.copy(), np.zeros(len(sel), np.int32), 4)
    follow = simulate(routing, eviction="repin:4", slots=1).totals()
    sticky = simulate(routing, eviction="repin:4,3", slots=1).totals()
    assert follow["copies"] == 2 and follow["evictions"] == 1  # 0 pinned at token 4, swapped for 1 at token 12
    assert sticky["copies"] == 1 and sticky["evictions"] == 0  # a gain of 2 requests does not clear G = 3


@pytest.mark.parametrize("spec,why", [("repin", "needs its parameter"), ("repin:0", "bad parameter"),
                                      ("repin:2.5", "bad parameter"), ("repin:4,-1", "bad parameter"),
                                      ("repin:4,nan", "bad parameter"), ("repin:4,1,2", "bad parameter"),
                                      ("static-domain:0", "bad parameter"), ("repin:inf", "bad parameter")])
def test_bad_parameters_are_one_line(shipped_trace, spec, why):
    out = CliRunner().invoke(cli, ["simulate", str(shipped_trace), "--slots", "8", "-e", spec])
    assert out.exit_code == 2, out.output
    lines = [x for x in out.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("moesim: error: ") and why in lines[0], out.output


def test_static_domain_needs_domains(tmp_path):
    with seeded_rng("repin-nodomain") as rng:
        sel, w, cand, seq = random_routing_arrays(rng, 10, 2, 8, 2, 4, 1)
    routing = make_routing(sel, w, cand, seq, 8)
    with pytest.raises(MoesimError, match="needs a trace with domains"):
        simulate(routing, eviction="static-domain", slots=2)
    from conftest import FIXTURES

    from moesim.traces.importers.flame import import_flame

    path = tmp_path / "nodomain.parquet"
    import_flame(FIXTURES / "flame_tiny", path, layout="prefill")  # FLAME-MoE's dumps carry no domains
    out = CliRunner().invoke(cli, ["simulate", str(path), "--slots", "2", "-e", "static-domain"])
    assert out.exit_code == 2, out.output
    lines = [x for x in out.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("moesim: error: ") and "domains" in lines[0], out.output


def test_static_domain_on_the_shipped_trace(shipped_trace):
    """The shipped trace has four domains: one table each, switched at every change of domain."""
    from moesim.traces import load_routing

    routing = load_routing(shipped_trace)
    res = simulate(routing, eviction="static-domain", budget=0.25)
    fixed = simulate(routing, eviction="static", budget=0.25)
    assert res.totals()["copies"] > 0 and res.totals()["copies"] == res.totals()["admissions"]
    assert res.totals()["hits"] > fixed.totals()["hits"]  # in sample, per-domain tables beat one table


@pytest.mark.parametrize("command", ["simulate", "sweep"])
def test_a_streamed_replay_is_refused_with_one_line(shipped_trace, command):
    out = CliRunner().invoke(cli, [command, str(shipped_trace), "--slots", "8", "-e", "repin:64", "-m", "cpu",
                                   "--stream"])
    assert out.exit_code == 2, out.output
    lines = [x for x in out.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("moesim: error: ") and "--no-stream" in lines[0], out.output


@pytest.mark.parametrize("options", [{"step_pin": True}, {"max_uploads": 1}, {"overlap": "layer"},
                                     {"overlap": "cross-layer"}, {"miss": "hybrid"}])
def test_engine_options_match_the_reference(options):
    """The swaps under --step-pin, --max-uploads (not counted against the cap), an overlapped clock and hybrid
    misses."""
    with seeded_rng("repin-engine", sorted(options.items())) as rng:
        T, L, E, k, M = 40, 2, 12, 3, 8
        sel, w, cand, seq = random_routing_arrays(rng, T, L, E, k, M, 1)
        routing = make_routing(sel, w, cand, seq, E)
        cost = fake_cost(L, E, rng, 30, engine_costs=True)
        for spec, extra in (("repin:4", {"repin": (4, 1.0)}), ("repin:6,2", {"repin": (6, 2.0)})):
            config = SimConfig(eviction=spec, slots=3, **options)
            ref_opts = {"miss": "fetch-all", **options}
            ref = reference_replay(sel, w, cand, seq, E, eviction="repin", slots=3, cost=_cost_dict(cost, L),
                                   **ref_opts, **extra)
            _check(routing, config, ref, cost=dataclasses.replace(cost))
