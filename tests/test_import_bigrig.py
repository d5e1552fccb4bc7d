"""`moesim import bigrig`: bigrig's *_full.npz traces (docs/importers.md, "bigrig")."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import FIXTURES
from import_checks import check_replays

from moesim.cli import cli
from moesim.traces import load_routing
from moesim.traces.importers.bigrig import import_bigrig, sequence_starts

sys.path.insert(0, str(FIXTURES))
from peer_formats import bigrig_idx_bytes, bigrig_logits_bytes  # noqa: E402

IDX = FIXTURES / "peers" / "bigrig_idx_full.npz"        # idx [3, 30, 4] (compressed), seq_bounds [0, 12, 30]
LOGITS = FIXTURES / "peers" / "bigrig_logits_full.npz"  # logits [3, 30, 16] float16 (stored), same bounds


def run(args):
    return CliRunner().invoke(cli, ["import", "bigrig", *map(str, args)])


def test_fixtures_are_the_published_layout():
    assert IDX.read_bytes() == bigrig_idx_bytes() and LOGITS.read_bytes() == bigrig_logits_bytes()


def test_idx_with_sequence_bounds(tmp_path):
    res = import_bigrig(IDX, tmp_path / "t.parquet", n_experts=16, layers="2-4")
    r = load_routing(tmp_path / "t.parquet")
    idx = np.load(IDX)["idx"]
    assert r.meta.moe_layers == (2, 3, 4) and res.sequences == 2 and res.tokens == 30
    assert r.seq.tolist() == [0] * 12 + [1] * 18 and r.pos[12] == 0
    assert (r.sel == idx.transpose(1, 0, 2)).all()  # router-rank order kept (tie_order stored, weights 1/k)
    assert r.meta.tie_order == "stored" and (r.w == 0.25).all()


def test_logits_keep_the_candidates(tmp_path):
    import_bigrig(LOGITS, tmp_path / "t.parquet", top_k=4)
    r = load_routing(tmp_path / "t.parquet")
    lg = np.load(LOGITS)["logits"].astype(np.float64).transpose(1, 0, 2)  # [T, L, E]
    assert r.meta.layout == "dense" and r.n_candidates == 16
    order = np.lexsort((np.broadcast_to(np.arange(16), lg.shape), -lg), axis=-1)
    assert (r.cand == order).all() and (r.sel == order[..., :4]).all()
    top = np.take_along_axis(lg, order[..., :4], axis=-1)
    w = np.exp(top - top[..., :1])
    np.testing.assert_allclose(r.w, w / w.sum(axis=-1, keepdims=True), rtol=1e-5)
    s = import_bigrig(LOGITS, tmp_path / "s.parquet", top_k=4, candidates=6)
    assert s.meta.layout == "sparse" and load_routing(tmp_path / "s.parquet").n_candidates == 6


def test_bigrigs_own_reader_agrees(tmp_path, monkeypatch):
    """bigrig's loader (bigrig_engine.pool.load_trace) reads the fixtures to the same ids and bounds."""
    pool = pytest.importorskip("bigrig_engine.pool", reason="bigrig is not installed")
    (tmp_path / "data" / "traces").mkdir(parents=True)
    (tmp_path / "data" / "traces" / "fix_full.npz").write_bytes(IDX.read_bytes())
    monkeypatch.setenv("BIGRIG_HOME", str(tmp_path))
    idx, bounds = pool.load_trace("fix")
    import_bigrig(IDX, tmp_path / "t.parquet", n_experts=16)
    r = load_routing(tmp_path / "t.parquet")
    assert (r.sel.transpose(1, 0, 2) == idx).all()
    assert sequence_starts(bounds, idx.shape[1], "x").tolist() == [0, 12]


@pytest.mark.parametrize("name", ["idx", "logits"])
def test_replay_checks(name, tmp_path):
    if name == "idx":
        import_bigrig(IDX, tmp_path / "t.parquet", n_experts=16)
    else:
        import_bigrig(LOGITS, tmp_path / "t.parquet", top_k=4)
    check_replays(load_routing(tmp_path / "t.parquet"), tmp_path)


def test_streamed_in_chunks(tmp_path, monkeypatch):
    from moesim.traces.importers import bigrig

    import_bigrig(LOGITS, tmp_path / "a.parquet", top_k=4)
    monkeypatch.setattr(bigrig, "CHUNK_ROWS", 5)
    import_bigrig(LOGITS, tmp_path / "b.parquet", top_k=4)
    import_bigrig(IDX, tmp_path / "c.parquet", n_experts=16)  # compressed: inflated beside the output, then mapped
    a, b = load_routing(tmp_path / "a.parquet"), load_routing(tmp_path / "b.parquet")
    assert (a.cand == b.cand).all() and (a.w == b.w).all() and (a.seq == b.seq).all()
    assert not list(tmp_path.glob(".moesim-npz-*"))


def test_sequence_bounds_layouts():
    assert sequence_starts(np.array([0, 4, 9]), 12, "x").tolist() == [0, 4, 9]
    assert sequence_starts(np.array([0, 4, 12]), 12, "x").tolist() == [0, 4]
    assert sequence_starts(np.array([[0, 4], [4, 12]]), 12, "x").tolist() == [0, 4]
    assert sequence_starts(None, 12, "x").tolist() == [0]


def _bad(tmp_path):
    idx = np.load(IDX)["idx"]
    np.savez(tmp_path / "noidx.npz", other=idx, seq_bounds=np.array([0]))
    np.savez(tmp_path / "both.npz", idx=idx, logits=np.zeros((3, 30, 16)), seq_bounds=np.array([0]))
    np.savez(tmp_path / "range.npz", idx=np.where(idx == 3, 40, idx), seq_bounds=np.array([0]))
    np.savez(tmp_path / "dup.npz", idx=np.concatenate([idx[..., :3], idx[..., :1]], axis=-1), seq_bounds=[0])
    np.savez(tmp_path / "bounds.npz", idx=idx, seq_bounds=np.array([0, 20, 10]))
    np.savez(tmp_path / "shape.npz", idx=idx[0], seq_bounds=np.array([0]))
    np.savez(tmp_path / "float.npz", idx=idx.astype(float), seq_bounds=np.array([0]))
    lg = np.load(LOGITS)["logits"].astype(np.float32)
    lg[1, 3, 2] = np.inf
    np.savez(tmp_path / "inf.npz", logits=lg, seq_bounds=np.array([0]))
    np.savez(tmp_path / "obj.npz", idx=np.array([None, 1], dtype=object), seq_bounds=np.array([0]))
    raw = IDX.read_bytes()
    (tmp_path / "trunc.npz").write_bytes(raw[: len(raw) // 2])
    (tmp_path / "text.npz").write_text("not a zip")


BAD = {
    "noidx.npz": r"expected one of the arrays idx \[L, T, k\] or logits",
    "both.npz": r"expected one of the arrays idx",
    "range.npz": r"expert id 40 is outside 0\.\.15",
    "dup.npz": r"appears twice",
    "bounds.npz": r"seq_bounds must be increasing token offsets",
    "shape.npz": r"idx must have shape \[layers, tokens, k\]",
    "float.npz": r"idx must hold integer expert ids",
    "inf.npz": r"token \(seq=0, pos=3\) layer 1: scores hold NaN or infinite values",
    "obj.npz": r"holds Python objects \(pickled\)",
    "trunc.npz": r"not a readable NumPy file",
    "text.npz": r"not a .npy or .npz file",
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_malformed(name, tmp_path):
    _bad(tmp_path)
    out = tmp_path / "out.parquet"
    result = run([tmp_path / name, "--experts", "16", "--top-k", "4", "-o", out])
    assert result.exit_code == 2, result.output
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("moesim: error: ") and "Traceback" not in result.output
    assert re.search(BAD[name], err[0]), err[0]
    assert not out.exists() and not list(tmp_path.glob(".*partial")) and not list(tmp_path.glob(".moesim-npz-*"))
