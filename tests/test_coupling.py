"""Layer-to-layer predictability (`moesim coupling`, reports/coupling.py) on hand-built routing, on the
real FLAME-MoE sample when present, and the coupled synthetic generator: linked draws, per-layer
statistics unchanged by the coupling, chunking-independent output, the synthetic lookahead column."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest
from click.testing import CliRunner

from moesim.cli import cli
from moesim.errors import MoesimError
from moesim.reports.coupling import layer_coupling, transition_counts
from moesim.reports.profile import profile
from moesim.traces import load_routing
from moesim.traces.meta import TraceMeta
from moesim.traces.routing import Routing
from moesim.traces.synth_presets import PRESETS
from moesim.traces.synthetic import synthesize


def _routing(sel: np.ndarray, E: int, seq=None, lookahead=None) -> Routing:
    T, L, k = sel.shape
    meta = TraceMeta(model_id="m", family="custom", n_experts=E, top_k=k, moe_layers=tuple(range(L)),
                     n_candidates=k)
    return Routing(meta=meta, seq=np.zeros(T, np.int32) if seq is None else seq, pos=np.arange(T, dtype=np.int32),
                   phase=np.ones(T, np.int8), domain=np.full(T, -1, np.int16), domain_names=[], token=None,
                   sel=sel.astype(np.int16), w=np.full(sel.shape, 1.0 / k, np.float32), cand=sel.astype(np.int16),
                   lookahead=lookahead)


def test_transition_counts_by_hand():
    sel = np.array([[[0, 1], [2, 3]], [[0, 2], [2, 1]]])  # T=2, L=2, k=2
    c = transition_counts(sel, 4)
    assert c.shape == (1, 4, 4) and c.sum() == 8
    assert c[0, 0, 2] == 2 and c[0, 0, 3] == 1 and c[0, 0, 1] == 1 and c[0, 1, 2] == 1 and c[0, 2, 1] == 1


def test_deterministic_successor_is_predicted_exactly():
    """Layer 1 = a fixed permutation of layer 0: next-layer recall 1; random choices: prev-token at chance."""
    seed = zlib.crc32(b"coupling-perm")
    rng = np.random.default_rng(seed)
    E, k, T = 16, 2, 4000
    perm = rng.permutation(E)
    s0 = np.array([rng.choice(E, k, replace=False) for _ in range(T)])
    sel = np.stack([s0, perm[s0]], axis=1)
    d = layer_coupling(_routing(sel, E), predict=k)
    P = d["predictors"]
    assert P["next-layer"]["recall"] == 1.0 and P["next-layer-best"]["recall"] == 1.0, seed
    assert P["frequency"]["recall"] == pytest.approx(k / E, abs=0.03), seed
    assert P["prev-token"]["recall"] == pytest.approx(k / E, abs=0.03), seed
    assert P["chance"]["recall"] == pytest.approx(k / E)
    assert P["next-layer"]["beyond_frequency"] == 1.0
    assert d["layers"] == [{"layer": 0, "next": 1, **{p: P[p]["recall"] for p in P}}]


def test_prev_token_and_lookahead_and_ranges():
    """Every token repeats the previous one's experts: prev-token recall 1 (first token of each sequence
    excluded); a lookahead column equal to the next layer's selection: recall 1."""
    E, k, T, L = 8, 2, 40, 3
    sel = np.zeros((T, L, k), dtype=np.int64)
    sel[:, :, 0], sel[:, :, 1] = np.arange(L)[None, :], (np.arange(L) + 3)[None, :]
    look = np.full((T, L, k), -1)
    look[:, :-1] = sel[:, 1:]
    seq = np.repeat(np.arange(4, dtype=np.int32), T // 4)
    d = layer_coupling(_routing(sel, E, seq=seq, lookahead=look), train_tokens=10)
    P = d["predictors"]
    assert P["prev-token"]["recall"] == 1.0 and P["lookahead"]["recall"] == 1.0
    # tokens 10, 20 and 30 start sequences: no previous token
    assert P["prev-token"]["steps"] == (T - 10 - 3) * (L - 1) and P["lookahead"]["steps"] == (T - 10) * (L - 1)
    d = layer_coupling(_routing(sel, E, seq=seq, lookahead=look), train_tokens=10, layers=(1, 2))
    assert d["n_layers"] == 2 and [r["layer"] for r in d["layers"]] == [1]
    with pytest.raises(MoesimError, match="at least two MoE layers"):
        layer_coupling(_routing(sel, E), layers=(2, 2))
    with pytest.raises(MoesimError, match="--train-tokens"):
        layer_coupling(_routing(sel, E), train_tokens=T)
    with pytest.raises(MoesimError, match="--predict"):
        layer_coupling(_routing(sel, E), predict=E + 1)


def test_cli(tmp_path):
    p = synthesize("olmoe-1b-7b", 300, path=tmp_path / "o.parquet", lookahead=True)
    res = CliRunner().invoke(cli, ["coupling", str(p), "--format", "json", "--train-tokens", "100"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["synthetic"] is True and d["train_tokens"] == 100 and "lookahead" in d["predictors"]
    res = CliRunner().invoke(cli, ["coupling", str(p), "--layers", "--layer-range", "0-3"])
    assert res.exit_code == 0 and "SYNTHETIC" in res.output and "0->1" in res.output and "3->4" not in res.output
    res = CliRunner().invoke(cli, ["coupling", str(p), "--layer-range", "5-2"])
    assert res.exit_code == 2 and "--layer-range" in res.output


def test_real_flame_layers_predict_the_next(flame_dir, tmp_path):
    """FLAME-MoE-290M prefill routing (docs/coupling.md): layer l's experts predict l+1's far beyond
    popularity and the previous token (layers 2..9; the sample's layers 10..13 repeat 2..5)."""
    from moesim.traces.importers.flame import import_flame

    p = import_flame(flame_dir, tmp_path / "f.parquet", layout="prefill").path
    d = layer_coupling(load_routing(p), layers=(2, 9))
    P = d["predictors"]
    assert P["next-layer"]["recall"] == pytest.approx(0.451, abs=0.002)
    assert P["next-layer-best"]["beyond_frequency"] == pytest.approx(0.273, abs=0.002)
    assert P["frequency"]["recall"] < 0.12 and P["prev-token"]["recall"] < 0.12


# ------------------------------------------------------------------------------------------------------
# the coupled synthetic generator


def test_linked_draws_follow_the_links():
    """The reference bits the kernel is tested against (tests/test_synth_kernel.py): always linked, every
    layer's bits are the layer below's through pred; never linked, each element has its own."""
    from synth_reference import linked_bits

    L, E, c = 4, 16, 3
    rng = np.random.default_rng(zlib.crc32(b"linked"))
    pred = np.zeros((L, E), np.int32)
    for lay in range(1, L):
        pred[lay] = rng.permutation(E)
    full, none = linked_bits(5, 7, c, pred, 65536), linked_bits(5, 7, c, pred, 0)
    np.testing.assert_array_equal(full[:, 0], none[:, 0])
    for lay in range(1, L):
        np.testing.assert_array_equal(full[:, lay], full[:, lay - 1][:, pred[lay]])  # always linked
        assert len(np.unique(none[:, lay])) == c * E  # never linked: own draws


def test_coupling_keeps_each_layer_and_couples_layers(tmp_path):
    """The knob moves layer-to-layer predictability and nothing a per-layer statistic sees beyond noise."""
    kn = PRESETS["qwen3-30b-a3b"]
    a = load_routing(synthesize("qwen3-30b-a3b", 1000, path=tmp_path / "a.parquet", knobs=kn.replace(couple=0.0)))
    b = load_routing(synthesize("qwen3-30b-a3b", 1000, path=tmp_path / "b.parquet", knobs=kn.replace(couple=0.9)))
    pa_, pb = profile(a), profile(b)
    for key in ("reuse_next_token", "reuse_chance_marginal", "working_set_95"):
        assert pb[key] == pytest.approx(pa_[key], abs=0.015), key
    ca, cb = layer_coupling(a)["predictors"], layer_coupling(b)["predictors"]
    assert cb["next-layer-best"]["beyond_frequency"] > ca["next-layer-best"]["beyond_frequency"] + 0.08


@pytest.mark.parametrize("block,parts", [(3, 1), (1000, 5), (1, 36)])
def test_coupled_trace_does_not_depend_on_chunking(tmp_path, monkeypatch, block, parts):
    """Chunks of 7 tokens, the kernel's token blocks (3 tokens: blocks that end a chunk short; 1000: one
    block per chunk) and its layer ranges (1, 5, one per layer) give the bytes of the defaults."""
    import moesim.traces.synthetic as synth

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")  # same relative path: it is part of the recorded command
    one = tmp_path / "a" / synthesize("gpt-oss-120b", 300, seqs=2, path="t.parquet", lookahead=True)
    monkeypatch.setattr(synth, "LINKED_DRAWS", 36 * 128 * 7)  # 7 tokens per chunk
    monkeypatch.setattr(synth, "BLOCK", block)
    monkeypatch.setattr(synth, "PARTS", parts)
    monkeypatch.chdir(tmp_path / "b")
    two = tmp_path / "b" / synthesize("gpt-oss-120b", 300, seqs=2, path="t.parquet", lookahead=True)
    assert one.read_bytes() == two.read_bytes()


def test_synthetic_lookahead_column(tmp_path):
    r = load_routing(synthesize("qwen3-30b-a3b", 400, path=tmp_path / "l.parquet", lookahead=True))
    assert r.lookahead is not None and (r.lookahead[:, -1] == -1).all()
    la = r.lookahead[:, :-1].astype(np.int64)
    assert ((la >= 0) & (la < r.n_experts)).all()
    assert (np.sort(la, axis=2)[:, :, 1:] != np.sort(la, axis=2)[:, :, :-1]).all()
    # a noisy copy of the next layer's selection, drawn from its candidates
    hit = (la[:, :, :, None] == r.sel[:, 1:, None, :]).any(axis=3).mean()
    assert 0.8 < hit < 0.99
    assert (la[:, :, :, None] == r.cand[:, 1:, None, :]).any(axis=3).all()
    plain = load_routing(synthesize("qwen3-30b-a3b", 400, path=tmp_path / "p.parquet"))
    assert plain.lookahead is None
    np.testing.assert_array_equal(plain.sel, r.sel)  # the column leaves the routing alone


def test_coupling_knob_is_a_probability(tmp_path):
    with pytest.raises(MoesimError, match="couple must be"):
        synthesize("olmoe-1b-7b", 50, path=tmp_path / "x.parquet", knobs=PRESETS["olmoe-1b-7b"].replace(couple=1.5))
