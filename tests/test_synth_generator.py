"""`moesim synth`: presets, metadata, determinism, bad arguments, what the generated routing looks like."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from click.testing import CliRunner

from moesim.cli import cli
from moesim.costmodel.models import load_model
from moesim.errors import MoesimError
from moesim.traces import TraceFile, load_routing
from moesim.traces.synth_presets import preset_names
from moesim.traces.synthetic import synthesize

PRESETS = ["qwen3-next-80b-a3b", "qwen3-30b-a3b", "qwen3-235b-a22b", "mixtral-8x7b", "deepseek-v3", "olmoe-1b-7b",
           "gpt-oss-120b"]


def _digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_every_requested_preset_exists():
    assert sorted(PRESETS) == preset_names()


@pytest.mark.parametrize("name", PRESETS)
def test_preset_metadata_and_geometry(tmp_path, name):
    model = load_model(name)
    path = synthesize(name, 6, seqs=2, seed=1, path=tmp_path / "t.parquet")
    tf = TraceFile(path)
    m = tf.meta
    assert m.synthetic is True
    assert m.model_id == model.hf_id and m.family == model.family
    assert m.moe_layers == model.moe_layers and m.dense_layers == model.dense_layers
    assert (m.n_experts, m.top_k, m.gating) == (model.n_experts, model.top_k, model.gating)
    assert m.norm_topk_prob == model.norm_topk_prob
    assert (m.n_group, m.topk_group, m.routed_scaling_factor) == (model.n_group, model.topk_group,
                                                                  model.routed_scaling_factor)
    assert m.bytes_per_expert == model.bytes_per_expert_table()
    assert m.layout == "ranked" and m.schema_version == 3 and model.top_k <= m.n_candidates <= model.n_experts
    assert m.logit_scale is None and m.has_scores
    assert m.tracer["name"] == "moesim-synth"
    assert m.source["preset"] == name and m.source["tokens"] == 6 and m.source["seed"] == 1
    assert m.source["command"].startswith(f"moesim synth --preset {name} --tokens 6 --seqs 2 --seed 1")
    assert ("selected" in tf.columns) == (model.gating == "sigmoid")
    assert "domain" in tf.columns
    r = load_routing(path)
    L = len(model.moe_layers)
    assert r.sel.shape == (6, L, model.top_k)
    assert sorted(np.unique(r.seq).tolist()) == [0, 1] and r.pos.tolist() == [0, 1, 2, 0, 1, 2]
    np.testing.assert_allclose(r.w.sum(axis=2), 1.0, atol=1e-5)
    assert (np.diff(r.w, axis=2) <= 1e-7).all()  # rank order: heaviest first
    # Distinct experts within a step.
    s = np.sort(r.sel, axis=2)
    assert (s[:, :, 1:] != s[:, :, :-1]).all()


def test_sparse_scores_are_exact(tmp_path):
    """lse covers all E experts: it is >= the log-sum-exp of the stored M, and softmax mass of the
    stored candidates is below 1 (the rest of the experts carry the remainder)."""
    path = synthesize("qwen3-30b-a3b", 5, path=tmp_path / "t.parquet", layout="sparse")
    t = TraceFile(path)._pf.read().to_pydict()
    for logits, lse in zip(t["top_logits"], t["lse"]):
        x = np.asarray(logits, dtype=np.float64)
        assert (np.diff(x) <= 0).all()
        mass = np.exp(x - lse).sum()
        assert 0.2 < mass < 1.0
        assert np.allclose(x * 32, np.round(x * 32))  # the coarse grid


@pytest.mark.parametrize("name", PRESETS)
def test_ranked_and_sparse_layouts_decode_identically(tmp_path, name):
    """The compact default and the full sparse layout of the same routing decode to the same arrays."""
    a = load_routing(synthesize(name, 40, seqs=2, seed=5, path=tmp_path / "r.parquet"))
    b = load_routing(synthesize(name, 40, seqs=2, seed=5, path=tmp_path / "s.parquet", layout="sparse"))
    for field in ("sel", "w", "cand", "logits", "seq", "pos", "domain", "phase"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)


def test_deterministic_per_seed(tmp_path):
    a = synthesize("qwen3-30b-a3b", 50, seqs=2, seed=7, path=tmp_path / "a.parquet")
    digest = _digest(a)
    ra = load_routing(a)
    synthesize("qwen3-30b-a3b", 50, seqs=2, seed=7, path=a)  # regenerate in place
    assert _digest(a) == digest
    b = synthesize("qwen3-30b-a3b", 50, seqs=2, seed=7, path=tmp_path / "b.parquet")
    rb = load_routing(b)
    for name in ("sel", "w", "cand", "seq", "pos", "domain"):
        np.testing.assert_array_equal(getattr(ra, name), getattr(rb, name))
    c = load_routing(synthesize("qwen3-30b-a3b", 50, seqs=2, seed=8, path=tmp_path / "c.parquet"))
    assert not np.array_equal(ra.sel, c.sel)


def test_domains_and_topic_switches(tmp_path):
    path = synthesize("qwen3-30b-a3b", 600, seqs=2, seed=0, domains=["code", "prose", "legal"],
                      path=tmp_path / "t.parquet")
    r = load_routing(path)
    assert r.domain_names == ["code", "legal", "prose"]
    assert (r.domain >= 0).all()
    for s in (0, 1):
        d = r.domain[r.seq == s]
        assert (d[1:] != d[:-1]).sum() >= 2  # several topic switches inside each sequence
    none = TraceFile(synthesize("qwen3-30b-a3b", 10, domains=[], path=tmp_path / "n.parquet"))
    assert "domain" not in none.columns and none.meta.source["domains"] == []


def test_prefill_phase(tmp_path):
    r = load_routing(synthesize("olmoe-1b-7b", 20, seqs=2, prefill=3, path=tmp_path / "t.parquet"))
    assert r.phase.tolist() == ([0] * 3 + [1] * 7) * 2  # PHASES = (prefill, decode)


def test_router_like_structure(tmp_path):
    """Skewed per-layer popularity with different favourites per layer, next-token reuse well above
    chance, a dominant first choice with a tail of small weights."""
    from moesim.reports.profile import expert_counts, profile

    r = load_routing(synthesize("qwen3-30b-a3b", 400, path=tmp_path / "t.parquet"))
    p = profile(r)
    assert p["reuse_next_token"] > 1.5 * p["reuse_chance_marginal"] > 3 * p["reuse_chance_uniform"]
    counts = expert_counts(r.sel, r.n_experts)
    top = counts.argmax(axis=1)
    assert len(np.unique(top)) > r.n_layers // 3
    assert p["gate"]["mean_first_choice_weight"] > 2.0 / r.top_k
    assert 0.05 < p["gate"]["fraction_weight_ge_0.15"] < 0.6


@pytest.mark.parametrize("args,needle", [
    (["--preset", "llama-7b", "--tokens", "5"], "known: deepseek-v3"),
    (["--preset", "qwen3-30b-a3b", "--tokens", "0"], "--tokens must be at least 1"),
    (["--preset", "qwen3-30b-a3b", "--tokens", "5", "--seqs", "0"], "--seqs must be at least 1"),
    (["--preset", "qwen3-30b-a3b", "--tokens", "5", "--seqs", "6"], "cannot exceed --tokens"),
    (["--preset", "qwen3-30b-a3b", "--tokens", "5", "--domains", "code,,math"], "--domains"),
    (["--preset", "qwen3-30b-a3b", "--tokens", "5", "--domains", "code,code"], "twice"),
    (["--preset", "qwen3-30b-a3b", "--tokens", "5", "--candidates", "4"], "--candidates"),
    (["--preset", "qwen3-30b-a3b", "--tokens", "5", "--seed", "-1"], "--seed"),
    (["--preset", "qwen3-30b-a3b", "--tokens", "5", "--generator", "1"], "generator 1 (the original numpy one) was"),
    (["--preset", "qwen3-30b-a3b", "--tokens", "5", "--generator", "3"], "unknown generator 3"),
])
def test_bad_arguments(tmp_path, args, needle):
    out = tmp_path / "x.parquet"
    res = CliRunner().invoke(cli, ["synth", *args, "-o", str(out)])
    assert res.exit_code == 2
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("moesim: error:") and needle in lines[0]
    assert not out.exists()


def test_library_rejects_bad_arguments(tmp_path):
    with pytest.raises(MoesimError, match="known"):
        synthesize("nope", 5, path=tmp_path / "x.parquet")
    with pytest.raises(MoesimError):
        synthesize("qwen3-30b-a3b", 3, seqs=4, path=tmp_path / "x.parquet")


def test_cli_writes_a_trace(tmp_path):
    out = tmp_path / "t.parquet"
    res = CliRunner().invoke(cli, ["synth", "--preset", "mixtral-8x7b", "--tokens", "12", "--seqs", "3",
                                   "--domains", "code,prose", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "synthetic" in res.output
    m = TraceFile(out).meta
    assert m.synthetic and m.source["domains"] == ["code", "prose"]
    assert m.source["command"] == f"moesim synth --preset mixtral-8x7b --tokens 12 --seqs 3 --seed 0 " \
                                  f"--domains code,prose -o {out}"
