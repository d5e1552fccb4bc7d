"""Ranked traces of schema version 2 (move-to-front ids, only the gate scores), which moesim no longer
writes, still read exactly: tests/fixtures/ranked_v2/ holds small ones written by the version-2 writer
and the arrays its decoder gave (tests/fixtures/make_ranked_v2.py); the pure-numpy legacy reader
(traces/ranked_v2.py) gives the same, streamed or not, and finds damaged codes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import FIXTURES
from replay_helpers import seeded_rng

from moesim.errors import MoesimError
from moesim.traces import TraceFile, load_routing
from moesim.traces.compact import compact_trace
from moesim.traces.ranked_v2 import move_to_front_decode
from moesim.traces.routing import expert_counts, validate_trace
from moesim.traces.stream import DecodedStore

V2 = FIXTURES / "ranked_v2"
NAMES = ["gen1_gaps", "qwen3next_lookahead", "deepseek_weights", "logits_selected", "wide_gaps"]


@pytest.fixture(scope="module")
def expected():
    with np.load(V2 / "expected.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("name", NAMES)
def test_v2_files_decode_as_the_v2_decoder_did(name, expected):
    tf = TraceFile(V2 / f"{name}.parquet")
    assert tf.meta.layout == "ranked" and tf.meta.schema_version == 2 and not tf.meta.has_scores
    r = load_routing(tf)
    for a in ("sel", "w", "cand", "seq", "pos", "phase", "domain", "lookahead", "token"):
        want = expected.get(f"{name}.{a}")
        got = getattr(r, a)
        if want is None:
            assert got is None, a
        else:
            assert got.dtype == want.dtype and np.array_equal(got, want), a
    assert r.logits is None and not r.has_scores
    validate_trace(tf)
    np.testing.assert_array_equal(expert_counts(tf), r.request_counts())


@pytest.mark.parametrize("name", ["gen1_gaps", "qwen3next_lookahead", "wide_gaps"])
def test_v2_files_stream_like_they_decode(name, expected, tmp_path):
    """Streamed a row group at a time (the move-to-front state restarts at each; wide_gaps has 5)."""
    with DecodedStore.from_file(V2 / f"{name}.parquet", tmp_path / "s", chunk_tokens=2, logits=True) as store:
        assert not store.has_scores
        got = {a: [] for a in ("sel", "w", "cand")}
        for c in store.chunks(3):
            for a in got:
                got[a].append(c.__dict__[a].copy())
        for a, parts in got.items():
            np.testing.assert_array_equal(np.concatenate(parts), expected[f"{name}.{a}"])
        with pytest.raises(MoesimError, match="no candidate scores"):
            next(store.chunks(3, what=("logits",)))


def test_v2_is_read_only(tmp_path):
    """Nothing writes version 2; compact refuses it (it is read as it is)."""
    with pytest.raises(MoesimError, match="schema version 2"):
        compact_trace(V2 / "gen1_gaps.parquet", tmp_path / "c.parquet")


@pytest.mark.parametrize("E", [1, 2, 7, 64, 300])
def test_move_to_front_decode_matches_a_list_reference(E):
    """The wave-vectorized decoder against plain list move-to-front, layers interleaved in any order."""
    with seeded_rng("mtf-v2", E) as rng:
        L, n, m = 3, 120, min(E, 5)
        layer = rng.integers(0, L, n)
        lists = [list(range(E)) for _ in range(L)]
        codes, want = np.zeros((n, m), np.int64), np.zeros((n, m), np.int64)
        for i in range(n):
            row = rng.permutation(E)[:m] if rng.random() < 0.5 else np.array(lists[layer[i]][:m])[::-1]
            lst = lists[layer[i]]
            codes[i] = [lst.index(e) for e in row]
            want[i] = row
            lists[layer[i]] = list(row) + [e for e in lst if e not in set(row.tolist())]
        state = np.tile(np.arange(E, dtype=np.int64), (L, 1))
        got, good = move_to_front_decode(codes, layer, state)
        assert good == n
        np.testing.assert_array_equal(got, want)
        assert state.tolist() == lists


def test_damaged_v2_codes_are_errors(tmp_path):
    t = pq.read_table(V2 / "gen1_gaps.parquet")
    col = t.column("ranked_ids")
    rows = [col[i].as_py() for i in range(len(col))]
    for bad in (bytes([rows[5][1]]) + rows[5][1:], bytes([200]) + rows[5][1:]):  # a repeated code; one >= E
        rows2 = rows[:5] + [bad] + rows[6:]
        arr = pa.array(rows2, col.type)
        i = t.schema.get_field_index("ranked_ids")
        pq.write_table(t.set_column(i, t.schema.field(i), arr), tmp_path / "bad.parquet")
        with pytest.raises(MoesimError, match="ranked_ids row 5"):
            validate_trace(tmp_path / "bad.parquet")
