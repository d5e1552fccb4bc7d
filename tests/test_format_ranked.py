"""The compact ranked layout (schema version 2): the same routing in the old and the new encoding
decodes to the same arrays and replays to identical counters, seconds and decisions, for policies
that read the candidates (substitution) and the weights (threshold); the move-to-front state is
per row group; damaged codes are caught; v1 traces are read as before."""

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

ARRAYS = ("sel", "w", "cand", "seq", "pos", "phase", "domain")
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
    compact_trace: same arrays, same counters (E = 512 uses two-byte codes; DeepSeek-V3 stores
    selected and weights; the others gate gaps)."""
    sparse = synthesize(preset, 120, seqs=3, seed=11, path=tmp_path / "s.parquet", layout="sparse")
    ranked = synthesize(preset, 120, seqs=3, seed=11, path=tmp_path / "r.parquet")
    converted = compact_trace(sparse, tmp_path / "c.parquet", row_group_size=1000)
    a, b, c = (load_routing(p) for p in (sparse, ranked, converted))
    assert TraceFile(ranked).meta.layout == TraceFile(converted).meta.layout == "ranked"
    assert_same_routing(a, b)
    assert_same_routing(a, c)
    assert_same_replays(a, c, budget=0.125)
    assert ranked.stat().st_size < 0.75 * sparse.stat().st_size


def test_shipped_trace_equals_its_sparse_twin(shipped_trace, tmp_path):
    """The shipped (ranked) trace and its recorded command with --layout sparse: the same routing."""
    sparse = synthesize("qwen3-next-80b-a3b", 2000, seqs=4, seed=0, path=tmp_path / "s.parquet", layout="sparse")
    a, b = load_routing(sparse), load_routing(shipped_trace)
    assert_same_routing(a, b)
    assert_same_replays(a, b, budget=0.25)
    assert_same_routing(a, load_routing(compact_trace(sparse, tmp_path / "c.parquet")))


@pytest.mark.parametrize("kind", ["logits", "selected", "weights", "dense"])
def test_real_valued_logits_convert_exactly(tmp_path, kind):
    """Arbitrary float32 logits (no grid) go as float32 gate logits; a selected column as selected +
    the selected experts' logits; stored weights stay weights."""
    layout = "dense" if kind == "dense" else "sparse"
    src = tmp_path / "v1.parquet"
    write_trace(src, layout, domain=True, token=True, selected=kind in ("selected", "weights"),
                weights=kind == "weights", row_group_size=17, shuffle=True)
    out = compact_trace(src, tmp_path / "c.parquet", row_group_size=13)
    tf = TraceFile(out)
    assert tf.meta.logit_scale is None and tf.meta.schema_version == 2
    assert ("gate_logits" in tf.columns) == (kind != "weights")
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
    assert_same_routing(load_routing(src), load_routing(out))


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


@pytest.mark.parametrize("E,M", [(9, 9), (40, 7), (64, 64), (65, 20), (128, 32), (300, 12)])
def test_move_to_front_round_trip_across_row_groups_and_batches(tmp_path, monkeypatch, E, M):
    """Random ranked lists (some rows repeat the last one of their layer), small row groups, and
    batches smaller than a row group: the state restarts per row group and carries across batches."""
    with seeded_rng("mtf", E, M) as rng:
        L, n = 3, 201
        ids = np.array([rng.permutation(E)[:M] for _ in range(n)])
        for i in rng.choice(np.arange(L, n), 40, replace=False):
            ids[i] = ids[i - L]
        logits = -np.sort(rng.integers(0, 50, size=(n, 2)), axis=1).astype(np.float32)
        meta = _ranked_meta(E, M, L)
        with TraceWriter(tmp_path / "t.parquet", meta, row_group_size=23) as w:
            for part in np.array_split(np.arange(n), 7):
                w.write(seq=np.zeros(len(part), int), pos=part // L, layer=part % L, ranked_ids=ids[part],
                        gate_logits=logits[part])
        tf = TraceFile(tmp_path / "t.parquet")
        assert tf.num_row_groups == -(-n // 23)
        monkeypatch.setattr(TraceFile, "batch_rows", 5)
        r = load_routing(tf)
        np.testing.assert_array_equal(r.cand.reshape(n, M), ids)
        np.testing.assert_array_equal(np.sort(r.sel.reshape(n, 2), axis=1), np.sort(ids[:, :2], axis=1))


@pytest.mark.parametrize("dtype", [np.int16, np.uint8])
def test_ids_are_coded_as_written_with_the_row_of_a_bad_one(tmp_path, dtype):
    """The writer codes ids as they arrive (int16, the generators' type, as given; others as int32): a
    file written in batches that straddle row groups equals the one written at once, and a repeated id
    in a later batch is reported with its row in the file."""
    E, M, L, n = 40, 6, 3, 60
    with seeded_rng("mtf-batches", np.dtype(dtype).name) as rng:
        ids = np.array([rng.permutation(E)[:M] for _ in range(n)], dtype=dtype)
        logits = -np.sort(rng.integers(0, 50, size=(n, 2)), axis=1).astype(np.float32)
    meta = _ranked_meta(E, M, L)
    rows = np.arange(n)

    def write(path, parts, bad_row=None):
        with TraceWriter(path, meta, row_group_size=16) as w:
            for part in parts:
                x = ids[part].copy()
                if bad_row is not None and bad_row in part:
                    x[list(part).index(bad_row), 1] = x[list(part).index(bad_row), 0]
                w.write(seq=np.zeros(len(part), int), pos=part // L, layer=part % L, ranked_ids=x,
                        gate_logits=logits[part])
        return path.read_bytes()

    once = write(tmp_path / "once.parquet", [rows])
    assert write(tmp_path / "parts.parquet", np.array_split(rows, 9)) == once
    with pytest.raises(MoesimError, match=r"repeats an expert .* \(row 41\)"):
        write(tmp_path / "bad.parquet", np.array_split(rows, 9), bad_row=41)
    assert not (tmp_path / "bad.parquet").exists()


@pytest.mark.parametrize("E", [1, 2, 63, 64, 65, 127, 128, 129, 200])
def test_move_to_front_codes_match_a_list_reference(E):
    """The encoder's two paths (a popcount of position bits up to 128 experts, a list walk above) give the
    codes and the final state of plain list move-to-front, rows of any length, layers interleaved."""
    from moesim.traces import ranked as rk

    with seeded_rng("mtf-ref", E) as rng:
        L, n = 3, 150
        rows = []
        for _ in range(n):  # sticky: mostly the popular experts, some fully random rows
            m = int(rng.integers(1, E + 1))
            score = rng.gumbel(size=E) + (np.linspace(4, 0, E) if rng.random() < 0.7 else 0)
            rows.append(np.argsort(-score)[:m])
        lists = [list(range(E)) for _ in range(L)]
        want = []
        for i, row in enumerate(rows):
            lst = lists[i % L]
            want.append([lst.index(e) for e in row])
            lists[i % L] = list(row) + [e for e in lst if e not in set(row.tolist())]
        where = rk.new_state(L, E)[1]
        for i, row in enumerate(rows):  # one row per call: rows differ in length
            codes, bad = rk.codec().encode(row[None, :].astype(np.int32), np.array([i % L], np.int32), where, L)
            assert bad == 1 and codes[0].tolist() == want[i], f"row {i}"
        for lay in range(L):
            assert [int(np.nonzero(where[lay] == p)[0][0]) for p in range(E)] == lists[lay]


def test_damaged_codes_and_bad_rows_are_errors(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    meta = _ranked_meta(8, 4)
    with pytest.raises(MoesimError, match="repeats an expert"):
        with TraceWriter(tmp_path / "x.parquet", meta) as w:
            w.write(seq=[0, 0, 0], pos=[0, 0, 0], layer=[0, 1, 2],
                    ranked_ids=[[0, 1, 2, 3], [1, 1, 2, 3], [0, 1, 2, 3]], gate_logits=np.zeros((3, 2)))
    assert not (tmp_path / "x.parquet").exists()
    with TraceWriter(tmp_path / "t.parquet", meta) as w:
        w.write(seq=[0, 0, 0], pos=[0, 0, 0], layer=[0, 1, 2], ranked_ids=[[0, 1, 2, 3]] * 3,
                gate_logits=np.zeros((3, 2)))
    t = pq.read_table(tmp_path / "t.parquet")
    raw = bytearray(t.column("ranked_ids")[1].as_py())
    for bad in (bytes([0, 0, 1, 2]), bytes([9, 1, 2, 3])):  # a repeated code; a code >= E
        raw[:] = bad
        col = pa.array([t.column("ranked_ids")[0].as_py(), bytes(raw), t.column("ranked_ids")[2].as_py()],
                       pa.binary(4))
        pq.write_table(t.set_column(t.schema.get_field_index("ranked_ids"), t.schema.field("ranked_ids"), col),
                       tmp_path / "bad.parquet")
        with pytest.raises(MoesimError, match="ranked_ids row 1"):
            validate_trace(tmp_path / "bad.parquet")


def test_metadata_rules(tmp_path):
    with pytest.raises(MoesimError, match="power of two"):
        _ranked_meta(8, 4, logit_scale=0.1)
    with pytest.raises(MoesimError, match="only goes with the ranked layout"):
        TraceMeta(model_id="t", family="f", n_experts=8, top_k=2, moe_layers=(0,), n_candidates=4, logit_scale=0.5)
    m = _ranked_meta(8, 4)
    assert m.schema_version == 2 and "logit_scale" not in m.to_json()
    assert TraceMeta.from_json(m.to_json()) == m
    v1 = dataclasses.replace(m, layout="sparse", schema_version=1)
    assert '"schema_version": 1' in v1.to_json() and "logit_scale" not in v1.to_json()


def test_gaps_wider_than_a_byte(tmp_path):
    """Grid logits whose gaps pass 255 grid units (the high bytes go to gate_gaps_high, null in the
    other rows) convert exactly."""
    with seeded_rng("wide gaps") as rng:
        E, M, L, n_tok = 12, 6, 2, 40
        meta = TraceMeta(model_id="t/m", family="qwen3_moe", n_experts=E, top_k=3, moe_layers=(0, 1),
                         n_candidates=M)
        q = rng.integers(-300, 300, size=(n_tok * L, E))
        q[::7, 3] += 5000  # a dominant expert: first gap of thousands of grid units
        logits = q / 32.0
        ids = np.argsort(-logits, axis=1, kind="stable")[:, :M]
        with TraceWriter(tmp_path / "s.parquet", meta) as w:
            w.write(seq=np.zeros(n_tok * L, int), pos=np.repeat(np.arange(n_tok), L), layer=np.tile([0, 1], n_tok),
                    top_ids=ids, top_logits=np.take_along_axis(logits, ids, axis=1),
                    lse=np.log(np.exp(logits - logits.max(axis=1, keepdims=True)).sum(axis=1)) + logits.max(axis=1))
    out = compact_trace(tmp_path / "s.parquet", tmp_path / "c.parquet")
    tf = TraceFile(out)
    assert tf.meta.logit_scale == 1 / 32
    high = tf._pf.read(columns=["gate_gaps_high"]).column(0)
    assert 0 < high.null_count < len(high)
    assert_same_routing(load_routing(tmp_path / "s.parquet"), load_routing(out))


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
        for rows, ranked, s, w in _decoded_batches(t, lay):
            for i, r in enumerate(range(rows.start, rows.stop)):
                full[r] = (ranked[i].tolist(), s[i].tolist(), w[i].tolist())
        monkeypatch.setattr(TraceFile, "batch_rows", 97)
        groups = list(range(t.num_row_groups))[1::2] or [0]
        seen = 0
        for rows, ranked, s, w in _decoded_batches(t, lay, row_groups=groups):
            for i, r in enumerate(range(rows.start, rows.stop)):
                assert full[r] == (ranked[i].tolist(), s[i].tolist(), w[i].tolist())
                seen += 1
        assert seen == sum(t._pf.metadata.row_group(g).num_rows for g in groups) > 0
        monkeypatch.undo()
