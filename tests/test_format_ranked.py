"""The compact ranked layout (schema version 3): the same routing in the sparse, dense and ranked
encodings decodes to the same arrays, the candidates' logits included, bit for bit, and replays to
identical counters, seconds and decisions, for policies that read the candidates (substitution) and the
weights (threshold); the writer and the reader check ids and rank order; v1 traces are read as before
(version 2: tests/test_format_ranked_v2.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from replay_helpers import seeded_rng
from test_format_roundtrip import write_trace

from moesim.costmodel.timing import cost_params
from moesim.errors import MoesimError
from moesim.simulator import SimConfig, simulate
from moesim.traces import TraceFile, TraceMeta, TraceWriter, load_routing
from moesim.traces.compact import compact_trace
from moesim.traces.routing import validate_trace
from moesim.traces.synthetic import synthesize

ARRAYS = ("sel", "w", "cand", "logits", "seq", "pos", "phase", "domain")
# every miss policy that reads candidates or weights, evictions of each kind, background admission
CONFIGS = [
    dict(eviction="lru", miss="fetch-all"), dict(eviction="lfu", miss="threshold:0.15"),
    dict(eviction="freq", miss="threshold:0.15", admit=0.5), dict(eviction="fifo", miss="substitute"),
    dict(eviction="belady", miss="first-choice"), dict(eviction="lru", miss="substitute", warm=True),
    dict(eviction="static", miss="drop"), dict(eviction="freq", miss="cpu"),
    dict(eviction="lru", miss="threshold:0.3", batch=2),
]


def assert_same_routing(a, b):
    for name in ARRAYS:
        x, y = getattr(a, name), getattr(b, name)
        if x is None or y is None:
            assert x is None and y is None, name
            continue
        assert x.dtype == y.dtype and np.array_equal(x, y), name
    assert a.domain_names == b.domain_names


def assert_same_replays(a, b, budget):
    cost = cost_params("qwen3-30b-a3b", "q4_k_m", "rtx3090-pcie4")
    for cfg in CONFIGS:
        for c in (None, cost):
            ra = simulate(a, SimConfig(budget=budget, **cfg), cost=c, record=True)
            rb = simulate(b, SimConfig(budget=budget, **cfg), cost=c, record=True)
            for field in ("counts", "mass", "token_counts", "token_mass", "token_seconds", "token_stall"):
                x, y = getattr(ra, field), getattr(rb, field)
                assert np.array_equal(x, y), (cfg, c is not None, field)
            assert np.array_equal(ra.decisions.outcome, rb.decisions.outcome), cfg
            assert np.array_equal(ra.decisions.substitute, rb.decisions.substitute), cfg


@pytest.mark.parametrize("preset", ["qwen3-30b-a3b", "qwen3-next-80b-a3b", "deepseek-v3", "gpt-oss-120b"])
def test_synthetic_sparse_and_ranked_replay_identically(tmp_path, preset):
    """synth's full sparse layout, its default ranked layout, and the sparse file converted by
    compact_trace: same arrays, same counters (E = 512 uses two-byte ids; DeepSeek-V3 stores
    selected and weights)."""
    sparse = synthesize(preset, 120, seqs=3, seed=11, path=tmp_path / "s.parquet", layout="sparse")
    ranked = synthesize(preset, 120, seqs=3, seed=11, path=tmp_path / "r.parquet")
    converted = compact_trace(sparse, tmp_path / "c.parquet", row_group_size=1000)
    a, b, c = (load_routing(p) for p in (sparse, ranked, converted))
    assert TraceFile(ranked).meta.layout == TraceFile(converted).meta.layout == "ranked"
    assert_same_routing(a, b)
    assert_same_routing(a, c)
    assert_same_replays(a, c, budget=0.125)
    assert a.logits is not None
    assert ranked.stat().st_size < 0.95 * sparse.stat().st_size


def test_shipped_trace_equals_its_sparse_twin(shipped_trace, tmp_path):
    """The shipped (ranked) trace and its recorded command with --layout sparse: the same routing."""
    sparse = synthesize("qwen3-next-80b-a3b", 2000, seqs=4, seed=0, path=tmp_path / "s.parquet", layout="sparse")
    a, b = load_routing(sparse), load_routing(shipped_trace)
    assert_same_routing(a, b)
    assert_same_replays(a, b, budget=0.25)
    assert_same_routing(a, load_routing(compact_trace(sparse, tmp_path / "c.parquet")))


@pytest.mark.parametrize("kind", ["logits", "selected", "weights", "dense"])
def test_real_valued_logits_convert_exactly(tmp_path, kind):
    """Arbitrary float32 logits; a selected column stays (the decode looks the selected experts' logits
    up among the candidates); stored weights stay weights."""
    layout = "dense" if kind == "dense" else "sparse"
    src = tmp_path / "v1.parquet"
    write_trace(src, layout, domain=True, token=True, selected=kind in ("selected", "weights"),
                weights=kind == "weights", row_group_size=17, shuffle=True)
    out = compact_trace(src, tmp_path / "c.parquet", row_group_size=13)
    tf = TraceFile(out)
    assert tf.meta.schema_version == 3 and tf.meta.has_scores and "ranked_logits" in tf.columns
    assert ("selected" in tf.columns) == (kind in ("selected", "weights"))
    a, b = load_routing(src), load_routing(out)
    assert_same_routing(a, b)
    np.testing.assert_array_equal(a.token, b.token)
    assert_same_replays(a, b, budget=0.25)


def test_rank_order_imports_keep_their_stored_order(tmp_path):
    """Selected-only sources (tie_order stored, 1/k weights) keep the router's order."""
    from conftest import FIXTURES

    from moesim.traces.importers.fiddler import import_fiddler

    src = import_fiddler([FIXTURES / "fiddler_passes.json"], tmp_path / "f.parquet").path
    out = compact_trace(src, tmp_path / "c.parquet")
    assert TraceFile(out).meta.tie_order == "stored"
    assert not TraceFile(src).meta.has_scores and not TraceFile(out).meta.has_scores
    a, b = load_routing(src), load_routing(out)
    assert a.logits is None and not b.has_scores  # placeholder scores: no candidate scores
    assert_same_routing(a, b)


def test_old_selected_only_imports_are_found_by_their_placeholder_scores(tmp_path):
    """A selected-only import written before the ``scores`` field (tie order stored, all scores equal)
    decodes without logits, and compact marks its output ``scores: false``."""
    from conftest import FIXTURES

    from moesim.traces.importers.fiddler import import_fiddler

    src = import_fiddler([FIXTURES / "fiddler_passes.json"], tmp_path / "f.parquet").path
    tf = TraceFile(src)
    old = tmp_path / "old.parquet"
    import pyarrow.parquet as pq

    t = pq.read_table(src)
    meta = tf.meta.replace(scores=True)  # as written before the field existed
    pq.write_table(t.replace_schema_metadata({b"moesim": meta.to_json().encode()}), old)
    assert TraceFile(old).meta.has_scores
    assert load_routing(old).logits is None
    assert not TraceFile(compact_trace(old, tmp_path / "c.parquet")).meta.scores


def test_real_flame_routing_converts_exactly(flame_dir, tmp_path):
    from moesim.traces.importers.flame import import_flame

    src = tmp_path / "flame.parquet"
    import_flame(flame_dir, src, layout="prefill")
    out = compact_trace(src, tmp_path / "c.parquet")
    a, b = load_routing(src), load_routing(out)
    assert_same_routing(a, b)
    assert_same_replays(a, b, budget=0.25)


def _ranked_meta(E, M, L=3, k=2, **kw):
    return TraceMeta(model_id="t/m", family="qwen3_moe", n_experts=E, top_k=k, moe_layers=tuple(range(L)),
                     layout="ranked", n_candidates=M, **kw)


def _ranked_rows(rng, n, E, M):
    """Random ranked rows: M distinct ids, logits descending, equal logits lower id first."""
    ids = np.array([rng.permutation(E)[:M] for _ in range(n)])
    x = rng.integers(-40, 40, size=(n, M)).astype(np.float32) / 4  # coarse: ties happen
    order = np.lexsort((ids, -x), axis=1)
    return np.take_along_axis(ids, order, axis=1), np.take_along_axis(x, order, axis=1)


@pytest.mark.parametrize("E,M", [(9, 9), (40, 7), (256, 20), (257, 12), (600, 30)])
def test_round_trip_across_row_groups_and_batches(tmp_path, monkeypatch, E, M):
    """Ranked ids (one byte up to 256 experts, two above) and logits round trip through small row groups and
    batches smaller than a row group; the file does not depend on how the rows were split into writes."""
    with seeded_rng("ranked v3", E, M) as rng:
        L, n = 3, 201
        ids, x = _ranked_rows(rng, n, E, M)
    meta = _ranked_meta(E, M, L)

    def write(path, parts):
        with TraceWriter(path, meta, row_group_size=23) as w:
            for part in parts:
                w.write(seq=np.zeros(len(part), int), pos=part // L, layer=part % L, ranked_ids=ids[part],
                        ranked_logits=x[part])
        return path.read_bytes()

    rows = np.arange(n)
    assert write(tmp_path / "t.parquet", np.array_split(rows, 7)) == write(tmp_path / "once.parquet", [rows])
    tf = TraceFile(tmp_path / "t.parquet")
    assert tf.num_row_groups == -(-n // 23)
    monkeypatch.setattr(TraceFile, "batch_rows", 5)
    r = load_routing(tf)
    np.testing.assert_array_equal(r.cand.reshape(n, M), ids)
    np.testing.assert_array_equal(r.logits.reshape(n, M), x)
    np.testing.assert_array_equal(r.sel.reshape(n, 2), ids[:, :2])  # ties rank by weight, then id: as cand
    w = np.exp(x[:, :2].astype(np.float64) - x[:, :1])
    np.testing.assert_array_equal(r.w.reshape(n, 2), (w / w.sum(axis=1, keepdims=True)).astype(np.float32))


@pytest.mark.parametrize("gating,bias", [("softmax", False), ("softmax_topk", False), ("sigmoid", False),
                                         ("sigmoid", True)])
def test_logits_equal_across_dense_sparse_and_ranked(tmp_path, gating, bias):
    """The same router logits as a dense trace, a sparse one with all E candidates, a sparse one with the M
    best, and each compacted: Routing.logits (and cand, sel, w) equal bit for bit, the M best a prefix of
    the E; sigmoid gating ranks by sigmoid + selection bias and keeps the exact logits."""
    E, k, M, L, T = 12, 3, 5, 2, 30
    with seeded_rng("logits across layouts", gating, bias) as rng:
        logits = (rng.normal(size=(T * L, E)) * 3).astype(np.float32)
        logits[::4, 3] = logits[::4, 7]  # some ties
        sel_bias = rng.normal(size=(L, E)).round(2).tolist() if bias else None
    kw = dict(model_id="t/m", family="custom", n_experts=E, top_k=k, moe_layers=(0, 1), gating=gating,
              selection_bias=sel_bias)
    layer = np.tile([0, 1], T)
    seq, pos = np.zeros(T * L, int), np.repeat(np.arange(T), L)
    files = {}
    with TraceWriter(tmp_path / "d.parquet", TraceMeta(layout="dense", **kw)) as w:
        w.write(seq=seq, pos=pos, layer=layer, logits=logits)
    files["dense"] = tmp_path / "d.parquet"
    score = logits.astype(np.float64)
    if gating == "sigmoid":
        score = 0.5 * (np.tanh(0.5 * score) + 1) + (np.asarray(sel_bias)[layer] if bias else 0)
    for m in (E, M):
        order = np.lexsort((np.broadcast_to(np.arange(E), score.shape), -score), axis=1)[:, :m][:, ::-1]
        lse = np.log(np.exp(logits.astype(np.float64)).sum(axis=1))
        with TraceWriter(tmp_path / f"s{m}.parquet", TraceMeta(layout="sparse", n_candidates=m, **kw)) as w:
            w.write(seq=seq, pos=pos, layer=layer, top_ids=order, top_logits=np.take_along_axis(logits, order, 1),
                    lse=lse)
        files[f"sparse{m}"] = tmp_path / f"s{m}.parquet"
    for name in list(files):
        files[f"ranked from {name}"] = compact_trace(files[name], tmp_path / f"c-{name}.parquet")
    r = {name: load_routing(p) for name, p in files.items()}
    want = r["dense"]
    assert want.logits.shape == (T, L, E)
    ranked_by_hand = np.take_along_axis(logits, np.lexsort((np.broadcast_to(np.arange(E), score.shape), -score),
                                                           axis=1), 1)
    np.testing.assert_array_equal(want.logits.reshape(T * L, E), ranked_by_hand)
    for name, got in r.items():
        m = got.n_candidates
        for a in ("cand", "logits"):
            np.testing.assert_array_equal(getattr(got, a), getattr(want, a)[:, :, :m], err_msg=f"{name} {a}")
        for a in ("sel", "w"):
            np.testing.assert_array_equal(getattr(got, a), getattr(want, a), err_msg=f"{name} {a}")
        assert got.logits.dtype == np.float32


def test_writer_checks_ids_and_rank_order(tmp_path):
    meta = _ranked_meta(8, 4)
    x = np.tile(np.array([3.0, 2.0, 1.0, 0.0], np.float32), (3, 1))
    good = [[0, 1, 2, 3]] * 3
    cases = [([[0, 1, 2, 3], [1, 1, 2, 3], [0, 1, 2, 3]], x, r"repeats an expert .* \(row 1\)"),
             ([[0, 1, 2, 3], [0, 1, 2, 8], [0, 1, 2, 3]], x, r"outside 0..7 \(row 1\)"),
             (good, x[:, ::-1], r"not in rank order .* row 0"),
             ([[0, 1, 2, 3], [0, 1, 3, 2], [0, 1, 2, 3]], np.zeros((3, 4)), r"not in rank order .* row 1"),
             (good, np.where(np.eye(3, 4, dtype=bool), np.nan, x), "NaN")]
    for ids, logits, msg in cases:
        with pytest.raises(MoesimError, match=msg):
            with TraceWriter(tmp_path / "x.parquet", meta) as w:
                w.write(seq=[0, 0, 0], pos=[0, 0, 0], layer=[0, 1, 2], ranked_ids=ids, ranked_logits=logits)
        assert not (tmp_path / "x.parquet").exists()
    stored = _ranked_meta(8, 4, tie_order="stored")  # equal scores keep the stored order
    with TraceWriter(tmp_path / "s.parquet", stored) as w:
        w.write(seq=[0, 0, 0], pos=[0, 0, 0], layer=[0, 1, 2], ranked_ids=[[3, 1, 2, 0]] * 3,
                ranked_logits=np.zeros((3, 4)))
    assert load_routing(tmp_path / "s.parquet").cand[0, 0].tolist() == [3, 1, 2, 0]


def test_damaged_rows_are_errors(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    meta = _ranked_meta(8, 4)
    with TraceWriter(tmp_path / "t.parquet", meta) as w:
        w.write(seq=[0, 0, 0], pos=[0, 0, 0], layer=[0, 1, 2], ranked_ids=[[0, 1, 2, 3]] * 3,
                ranked_logits=np.tile(np.array([3.0, 2.0, 1.0, 0.0], np.float32), (3, 1)))
    t = pq.read_table(tmp_path / "t.parquet")
    cases = {"ranked_ids": [(bytes([0, 0, 1, 2]), "ranked_ids row 1"), (bytes([9, 1, 2, 3]), "ranked_ids row 1")],
             "ranked_logits": [(np.array([0, 1, 2, 3], "<f4").tobytes(), "ranked_logits row 1 is not in rank order"),
                               (np.array([np.inf, 1, 0, 0], "<f4").tobytes(), "NaN or infinite")]}
    for name, bads in cases.items():
        i = t.schema.get_field_index(name)
        for raw, msg in bads:
            col = pa.array([t.column(name)[0].as_py(), raw, t.column(name)[2].as_py()], t.schema.field(i).type)
            pq.write_table(t.set_column(i, t.schema.field(i), col), tmp_path / "bad.parquet")
            with pytest.raises(MoesimError, match=msg):
                validate_trace(tmp_path / "bad.parquet")


def test_metadata_rules(tmp_path):
    with pytest.raises(MoesimError, match="power of two"):
        _ranked_meta(8, 4, logit_scale=0.1, schema_version=2)
    with pytest.raises(MoesimError, match="schema version 2"):
        _ranked_meta(8, 4, logit_scale=0.5)  # gaps were version 2's; version 3 stores logits
    with pytest.raises(MoesimError, match="only goes with the ranked layout"):
        TraceMeta(model_id="t", family="f", n_experts=8, top_k=2, moe_layers=(0,), n_candidates=4, logit_scale=0.5)
    m = _ranked_meta(8, 4)
    assert m.schema_version == 3 and m.has_scores
    assert "logit_scale" not in m.to_json() and "scores" not in m.to_json()
    assert TraceMeta.from_json(m.to_json()) == m
    unscored = m.replace(scores=False)
    assert '"scores": false' in unscored.to_json() and not unscored.has_scores
    assert TraceMeta.from_json(unscored.to_json()) == unscored
    assert not _ranked_meta(8, 4, schema_version=2).has_scores
    v1 = dataclasses.replace(m, layout="sparse", schema_version=1)
    assert '"schema_version": 1' in v1.to_json() and "logit_scale" not in v1.to_json()
    with pytest.raises(MoesimError, match="read only"):
        TraceWriter(tmp_path / "v2.parquet", _ranked_meta(8, 4, schema_version=2))


@pytest.mark.parametrize("layout", ["ranked", "sparse"])
def test_row_groups_decode_on_their_own(tmp_path, monkeypatch, layout):
    """Any subset of row groups decodes to the same rows as the whole file (streamed replays read a
    trace a row group at a time), with batches smaller than a group."""
    from moesim.traces.routing import _decoded_batches

    path = synthesize("qwen3-30b-a3b", 60, seqs=2, seed=2, path=tmp_path / "t.parquet", layout=layout)
    tf = TraceFile(path)
    small = TraceFile(compact_trace(path, tmp_path / "c.parquet", row_group_size=500)) if layout == "sparse" \
        else TraceFile(synthesize("qwen3-30b-a3b", 60, seqs=2, seed=2, path=tmp_path / "r.parquet"))
    for t in (tf, small):
        lay = t.index_keys(t.read_keys()).target % t.meta.n_layers
        full = {}
        for rows, ranked, s, w, x in _decoded_batches(t, lay):
            for i, r in enumerate(range(rows.start, rows.stop)):
                full[r] = (ranked[i].tolist(), s[i].tolist(), w[i].tolist(), x[i].tolist())
        monkeypatch.setattr(TraceFile, "batch_rows", 97)
        groups = list(range(t.num_row_groups))[1::2] or [0]
        seen = 0
        for rows, ranked, s, w, x in _decoded_batches(t, lay, row_groups=groups):
            for i, r in enumerate(range(rows.start, rows.stop)):
                assert full[r] == (ranked[i].tolist(), s[i].tolist(), w[i].tolist(), x[i].tolist())
                seen += 1
        assert seen == sum(t._pf.metadata.row_group(g).num_rows for g in groups) > 0
        monkeypatch.undo()
