"""The optional ``lookahead`` column: written, read back in every layout, carried by compact and the
decode cache, checked; and recorded by the PyTorch tracer as the next MoE layer's router applied to
this layer's router input (on a model whose gates are identical and whose layers add nothing to the
residual stream, that is exactly the next layer's selection)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from moesim.errors import MoesimError
from moesim.traces import TraceFile, TraceMeta, TraceWriter, load_routing
from moesim.traces.compact import compact_trace
from moesim.traces.decode_cache import load_decoded
from moesim.traces.routing import validate_trace

L, E, K, T = 3, 8, 2, 5


def _write(path, lookahead, layout="sparse"):
    meta = TraceMeta(model_id="m", family="custom", n_experts=E, top_k=K, moe_layers=(0, 1, 2), layout=layout,
                     n_candidates=4)
    rng = np.random.default_rng(7)
    n = T * L
    logits = rng.normal(size=(n, E)).astype(np.float32)
    top = np.argsort(-logits, axis=1)[:, :4]
    with TraceWriter(path, meta, lookahead=lookahead is not None) as w:
        w.write(seq=np.zeros(n, dtype=np.int32), pos=np.repeat(np.arange(T), L), layer=np.tile([0, 1, 2], T),
                top_ids=top, top_logits=np.take_along_axis(logits, top, axis=1),
                lse=np.log(np.exp(logits).sum(axis=1)), **({} if lookahead is None else {"lookahead": lookahead}))
    return path


def _look():
    rng = np.random.default_rng(3)
    la = np.array([rng.permutation(E)[:K] for _ in range(T * L)], dtype=np.int64).reshape(T, L, K)
    la[:, L - 1] = -1
    la[2, 0] = -1  # unknown in one row
    return la


def test_roundtrip_every_layout(tmp_path):
    la = _look()
    p = _write(tmp_path / "a.parquet", la.reshape(-1, K))
    col = pq.read_table(p).column("lookahead")
    assert col.type == pa.list_(pa.int16(), K) and col.null_count == T + 1
    r = load_routing(p)
    assert r.lookahead is not None and r.lookahead.dtype == np.int16
    np.testing.assert_array_equal(r.lookahead, la)
    assert validate_trace(p)["tokens"] == T
    ranked = compact_trace(p, tmp_path / "r.parquet")
    np.testing.assert_array_equal(load_routing(ranked).lookahead, la)
    assert load_routing(_write(tmp_path / "none.parquet", None)).lookahead is None


def test_decode_cache_keeps_it(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    la = _look()
    p = _write(tmp_path / "a.parquet", la.reshape(-1, K))
    first, second = load_decoded(p), load_decoded(p)  # the second from the cache
    np.testing.assert_array_equal(first.lookahead, la)
    np.testing.assert_array_equal(second.lookahead, la)
    assert load_decoded(_write(tmp_path / "b.parquet", None)).lookahead is None


@pytest.mark.parametrize("bad, message", [(E, "outside"), (-2, "outside"), ("dup", "repeats")])
def test_writer_refuses_bad_ids(tmp_path, bad, message):
    la = _look().reshape(-1, K)
    if bad == "dup":
        la[0] = [1, 1]
    else:
        la[0, 1] = bad
    with pytest.raises(MoesimError, match=message):
        _write(tmp_path / "x.parquet", la)
    assert not (tmp_path / "x.parquet").exists()


def test_reader_refuses_bad_ids(tmp_path):
    p = _write(tmp_path / "a.parquet", _look().reshape(-1, K))
    t = pq.read_table(p)
    rows = t.column("lookahead").to_pylist()
    rows[0] = [E + 3, 0]
    arr = pa.array(rows, type=t.schema.field("lookahead").type)
    bad = tmp_path / "bad.parquet"
    pq.write_table(t.set_column(t.schema.get_field_index("lookahead"), "lookahead", arr)
                   .replace_schema_metadata(t.schema.metadata), bad)
    with pytest.raises(MoesimError, match="lookahead holds expert id"):
        load_routing(bad)


# ------------------------------------------------------------------------------------------------------
# the PyTorch tracer

torch_families = ["qwen3_moe", "qwen3_next", "qwen2_moe", "mixtral", "olmoe", "deepseek_v3", "deepseek_v2",
                  "glm4_moe", "dots1", "granitemoe", "gpt_oss"]


@pytest.fixture(scope="module")
def tiny():
    pytest.importorskip("torch", reason="the [torch] extra (torch, transformers) is not installed")
    pytest.importorskip("transformers", reason="the [torch] extra (transformers) is not installed")
    sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
    import tiny_moe

    return tiny_moe


def _no_residual_identical_gates(model, torch):
    """Every router a copy of the first MoE layer's; attention and MLP outputs zeroed by hooks, so every
    layer's router sees the same hidden state."""
    from moesim.traces.tracers.torch_hooks import find_routers

    routers = find_routers(model)
    first = routers[min(routers)]
    state = first.state_dict()
    with torch.no_grad():
        for mod in routers.values():
            mod.load_state_dict(state)
            for name, buf in first.named_buffers():
                getattr(mod, name).copy_(buf)

    def zero(module, args, out):
        if isinstance(out, tuple):
            return (torch.zeros_like(out[0]), *out[1:])
        return torch.zeros_like(out)

    for name, mod in model.named_modules():
        if name.rpartition(".")[2] in ("self_attn", "linear_attn", "mlp", "block_sparse_moe"):
            mod.register_forward_hook(zero)


@pytest.mark.parametrize("family", torch_families)
def test_tracer_lookahead_is_next_selection_when_layers_do_nothing(tiny, tmp_path, family):
    import torch

    from moesim.traces.tracers import record_router

    _, model, _ = tiny.build(family, tmp_path / "model")
    _no_residual_identical_gates(model, torch)
    ids = torch.randint(0, model.config.vocab_size, (2, 24))
    out = tmp_path / "t.parquet"
    with torch.inference_mode(), record_router(model, out, lookahead=True):
        model(input_ids=ids, use_cache=False)
    r = load_routing(out)
    assert r.lookahead is not None and r.n_layers >= 2
    np.testing.assert_array_equal(r.lookahead[:, :-1], r.sel[:, 1:])
    assert (r.lookahead[:, -1] == -1).all()


def test_tracer_lookahead_on_a_random_model(tiny, tmp_path):
    """On an ordinary model the column is a real prediction: valid ids, mostly but not always the next layer's."""
    import torch

    from moesim.traces.tracers import record_router

    _, model, _ = tiny.build("qwen3_moe", tmp_path / "model")
    ids = torch.randint(0, model.config.vocab_size, (2, 32))
    with torch.inference_mode(), record_router(model, tmp_path / "t.parquet", lookahead=True) as rec:
        model(input_ids=ids, use_cache=False)
        assert rec.tokens == 64
    r = load_routing(tmp_path / "t.parquet")
    la = r.lookahead[:, :-1]
    assert ((la >= 0) & (la < r.n_experts)).all()
    assert TraceFile(tmp_path / "t.parquet").meta.n_layers == r.n_layers


def test_lookahead_refused_for_minimax(tmp_path):
    from moesim.traces.tracers import trace_hf

    d = tmp_path / "mm"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "minimax_m2"}))
    (tmp_path / "t.txt").write_text("hello")
    with pytest.raises(MoesimError, match="--lookahead is not supported for minimax_m2"):
        trace_hf(d, [str(tmp_path / "t.txt")], tmp_path / "o.parquet", lookahead=True)


def test_cli_trace_hf_lookahead(tiny, tmp_path):
    from click.testing import CliRunner

    from moesim.cli import cli

    model_dir, _, _ = tiny.build("qwen3_moe", tmp_path / "model")
    (tmp_path / "t.txt").write_text(tiny.PROSE)
    out = tmp_path / "t.parquet"
    res = CliRunner().invoke(cli, ["trace", "hf", str(model_dir), "--text", str(tmp_path / "t.txt"), "--seq-len", "32",
                                   "--max-tokens", "64", "--lookahead", "-o", str(out)])
    assert res.exit_code == 0, res.output
    r = load_routing(out)
    assert r.lookahead is not None and (r.lookahead[:, -1] == -1).all() and (r.lookahead[:, :-1] >= 0).all()
    res = CliRunner().invoke(cli, ["coupling", str(out), "--format", "json"])
    assert res.exit_code == 0 and "lookahead" in json.loads(res.output)["predictors"]
