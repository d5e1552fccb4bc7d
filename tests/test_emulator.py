"""The emulator on tiny random checkpoints (built in seconds, no network).

(a) fetch-all, and a cache holding every expert, give the unmodified model's logits and dppl 0;
(b) a slow token-by-token reference with a KV cache, applying the policy online with the pure-Python
replay reference, gives the same per-token NLL and the same decisions as the fast layer-by-layer path;
(c) the closed-loop trace (-o) replays under `moesim simulate` to the emulator's counters, count for count;
a global pool is refused with one line; perplexity is what transformers' labels= loss gives.
"""

from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch", reason="the [torch] extra (torch, transformers) is not installed")
pytest.importorskip("transformers", reason="the [torch] extra (transformers) is not installed")

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
sys.path.insert(0, str(Path(__file__).parent))
import tiny_moe  # noqa: E402
from emulator_reference import reference_emulate  # noqa: E402

from moesim.cli import cli  # noqa: E402
from moesim.emulator import Emulator  # noqa: E402
from moesim.errors import MoesimError  # noqa: E402
from moesim.simulator import SimConfig  # noqa: E402
from moesim.traces.tracers.families import FAMILIES  # noqa: E402

WINDOW, MAX_TOKENS = 48, 80


@pytest.fixture(scope="module")
def tok():
    return tiny_moe.make_tokenizer()


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    return tiny_moe.write_texts(tmp_path_factory.mktemp("texts"))


@pytest.fixture(scope="module")
def qwen(tmp_path_factory, tok):
    return tiny_moe.build("qwen3_moe", tmp_path_factory.mktemp("qwen") / "model", tokenizer=tok, seed=5)


@pytest.fixture(scope="module")
def emulator(qwen, tok, texts):
    model_dir, model, _ = qwen
    return Emulator(model, tok, texts, ["prose", "code"], window=WINDOW, max_tokens=MAX_TOKENS, model_dir=model_dir)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_fetch_all_and_a_full_cache_give_the_unmodified_logits(family, tmp_path, tok, texts):
    model_dir, model, _ = tiny_moe.build(family, tmp_path / family, tokenizer=tok)
    em = Emulator(model, tok, texts, ["prose", "code"], window=WINDOW, max_tokens=MAX_TOKENS, model_dir=model_dir)
    _, _, base_logits, _ = em.baseline()
    E = em.meta.n_experts
    for cfg in (SimConfig(eviction="lru", miss="fetch-all", slots=2),
                SimConfig(eviction="lru", miss="substitute", slots=E, warm=True)):
        run = em.run(cfg, shortcut=False, keep_logits=True)
        assert run.emulated == "forward"
        torch.testing.assert_close(run.logits, base_logits, rtol=1e-5, atol=1e-5)
        assert run.dppl_pct == pytest.approx(0.0, abs=1e-9)
        assert run.result.totals()["substitutions"] == 0
    # a policy that substitutes changes the outputs (the taps do act)
    run = em.run(SimConfig(eviction="lru", miss="substitute", admit=0.5, slots=2), keep_logits=True)
    assert run.result.totals()["substitutions"] > 0
    assert not torch.allclose(run.logits, base_logits)


def test_perplexity_is_the_transformers_labels_loss(qwen, tok, texts):
    model_dir, model, _ = qwen
    em = Emulator(model, tok, texts[:1], window=64, max_tokens=60, model_dir=model_dir)
    assert em.setup.windows == 1
    ids = em.input_ids
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss
    assert em.baseline_ppl == pytest.approx(float(torch.exp(loss)), rel=1e-5)
    # several windows: the batch loss with padding labelled -100
    em2 = Emulator(model, tok, texts, window=WINDOW, max_tokens=MAX_TOKENS, model_dir=model_dir)
    labels = em2.input_ids.masked_fill(em2.attention_mask == 0, -100)
    with torch.no_grad():
        loss = model(input_ids=em2.input_ids, attention_mask=em2.attention_mask, labels=labels).loss
    assert em2.baseline_ppl == pytest.approx(float(torch.exp(loss)), rel=1e-5)


POLICIES = [
    dict(eviction="lru", miss="threshold:0.15", admit=0.5, slots=5),
    dict(eviction="freq", miss="first-choice", admit=0.5, slots=4),
    dict(eviction="lfu", miss="substitute", admit=0.3, slots=6),
    dict(eviction="fifo", miss="drop", slots=5),
]


def _ref_kwargs(cfg: SimConfig) -> dict:
    return dict(eviction=cfg.eviction_name, miss=cfg.miss_name, theta=cfg.theta, admit=cfg.admit,
                slots=cfg.slots, warm=cfg.warm)


@pytest.mark.parametrize("spec", POLICIES, ids=lambda s: f"{s['eviction']}-{s['miss']}")
def test_token_by_token_reference_gives_the_same_nll_and_decisions(spec, tmp_path, tok, texts):
    seed = zlib.crc32(f"emulator-reference-{spec['eviction']}-{spec['miss']}".encode())
    print(f"seed {seed}")
    model_dir, model, _ = tiny_moe.build("qwen3_moe", tmp_path / "m", tokenizer=tok, seed=seed % 1000)
    model = model.double()   # float64: the two paths' router logits agree to ~1e-12, no decision flips
    model.config._experts_implementation = "eager"   # grouped matmuls take no float64
    em = Emulator(model, tok, texts[:1], window=40, max_tokens=40, model_dir=model_dir)
    cfg = SimConfig(**spec)
    run = em.run(cfg, shortcut=False)
    assert run.result.totals()["misses"] > 0
    routers = [em.routers[i] for i in sorted(em.routers)]
    nll, outcome = reference_emulate(torch, model, em.seqs[0].tokens, routers, M=em.meta.n_candidates,
                                     **_ref_kwargs(cfg))
    np.testing.assert_array_equal(run.outcome, outcome)
    np.testing.assert_allclose(run.nll, nll, rtol=0, atol=1e-4)


@pytest.mark.parametrize("spec", [
    dict(eviction="lru", miss="threshold:0.15", admit=0.5, slots=5),
    dict(eviction="freq", miss="first-choice", admit=0.5, budget=0.25),
    dict(eviction="belady", miss="substitute", admit=0.5, slots=6),
    dict(eviction="static", miss="threshold:0.3", slots=6),
    dict(eviction="lfu", miss="drop", slots=4, warm=True),
], ids=lambda s: f"{s['eviction']}-{s['miss']}")
def test_closed_loop_trace_replays_to_the_emulators_counters(spec, qwen, texts, tmp_path):
    model_dir, _, _ = qwen
    out = tmp_path / "closed.parquet"
    args = ["-e", spec["eviction"], "-m", spec["miss"]]
    args += ["--admit", str(spec["admit"])] if "admit" in spec else []
    args += ["--slots", str(spec["slots"])] if "slots" in spec else ["--budget", str(spec["budget"])]
    args += ["--warm"] if spec.get("warm") else []
    src = ["--text", str(texts[0]), "--text", str(texts[1]), "--domain", "prose", "--domain", "code"]
    res = CliRunner().invoke(cli, ["emulate", str(model_dir), *src, "--window", str(WINDOW), "--max-tokens",
                                   str(MAX_TOKENS), *args, "--format", "json", "-o", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert set(doc) >= {"ppl", "ppl_baseline", "dppl_pct", "tokens", "mass_per_step", "totals", "open_loop"}
    assert doc["tokens"] == 2 * MAX_TOKENS - 4          # 4 windows, each scores all but its first token
    sim = CliRunner().invoke(cli, ["simulate", str(out), *args, "--format", "json"])
    assert sim.exit_code == 0, sim.output
    replayed = json.loads(sim.stdout)["totals"]
    emulated = doc["totals"]
    for key in ("requests", "hits", "misses", "fetches", "substitutions", "drops", "admissions",
                "first_choice_substitutions", "evictions", "copies"):
        assert replayed[key] == emulated[key], key
    assert replayed["mass"] == pytest.approx(emulated["mass"], rel=1e-9)


def test_decisions_agree_with_the_counters(emulator):
    run = emulator.run(SimConfig(eviction="lru", miss="threshold:0.15", admit=0.5, slots=4), shortcut=False)
    t = run.result.totals()
    assert (run.outcome == 0).sum() == t["hits"] and (run.outcome == 1).sum() == t["fetches"]
    assert (run.outcome == 2).sum() == t["substitutions"] and (run.outcome == 3).sum() == t["drops"]
    assert ((run.substitute >= 0) == (run.outcome == 2)).all()


def test_the_shortcut_is_exact_when_nothing_is_substituted(emulator):
    cfg = SimConfig(eviction="lru", miss="cpu", slots=3)
    fast, slow = emulator.run(cfg), emulator.run(cfg, shortcut=False)
    assert fast.emulated.startswith("exact") and slow.emulated == "forward"
    assert fast.ppl == slow.ppl
    assert fast.result.totals() == slow.result.totals()


def test_a_global_pool_is_refused_with_one_line(qwen, texts, emulator, tmp_path):
    with pytest.raises(MoesimError, match="per-layer pools"):
        emulator.run(SimConfig(eviction="lru", miss="substitute", slots=4, allocation="global"))
    grid = tmp_path / "g.toml"
    grid.write_text('allocation = ["per-layer", "global"]\nmiss = ["first-choice"]\nslots = [4]\n')
    res = CliRunner().invoke(cli, ["emulate", str(qwen[0]), "--text", str(texts[0]), "--max-tokens", "20",
                                   "--grid", str(grid)])
    assert res.exit_code == 2
    assert res.output.count("\n") == 1 and "per-layer pools" in res.output


def test_bad_inputs_are_one_line_errors(qwen, texts, tmp_path):
    model_dir = str(qwen[0])
    for args, msg in [
        (["--text", str(texts[0]), "-m", "substitute"], "one cache size"),
        (["--text", str(texts[0]), "-b", "0.25", "--window", "1"], "--window"),
        (["--text", str(tmp_path / "missing.txt"), "-b", "0.25"], "no such file"),
        (["--text", str(texts[0]), "-b", "0.25", "--grid", "nonsense"], "--grid takes"),
        (["--text", str(texts[0]), "-b", "0.25", "-o", str(texts[0])], "refusing to overwrite"),
    ]:
        res = CliRunner().invoke(cli, ["emulate", model_dir, *args])
        assert res.exit_code == 2, res.output
        assert msg in res.output and res.output.count("\n") == 1, res.output


def test_lowbit_runs_quantized_experts(emulator, monkeypatch):
    """lowbit:Q runs the low-bit requests on quantized copies: with an identity quantizer the output is the
    unmodified model's (the hook splits the experts' weighted sum exactly), with q2_k it is not."""
    import moesim.emulator.lowbit as lowbit_mod

    config = SimConfig(eviction="lru", miss="lowbit:q2_k", slots=2)
    real = emulator.run(config)
    assert real.result.totals()["lowbit"] > 0 and (real.outcome == 5).any()
    assert real.ppl != real.ppl_baseline and real.emulated == "forward"
    emulator._lowbit = None
    monkeypatch.setattr(lowbit_mod, "quantize", lambda torch, w, kind: w.detach().clone())
    same = emulator.run(config)
    np.testing.assert_allclose(same.nll, emulator.baseline()[0], rtol=1e-5, atol=1e-5)
    emulator._lowbit = None


def test_lowbit_quant_the_emulator_cannot_compute_is_refused(emulator):
    with pytest.raises(MoesimError, match="emulator computes low-bit experts"):
        emulator.run(SimConfig(eviction="lru", miss="lowbit:iq4_xs", slots=2))


def test_the_emulators_routing_is_its_traces_decoding(emulator, tmp_path):
    """The routing the emulator replays (Routing objects built in memory, logits included) is what its
    closed-loop trace of the same pass decodes to."""
    from moesim.traces import load_routing

    out = tmp_path / "closed.parquet"
    run = emulator.run(SimConfig(eviction="lru", miss="substitute", slots=4), trace_out=out)
    r, t = run.routing, load_routing(out)
    assert r.has_scores and r.logits.shape == r.cand.shape
    for name in ("sel", "w", "cand", "logits"):
        np.testing.assert_array_equal(getattr(r, name), getattr(t, name), err_msg=name)
