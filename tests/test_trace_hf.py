"""PyTorch tracer on tiny random checkpoints of all supported families (no network).

For each family: the trace's layer mapping and gating metadata match the model; the
top-k re-derived from the recorded logits with the family's gating equals the model's
own selection for every (token, layer); and for Qwen3-MoE traced by `moesim trace hf`,
the recorded top-k equals what transformers computes independently on the recorded
token ids.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch", reason="the [torch] extra (torch, transformers) is not installed")
transformers = pytest.importorskip("transformers", reason="the [torch] extra (transformers) is not installed")

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
import tiny_moe  # noqa: E402

from moesim.cli import cli  # noqa: E402
from moesim.errors import MoesimError  # noqa: E402
from moesim.traces import TraceFile, load_routing  # noqa: E402
from moesim.traces.tracers import record_router, trace_hf  # noqa: E402
from moesim.traces.tracers.families import FAMILIES  # noqa: E402

SEQ_LEN = 64
MAX_TOKENS = 96


@pytest.fixture(scope="module")
def tok():
    return tiny_moe.make_tokenizer()


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    return [str(p) for p in tiny_moe.write_texts(tmp_path_factory.mktemp("texts"))]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def traced(request, tmp_path_factory, tok, texts):
    """(family, model dir, model, sparse trace, dense trace) for one family."""
    family = request.param
    d = tmp_path_factory.mktemp(family)
    model_dir, model, _ = tiny_moe.build(family, d / "model", tokenizer=tok)
    kw = dict(domains=["prose", "code"], seq_len=SEQ_LEN, max_tokens=MAX_TOKENS, model=model, tokenizer=tok)
    sparse = trace_hf(model_dir, texts, d / "sparse.parquet", candidates=6, **kw)
    dense = trace_hf(model_dir, texts, d / "dense.parquet", dense=True, **kw)
    return family, model_dir, model, sparse, dense


def _strip_selection(path: Path, out: Path) -> Path:
    """The trace without the model's selected ids and weights: decoding must re-derive them."""
    t = pq.read_table(path)
    pq.write_table(t.drop_columns([c for c in ("selected", "weights") if c in t.column_names]), out)
    return out


def _sets(sel: np.ndarray) -> np.ndarray:
    return np.sort(sel, axis=-1)


def test_metadata_matches_the_model(traced):
    family, model_dir, model, sparse, _ = traced
    meta = TraceFile(sparse).meta
    _, moe_layers, dense_layers = tiny_moe.FAMILY_CONFIGS[family]
    cfg = model.config
    assert meta.family == family
    assert list(meta.moe_layers) == moe_layers
    assert list(meta.dense_layers) == dense_layers
    assert meta.gating == FAMILIES[family].gating
    assert meta.top_k == cfg.num_experts_per_tok
    assert meta.layout == "sparse" and meta.n_candidates == 6
    assert meta.synthetic is False
    assert meta.tracer["name"] == "moesim.torch"
    assert meta.source["domains"] == ["prose", "code"] and meta.source["seq_len"] == SEQ_LEN
    assert meta.bytes_per_expert["bf16"] > 0
    if family in ("qwen3_moe", "qwen3_next", "qwen2_moe", "olmoe"):
        assert meta.norm_topk_prob == cfg.norm_topk_prob
    if family in ("qwen2_moe", "qwen3_next") or FAMILIES[family].deepseek_like:
        assert meta.n_shared_experts == 1
    if FAMILIES[family].deepseek_like:
        assert (meta.n_group, meta.topk_group, meta.routed_scaling_factor) == \
            (cfg.n_group or 1, cfg.topk_group or 1, cfg.routed_scaling_factor)
    if family in ("deepseek_v3", "glm4_moe", "dots1", "minimax_m2"):
        owner = (lambda mlp: mlp) if family == "minimax_m2" else (lambda mlp: mlp.gate)
        want = [owner(model.model.layers[i].mlp).e_score_correction_bias.numpy() for i in moe_layers]
        np.testing.assert_allclose(np.asarray(meta.selection_bias), np.asarray(want), rtol=0, atol=1e-7)
    else:
        assert meta.selection_bias is None
    r = load_routing(sparse)
    assert r.n_tokens == 2 * MAX_TOKENS
    assert r.domain_names == ["code", "prose"] and set(r.domain.tolist()) == {0, 1}
    assert r.token is not None and (r.token >= 0).all()


@pytest.mark.parametrize("layout", ["sparse", "dense"])
def test_rederived_topk_equals_the_models_selection(traced, layout, tmp_path):
    family, _, _, sparse, dense = traced
    path = sparse if layout == "sparse" else dense
    own = load_routing(path)
    stripped = _strip_selection(path, tmp_path / "stripped.parquet")
    meta = TraceFile(path).meta
    if meta.gating == "sigmoid" and meta.n_group > 1 and layout == "sparse":
        # group-limited selection needs all E scores: why the tracer stores `selected`
        with pytest.raises(MoesimError, match="group-limited"):
            load_routing(stripped)
        return
    again = load_routing(stripped)
    assert own.sel.shape == again.sel.shape
    np.testing.assert_array_equal(_sets(own.sel), _sets(again.sel))
    np.testing.assert_array_equal(own.sel, again.sel)      # same rank order by gate weight
    np.testing.assert_allclose(own.w, again.w, atol=2e-5)


def test_sparse_and_dense_traces_decode_alike(traced):
    _, _, _, sparse, dense = traced
    a, b = load_routing(sparse), load_routing(dense)
    np.testing.assert_array_equal(a.sel, b.sel)
    assert (a.sel[:, :, :, None] == a.cand[:, :, None, :]).any(axis=3).all()   # selected always stored
    if a.meta.n_group == 1:
        np.testing.assert_array_equal(a.cand, b.cand[:, :, :6])
    np.testing.assert_array_equal(a.token, b.token)


def test_stored_weights_are_the_models(traced):
    """The weights column holds the gate weights the model applied, recomputed here from
    the stored logits per family (OLMoE/Qwen2-MoE: not renormalized; DeepSeek: scaled)."""
    family, _, model, _, dense = traced
    t = pq.read_table(dense, columns=["logits", "selected", "weights"])
    logits, sel, w = (np.asarray(t.column(c).to_pylist(), dtype=np.float64) for c in ("logits", "selected", "weights"))
    picked = np.take_along_axis(logits, sel.astype(np.int64), axis=1)
    meta = TraceFile(dense).meta
    if meta.gating == "sigmoid":
        p = 1 / (1 + np.exp(-picked))
        want = p / p.sum(axis=1, keepdims=True) * meta.routed_scaling_factor
    elif meta.norm_topk_prob:
        e = np.exp(picked - picked.max(axis=1, keepdims=True))
        want = e / e.sum(axis=1, keepdims=True)
    else:
        lse = np.log(np.exp(logits - logits.max(axis=1, keepdims=True)).sum(axis=1, keepdims=True))
        want = np.exp(picked - logits.max(axis=1, keepdims=True) - lse)
        assert (w.sum(axis=1) < 1 - 1e-3).any()   # the k weights do not sum to 1
    np.testing.assert_allclose(w, want, rtol=2e-4, atol=1e-6)


def test_cli_qwen3_topk_equals_transformers_on_recorded_tokens(tmp_path, tok, texts):
    """Must-show: `moesim trace hf` on a tiny Qwen3-MoE; transformers, run again on the
    recorded token ids, selects the same top-k set for every (token, layer)."""
    model_dir, model, _ = tiny_moe.build("qwen3_moe", tmp_path / "qwen3", tokenizer=tok, seed=3)
    out = tmp_path / "qwen3.parquet"
    res = CliRunner().invoke(cli, ["trace", "hf", str(model_dir), "--text", texts[0], "--text", texts[1],
                                   "--domain", "prose", "--domain", "code", "--seq-len", "32",
                                   "--max-tokens", "80", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "wrote" in res.output and "160 tokens" in res.output
    r = load_routing(out)
    k = model.config.num_experts_per_tok
    checked = 0
    for s in np.unique(r.seq):
        rows = np.flatnonzero(r.seq == s)
        rows = rows[np.argsort(r.pos[rows])]
        ids = torch.tensor(r.token[rows][None, :].astype(np.int64))
        with torch.no_grad():
            outp = model(input_ids=ids, output_router_logits=True)
        assert len(outp.router_logits) == r.n_layers
        for li, logits in enumerate(outp.router_logits):
            probs = torch.softmax(logits.float(), dim=-1)
            want = torch.topk(probs, k, dim=-1).indices.numpy()
            np.testing.assert_array_equal(np.sort(want, axis=1), np.sort(r.sel[rows, li], axis=1))
            checked += len(rows)
    assert checked == r.n_tokens * r.n_layers == 160 * 2


def test_record_router_on_a_custom_module(tmp_path):
    """The Python API on a model outside the supported families: routers named by the
    user, returning bare logits; selection derived from the gating given."""

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.router = torch.nn.Linear(8, 6, bias=False)
            self.proj = torch.nn.Linear(8, 8)

        def forward(self, x):
            self.router(x)
            return x + self.proj(x)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(50, 8)
            self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])

        def forward(self, input_ids):
            x = self.emb(input_ids)
            for b in self.blocks:
                x = b(x)
            return x

    torch.manual_seed(0)
    net = Net().eval()
    ids = torch.randint(0, 50, (2, 7))
    out = tmp_path / "custom.parquet"
    with torch.no_grad(), record_router(net, out, modules=["blocks.0.router", "blocks.2.router"], top_k=2,
                                        model_id="toy", domains=["a", "b"]) as rec:
        rec.domain = "a"
        net(ids)
        rec.domain = "b"
        net(input_ids=ids[:1, :4])
    r = load_routing(out)
    assert r.meta.moe_layers == (0, 2) and r.meta.family == "custom" and r.meta.model_id == "toy"
    assert "selected" not in TraceFile(out).columns
    assert r.n_tokens == 2 * 7 + 4 and r.n_sequences == 3
    with torch.no_grad():
        h = net.emb(ids)
        want0 = torch.topk(net.blocks[0].router(h), 2, dim=-1).indices.reshape(-1, 2).numpy()
    first = (r.seq < 2)
    np.testing.assert_array_equal(np.sort(r.sel[first, 0], axis=1), np.sort(want0, axis=1))
    np.testing.assert_array_equal(r.token[first], ids.reshape(-1).numpy())
    assert r.domain_names[r.domain[~first][0]] == "b"


def test_record_router_generate_records_decode_steps(tmp_path, tok):
    _, model, _ = tiny_moe.build("qwen3_moe", tmp_path / "m", tokenizer=tok)
    prompt = torch.tensor([tok("def add(a, b):")["input_ids"]])
    P = prompt.shape[1]
    out = tmp_path / "gen.parquet"
    with torch.no_grad(), record_router(model, out) as rec:
        gen = model.generate(prompt, max_new_tokens=5, do_sample=False, pad_token_id=tok.eos_token_id)
    r = load_routing(out)
    assert rec.sequences == 1
    n_new = gen.shape[1] - P
    assert r.n_tokens == P + n_new - 1          # the last generated token is never fed back
    np.testing.assert_array_equal(r.pos, np.arange(r.n_tokens))
    assert (r.phase[:P] == 0).all() and (r.phase[P:] == 1).all()   # prefill, then decode
    np.testing.assert_array_equal(r.token, gen[0, :r.n_tokens].numpy())


def test_cli_rejects_a_path_that_is_not_a_model(tmp_path, texts):
    res = CliRunner().invoke(cli, ["trace", "hf", str(tmp_path), "--text", texts[0], "-o", str(tmp_path / "x.parquet")])
    assert res.exit_code == 2
    assert "not a local transformers model directory" in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_cli_rejects_an_unsupported_family(tmp_path, texts):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    res = CliRunner().invoke(cli, ["trace", "hf", str(tmp_path), "--text", texts[0], "-o", str(tmp_path / "x.parquet")])
    assert res.exit_code == 2 and "unsupported model family 'llama'" in res.output


def test_without_the_extra_the_command_says_how_to_install(tmp_path, texts, monkeypatch):
    (tmp_path / "config.json").write_text('{"model_type": "qwen3_moe"}')
    monkeypatch.setitem(sys.modules, "transformers", None)
    res = CliRunner().invoke(cli, ["trace", "hf", str(tmp_path), "--text", texts[0], "-o", str(tmp_path / "x.parquet")])
    assert res.exit_code == 2
    assert "pip install 'moesim[torch]'" in res.output
    assert not (tmp_path / "x.parquet").exists()
