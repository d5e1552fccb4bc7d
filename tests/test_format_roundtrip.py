"""Trace format v1: write -> read round trips, row groups, row order, streaming reads."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from moesim.errors import MoesimError
from moesim.traces import TraceFile, TraceMeta, TraceWriter, load_routing
from moesim.traces.info import trace_info
from moesim.traces.routing import expert_counts, validate_trace

E, K, M = 16, 3, 6
LAYERS = (1, 4, 5)
DOMAINS = ["code", "math", "prose"]


def make_rows(n_seq=3, n_pos=7, seed=0):
    """Per-token keys and per-(token, layer) dense logits, tokens in (seq, pos) order."""
    rng = np.random.default_rng(seed)
    seq = np.repeat(np.arange(n_seq), n_pos)
    pos = np.tile(np.arange(n_pos), n_seq)
    T = len(seq)
    logits = rng.normal(size=(T, len(LAYERS), E)).astype(np.float32)
    phase = np.where(pos < 3, "prefill", "decode")
    domain = np.array(DOMAINS, dtype=object)[(seq + pos // 4) % 3]
    token = rng.integers(0, 50000, T)
    return seq, pos, phase, domain, token, logits


def expected_topk(logits):
    """Independent top-k: sort by (-logit, id), softmax over the selected logits."""
    T, L, _ = logits.shape
    sel = np.empty((T, L, K), dtype=np.int64)
    w = np.empty((T, L, K))
    cand = np.empty((T, L, E), dtype=np.int64)
    for t in range(T):
        for l in range(L):
            row = logits[t, l].astype(np.float64)
            order = sorted(range(E), key=lambda e: (-row[e], e))
            cand[t, l] = order
            sel[t, l] = order[:K]
            x = np.exp(row[order[:K]] - row[order[0]])
            w[t, l] = x / x.sum()
    return sel, w, cand


def write_trace(path, layout, *, domain=False, token=False, selected=False, weights=False, row_group_size=1000,
                shuffle=False, seed=0, **meta_kw):
    seq, pos, phase, dom, tok, logits = make_rows(seed=seed)
    meta = TraceMeta(model_id="test/model", family="qwen3_moe", n_experts=E, top_k=K, moe_layers=LAYERS,
                     layout=layout, n_candidates=E if layout == "dense" else M, **meta_kw)
    sel_exp, w_exp, _ = expected_topk(logits)
    T, L = len(seq), len(LAYERS)
    # one row per (token, layer)
    ti = np.repeat(np.arange(T), L)
    li = np.tile(np.arange(L), T)
    order = np.random.default_rng(seed + 1).permutation(len(ti)) if shuffle else np.arange(len(ti))
    with TraceWriter(path, meta, domains=DOMAINS if domain else None, token=token, selected=selected,
                     weights=weights, row_group_size=row_group_size) as w:
        for chunk in np.array_split(order, 5):
            t, l = ti[chunk], li[chunk]
            kw = dict(seq=seq[t], pos=pos[t], layer=np.asarray(LAYERS)[l], phase=phase[t])
            lg = logits[t, l]
            if layout == "dense":
                kw["logits"] = lg
            else:
                # store the M best, deliberately not in rank order
                ids = np.argsort(-lg, axis=1, kind="stable")[:, :M][:, ::-1]
                kw.update(top_ids=ids, top_logits=np.take_along_axis(lg, ids, axis=1),
                          lse=np.log(np.exp(lg.astype(np.float64)).sum(axis=1)))
            if domain:
                kw["domain"] = dom[t]
            if token:
                kw["token"] = tok[t]
            if selected:
                kw["selected"] = sel_exp[t, l][:, ::-1]  # any order: the reader ranks them
            if weights:
                kw["weights"] = w_exp[t, l][:, ::-1] * 3.0  # any scale: the reader normalizes
            w.write(**kw)
    return seq, pos, phase, dom, tok, logits


@pytest.mark.parametrize("layout", ["dense", "sparse"])
@pytest.mark.parametrize("extras", [(), ("domain", "token"), ("selected",), ("selected", "weights"),
                                    ("domain", "token", "selected", "weights")])
def test_round_trip(tmp_path, layout, extras):
    flags = {name: name in extras for name in ("domain", "token", "selected", "weights")}
    path = tmp_path / "t.parquet"
    seq, pos, phase, dom, tok, logits = write_trace(path, layout, **flags)
    r = load_routing(path)
    sel, w, cand = expected_topk(logits)
    assert r.sel.shape == (len(seq), len(LAYERS), K)
    assert (r.seq == seq).all() and (r.pos == pos).all()
    assert (r.sel == sel).all()
    np.testing.assert_allclose(r.w, w, rtol=2e-6, atol=1e-6)
    M_stored = E if layout == "dense" else M
    assert (r.cand == cand[:, :, :M_stored]).all()
    assert r.phase.tolist() == [0 if p == "prefill" else 1 for p in phase]
    if flags["domain"]:
        assert r.domain_names == DOMAINS
        assert [r.domain_names[d] for d in r.domain] == dom.tolist()
    else:
        assert (r.domain == -1).all()
    if flags["token"]:
        assert (r.token == tok).all()
    else:
        assert r.token is None
    assert r.meta.layout == layout and r.meta.n_layers == len(LAYERS)
    assert len(r.digest) == 32


@pytest.mark.parametrize("layout", ["dense", "sparse"])
def test_row_groups_and_shuffled_rows_decode_the_same(tmp_path, layout):
    one = tmp_path / "one.parquet"
    many = tmp_path / "many.parquet"
    shuffled = tmp_path / "shuffled.parquet"
    write_trace(one, layout, domain=True, token=True)
    write_trace(many, layout, domain=True, token=True, row_group_size=4)
    write_trace(shuffled, layout, domain=True, token=True, row_group_size=5, shuffle=True)
    assert pq.ParquetFile(one).num_row_groups == 1
    assert pq.ParquetFile(many).num_row_groups >= 10
    assert pq.ParquetFile(shuffled).num_row_groups >= 10
    base = load_routing(one)
    for p in (many, shuffled):
        r = load_routing(p)
        for name in ("seq", "pos", "phase", "domain", "token", "sel", "w", "cand"):
            assert np.array_equal(getattr(r, name), getattr(base, name)), name
    # the shuffled file really holds the rows out of (seq, pos, layer) order
    table = pq.read_table(shuffled, columns=["seq", "pos", "layer"])
    as_tuples = list(zip(*(table.column(c).to_pylist() for c in ("seq", "pos", "layer"))))
    assert as_tuples != sorted(as_tuples)


def test_candidates_option_keeps_best_m(tmp_path):
    path = tmp_path / "t.parquet"
    _, _, _, _, _, logits = write_trace(path, "sparse")
    r = load_routing(path, candidates=4)
    _, _, cand = expected_topk(logits)
    assert r.cand.shape[2] == 4 and (r.cand == cand[:, :, :4]).all()
    with pytest.raises(MoesimError, match="between k=3"):
        load_routing(path, candidates=2)


def test_info_and_expert_counts(tmp_path):
    path = tmp_path / "t.parquet"
    seq, pos, phase, dom, _, logits = write_trace(path, "sparse", domain=True, row_group_size=7)
    d = trace_info(path)
    assert d["tokens"] == len(seq) and d["sequences"] == 3 and d["moe_layers"] == 3
    assert d["phases"] == {"prefill": int((phase == "prefill").sum()), "decode": int((phase == "decode").sum())}
    assert d["domains"] == {n: int((dom == n).sum()) for n in DOMAINS}
    assert d["layout"] == "sparse" and d["candidates_per_row"] == M and d["scores_checked"] is False
    sel, _, _ = expected_topk(logits)
    want = np.zeros((len(LAYERS), E), dtype=np.int64)
    for l in range(len(LAYERS)):
        np.add.at(want[l], sel[:, l].reshape(-1), 1)
    assert (expert_counts(path) == want).all()
    assert (expert_counts(load_routing(path)) == want).all()
    assert validate_trace(path)["tokens"] == len(seq)


class _Spy:
    """Records every batch the reader streams (its columns and rows); whole-file reads fail."""

    def __init__(self, monkeypatch):
        self.calls = []
        orig = pq.ParquetFile.iter_batches
        spy = self

        def iter_batches(pf, *a, columns=None, **kw):
            for b in orig(pf, *a, columns=columns, **kw):
                spy.calls.append((tuple(columns or ()), b.num_rows))
                yield b

        def refuse(*a, **kw):
            raise AssertionError("the reader must not read a whole file or row group at once")

        monkeypatch.setattr(pq.ParquetFile, "iter_batches", iter_batches)
        monkeypatch.setattr(pq.ParquetFile, "read", refuse)
        monkeypatch.setattr(pq.ParquetFile, "read_row_group", refuse)
        monkeypatch.setattr(pq.ParquetFile, "read_row_groups", refuse)
        monkeypatch.setattr(pq, "read_table", refuse)


@pytest.mark.parametrize("layout", ["dense", "sparse"])
@pytest.mark.parametrize("row_group_size", [8, 100000])
def test_decoding_streams_in_bounded_batches(tmp_path, monkeypatch, layout, row_group_size):
    """Score columns are read a batch at a time, never a whole column of the file, even when
    the file is one big row group."""
    path = tmp_path / "t.parquet"
    write_trace(path, layout, selected=True, weights=True, row_group_size=row_group_size)
    rows = pq.ParquetFile(path).metadata.num_rows
    spy = _Spy(monkeypatch)
    tf = TraceFile(path)
    tf.batch_rows = 10
    r = load_routing(tf)
    score_cols = {"logits", "top_ids", "top_logits", "lse", "selected", "weights"}
    score_reads = [n for c, n in spy.calls if score_cols & set(c)]
    assert max(score_reads) <= 10 and len(score_reads) >= rows // 10
    assert sum(score_reads) == rows
    spy.calls.clear()
    validate_trace(tf)
    assert max(n for _, n in spy.calls) <= 10
    write_trace(tmp_path / "ref.parquet", layout, selected=True, weights=True)
    monkeypatch.undo()
    ref = load_routing(tmp_path / "ref.parquet")
    assert (r.sel == ref.sel).all() and (r.w == ref.w).all() and (r.cand == ref.cand).all()


def test_info_reads_no_score_column(tmp_path, monkeypatch):
    path = tmp_path / "t.parquet"
    write_trace(path, "dense", selected=True, weights=True, row_group_size=8)
    spy = _Spy(monkeypatch)
    tf = TraceFile(path)
    tf.batch_rows = 10
    trace_info(tf)
    read = {c for cols, _ in spy.calls for c in cols}
    assert read <= {"seq", "pos", "layer", "phase", "domain", "token"}
    assert max(n for _, n in spy.calls) <= 10


def test_writer_publishes_atomically(tmp_path):
    path = tmp_path / "t.parquet"
    meta = TraceMeta(model_id="m", family="f", n_experts=4, top_k=2, moe_layers=(0,), layout="dense")
    with pytest.raises(RuntimeError):
        with TraceWriter(path, meta) as w:
            w.write(seq=[0], pos=[0], layer=0, logits=np.zeros((1, 4)))
            raise RuntimeError("tracer crashed")
    assert not path.exists() and not list(tmp_path.iterdir())
    with pytest.raises(MoesimError, match="no rows"):
        with TraceWriter(path, meta):
            pass
    assert not path.exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize("kw, msg", [
    (dict(layer=2), "not one of the MoE layers"),
    (dict(logits=np.full((2, 4), np.nan)), "NaN"),
    (dict(seq=[0, 1, 2]), "values for 3 rows"),
    (dict(selected=[[0, 1], [1, 2]]), "does not store"),
    (dict(phase="warmup"), "unknown phase"),
])
def test_writer_rejects_bad_rows(tmp_path, kw, msg):
    meta = TraceMeta(model_id="m", family="f", n_experts=4, top_k=2, moe_layers=(0,), layout="dense")
    args = dict(seq=[0, 0], pos=[0, 1], layer=0, logits=np.zeros((2, 4)))
    args.update(kw)
    w = TraceWriter(tmp_path / "t.parquet", meta)
    with pytest.raises(MoesimError, match=msg):
        w.write(**args)
    w.abort()


def test_writer_rejects_out_of_range_ids(tmp_path):
    meta = TraceMeta(model_id="m", family="f", n_experts=4, top_k=2, moe_layers=(0,), layout="sparse",
                     n_candidates=2)
    w = TraceWriter(tmp_path / "t.parquet", meta)
    with pytest.raises(MoesimError, match="outside 0..3"):
        w.write(seq=[0], pos=[0], layer=0, top_ids=[[0, 4]], top_logits=[[1.0, 0.0]], lse=2.0)
    w.abort()


def test_meta_json_round_trip_and_numpy_ints():
    meta = TraceMeta(model_id="m", family="deepseek_v3", n_experts=np.int64(8), top_k=np.int32(2),
                     moe_layers=np.arange(3, 6), gating="sigmoid", layout="dense", n_group=4, topk_group=2,
                     selection_bias=np.zeros((3, 8)), bytes_per_expert={"bf16": 1000}, routed_scaling_factor=2.5)
    back = TraceMeta.from_json(meta.to_json())
    assert back == meta and back.n_experts == 8 and type(back.n_experts) is int and back.moe_layers == (3, 4, 5)
    with pytest.raises(MoesimError, match="integer"):
        TraceMeta(model_id="m", family="f", n_experts=8, top_k=2.5, moe_layers=(0,))
    with pytest.raises(MoesimError, match="true or false"):
        TraceMeta(model_id="m", family="f", n_experts=8, top_k=2, moe_layers=(0,), synthetic="yes")


def test_trace_file_columns(tmp_path):
    path = tmp_path / "t.parquet"
    write_trace(path, "sparse", token=True, selected=True)
    tf = TraceFile(path)
    assert tf.columns[:4] == ["seq", "pos", "layer", "phase"]
    assert {"top_ids", "top_logits", "lse", "token", "selected"} <= set(tf.columns)
