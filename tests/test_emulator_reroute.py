"""Rerouting inside the emulator (--reroute, docs/replay-semantics.md "Rerouting") on tiny random checkpoints:
bias:0 and keep:k are the plain policy exactly; a rerouted step runs the replay's row with the weights the model
itself gives those experts (every gating: renormalized softmax, softmax over all experts, top-k softmax,
sigmoid with a scaling factor); the closed-loop trace replays to the emulator's counters; what the emulator
cannot run is refused with one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch", reason="the [torch] extra (torch, transformers) is not installed")
pytest.importorskip("transformers", reason="the [torch] extra (transformers) is not installed")

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
import tiny_moe  # noqa: E402

from moesim.cli import cli  # noqa: E402
from moesim.emulator import Emulator  # noqa: E402
from moesim.emulator.lowbit import experts_of  # noqa: E402
from moesim.errors import MoesimError  # noqa: E402
from moesim.simulator import SimConfig  # noqa: E402

WINDOW, MAX_TOKENS = 48, 80
REROUTED = dict(eviction="lru", miss="threshold:0.15", admit=0.5, slots=5)   # the ext kernel: fetch-all runs lean


@pytest.fixture(scope="module")
def tok():
    return tiny_moe.make_tokenizer()


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    return tiny_moe.write_texts(tmp_path_factory.mktemp("texts"))


@pytest.fixture(scope="module")
def qwen(tmp_path_factory, tok):
    return tiny_moe.build("qwen3_moe", tmp_path_factory.mktemp("qwen") / "model", tokenizer=tok, seed=7)


@pytest.fixture(scope="module")
def emulator(qwen, tok, texts):
    model_dir, model, _ = qwen
    return Emulator(model, tok, texts, ["prose", "code"], window=WINDOW, max_tokens=MAX_TOKENS, model_dir=model_dir)


@pytest.mark.parametrize("rule", ["bias:0", "keep:K"])
def test_the_identities_are_the_plain_policy(emulator, rule):
    k = emulator.meta.top_k
    plain = emulator.run(SimConfig(**REROUTED), shortcut=False)
    same = emulator.run(SimConfig(**REROUTED, reroute=rule.replace("K", str(k))), shortcut=False)
    np.testing.assert_array_equal(same.nll, plain.nll)
    np.testing.assert_array_equal(same.outcome, plain.outcome)
    t, p = same.result.totals(), plain.result.totals()
    assert t["rerouted"] == t["first_choice_changed"] == 0 and t["displaced_mass"] == 0.0
    assert {key: v for key, v in t.items() if "displaced" not in key} == \
        {key: v for key, v in p.items() if "displaced" not in key}


def expected_weights(meta, logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The weights the model gives the experts ``ids`` [n, k] whenever it selects them, from its logits [n, E]."""
    x = logits.astype(np.float64)
    if meta.gating == "sigmoid":
        v = np.take_along_axis(1.0 / (1.0 + np.exp(-x)), ids, axis=1)
        w = v / v.sum(axis=1, keepdims=True)
    elif meta.gating == "softmax" and not meta.norm_topk_prob:
        p = np.exp(x - x.max(axis=1, keepdims=True))
        w = np.take_along_axis(p / p.sum(axis=1, keepdims=True), ids, axis=1)
    else:
        v = np.exp(np.take_along_axis(x, ids, axis=1))
        w = v / v.sum(axis=1, keepdims=True)
    return w * meta.routed_scaling_factor


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "dots1"])
def test_a_rerouted_step_runs_the_replays_row_with_the_models_weights(family, tmp_path, tok, texts):
    model_dir, model, _ = tiny_moe.build(family, tmp_path / family, tokenizer=tok, seed=2)
    em = Emulator(model, tok, texts, ["prose", "code"], window=WINDOW, max_tokens=MAX_TOKENS, model_dir=model_dir)
    k, E = em.meta.top_k, em.meta.n_experts
    layers = sorted(em.routers)
    seen: dict = {}

    def router_hook(ordinal):   # registered before the emulator's taps: the router's own output
        def hook(module, args, output):
            seen.setdefault(("logits", ordinal), output[0].detach().reshape(-1, E)[em.rows].float().numpy())
        return hook

    def experts_hook(ordinal):
        def hook(module, args):
            seen[("ids", ordinal)] = args[1].detach().reshape(-1, k)[em.rows].numpy()
            seen[("w", ordinal)] = args[2].detach().reshape(-1, k)[em.rows].double().numpy()
        return hook

    experts = experts_of(model, em.routers)
    handles = [em.routers[layer].register_forward_hook(router_hook(i)) for i, layer in enumerate(layers)]
    handles += [experts[layer].register_forward_pre_hook(experts_hook(i)) for i, layer in enumerate(layers)]
    try:
        em.baseline()
        seen.clear()
        run = em.run(SimConfig(eviction="lru", miss="threshold:0", slots=max(2, E // 4), reroute="bias:0.5"))
    finally:
        for h in handles:
            h.remove()
    t = run.result.totals()
    assert t["rerouted"] > 0 and t["substitutions"] == 0 and run.emulated == "forward"
    assert run.selected is not None
    changed_any = False
    for i in range(len(layers)):
        ids, w, sel = seen[("ids", i)], seen[("w", i)], run.selected[:, i, :].astype(np.int64)
        base = run.routing.sel[:, i, :].astype(np.int64)   # the router's own row (closed loop)
        changed = np.any(np.sort(sel, axis=1) != np.sort(base, axis=1), axis=1)
        changed_any |= bool(changed.any())
        np.testing.assert_array_equal(np.sort(ids[changed], axis=1), np.sort(sel[changed], axis=1))
        order = np.argsort(ids[changed], axis=1)
        got = np.take_along_axis(w[changed], order, axis=1)
        want = expected_weights(em.meta, seen[("logits", i)][changed], np.sort(ids[changed], axis=1))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
        np.testing.assert_array_equal(np.sort(ids[~changed], axis=1), np.sort(base[~changed], axis=1))
    assert changed_any


def test_rerouting_changes_the_outputs_and_counts_its_mass(emulator):
    run = emulator.run(SimConfig(**REROUTED, reroute="keep:1"))
    t = run.result.totals()
    assert run.emulated == "forward" and t["rerouted"] > 0 and t["displaced_mass"] > 0
    assert run.kl > 0 and run.result.displaced is not None and len(run.result.displaced) == emulator.L
    doc = run.to_dict(emulator.setup)
    assert doc["config"]["reroute"] == "keep:1" and doc["totals"]["displaced_mass_per_step"] > 0


def test_closed_loop_trace_replays_to_the_emulators_counters(emulator, tmp_path):
    from moesim import load_trace
    from moesim.simulator import simulate

    config = SimConfig(**REROUTED, reroute="bias:0.25")
    out = tmp_path / "closed.parquet"
    run = emulator.run(config, trace_out=out)
    replayed = simulate(load_trace(out), config).totals()
    emulated = run.result.totals()
    assert emulated["rerouted"] > 0
    for key in ("requests", "hits", "misses", "fetches", "substitutions", "drops", "admissions", "evictions",
                "rerouted", "first_choice_changed"):
        assert replayed[key] == emulated[key], key
    assert replayed["mass"] == pytest.approx(emulated["mass"], rel=1e-9)
    assert replayed["displaced_mass"] == pytest.approx(emulated["displaced_mass"], rel=1e-9)


@pytest.mark.parametrize("reroute", [["bias:0.25"], ["keep:2", "--reroute-resident", "recent:4"]])
def test_closed_loop_trace_replays_to_the_emulators_counters_through_the_cli(qwen, texts, tmp_path, reroute):
    model_dir, _, _ = qwen
    out = tmp_path / "closed.parquet"
    args = ["-e", "lru", "-m", "threshold:0.15", "--admit", "0.5", "--slots", "5", "--reroute", *reroute]
    src = ["--text", str(texts[0]), "--text", str(texts[1]), "--domain", "prose", "--domain", "code"]
    res = CliRunner().invoke(cli, ["emulate", str(model_dir), *src, "--window", str(WINDOW), "--max-tokens",
                                   str(MAX_TOKENS), *args, "--format", "json", "-o", str(out)])
    assert res.exit_code == 0, res.output
    emulated = json.loads(res.stdout)["totals"]
    sim = CliRunner().invoke(cli, ["simulate", str(out), *args, "--format", "json"])
    assert sim.exit_code == 0, sim.output
    replayed = json.loads(sim.stdout)["totals"]
    assert emulated["rerouted"] > 0
    for key in ("requests", "hits", "misses", "fetches", "substitutions", "admissions", "evictions", "rerouted",
                "first_choice_changed"):
        assert replayed[key] == emulated[key], key
    assert replayed["displaced_mass"] == pytest.approx(emulated["displaced_mass"], rel=1e-9)


def test_what_the_emulator_cannot_run_is_refused_with_one_line(qwen, texts, emulator):
    with pytest.raises(MoesimError, match="reroute-weights original"):
        emulator.run(SimConfig(**REROUTED, reroute="bias:0.5", reroute_weights="biased"))
    src = [str(qwen[0]), "--text", str(texts[0]), "--max-tokens", "20", "--slots", "4", "-m", "threshold:0.15"]
    for extra, msg in [(["--reroute", "nudge:1"], "unknown reroute"), (["--reroute", "bias:-1"], "bias:λ"),
                       (["--reroute", "bias:0.5", "--reroute-weights", "biased"], "reroute-weights original"),
                       (["--reroute-pool", "8"], "qualify --reroute"),
                       (["--reroute", "keep:1", "--reroute-resident", "recent:0"], "recent:W"),
                       (["--reroute", "bias:0.1", "--grid", "presets"], "without --grid")]:
        res = CliRunner().invoke(cli, ["emulate", *src, *extra])
        assert res.exit_code == 2, res.output
        assert msg in res.output and res.output.count("\n") == 1, res.output
