"""`moesim import fitz-tec`: fitz-tec's RTRACE01 router traces (docs/importers.md, "fitz-tec")."""

from __future__ import annotations

import re
import struct
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import FIXTURES
from import_checks import check_replays

from moesim.cli import cli
from moesim.errors import MoesimError
from moesim.traces import load_routing
from moesim.traces.importers.fitz_tec import import_fitz_tec, write_rtrace

sys.path.insert(0, str(FIXTURES))
from peer_formats import fitz_tec_bytes  # noqa: E402

RTRACE = FIXTURES / "peers" / "fitz_tec.rtrace"  # E=16, layers 0, 1, 3, 40 tokens, records per ubatch of 8


def read_records(path=RTRACE):
    raw = path.read_bytes()
    E = struct.unpack_from("<i", raw, 8)[0]
    dt = np.dtype([("token", "<i4"), ("layer", "<i4"), ("probs", "<f4", (E,))])
    return E, np.frombuffer(raw[16:], dtype=dt)


def run(args):
    return CliRunner().invoke(cli, ["import", "fitz-tec", *map(str, args)])


def test_fixture_is_the_published_layout():
    assert RTRACE.read_bytes() == fitz_tec_bytes()


def test_softmax_kept_as_dense_scores(tmp_path):
    out = tmp_path / "t.parquet"
    res = import_fitz_tec(RTRACE, out, top_k=2)
    r = load_routing(out)
    m = r.meta
    assert (m.layout, m.n_experts, m.top_k, m.moe_layers, m.gating) == ("dense", 16, 2, (0, 1, 3), "softmax")
    assert res.tokens == 40 and res.sequences == 1 and r.pos.tolist() == list(range(40))
    E, rec = read_records()
    for row in rec[::7]:
        t, l = int(row["token"]), m.moe_layers.index(int(row["layer"]))
        p = row["probs"].astype(np.float64)
        top = np.lexsort((np.arange(E), -p))
        assert r.sel[t, l].tolist() == top[:2].tolist()
        assert r.cand[t, l].tolist() == top.tolist()  # every candidate kept, in score order
        np.testing.assert_allclose(r.w[t, l], p[top[:2]] / p[top[:2]].sum(), rtol=1e-5)


def test_fitz_tecs_own_reader_agrees(tmp_path):
    """fitz-tec's parser (fitz_tec.tools._trace_format.load_trace) reads the fixture to the probabilities
    the trace stores."""
    fmt = pytest.importorskip("fitz_tec.tools._trace_format", reason="fitz-tec is not installed")
    trace = fmt.load_trace(RTRACE)
    import_fitz_tec(RTRACE, tmp_path / "t.parquet", top_k=2)
    r = load_routing(tmp_path / "t.parquet")
    assert trace.n_tokens == r.n_tokens and trace.n_experts == 16 and trace.n_layers == 4
    assert np.isnan(trace.probs[:, 2]).all()  # layer 2 has no router: no records, as fitz-tec reads it
    for l, layer in enumerate(r.meta.moe_layers):
        top = np.argsort(-trace.probs[:, layer, :], axis=1, kind="stable")[:, :2]
        assert (np.sort(top, axis=1) == np.sort(r.sel[:, l].astype(np.int64), axis=1)).all()


def test_candidates_keep_the_best_m_with_lse(tmp_path):
    import_fitz_tec(RTRACE, tmp_path / "d.parquet", top_k=2)
    import_fitz_tec(RTRACE, tmp_path / "s.parquet", top_k=2, candidates=5)
    d, s = load_routing(tmp_path / "d.parquet"), load_routing(tmp_path / "s.parquet")
    assert s.meta.layout == "sparse" and s.meta.n_candidates == 5
    assert (s.sel == d.sel).all() and (s.cand == d.cand[:, :, :5]).all()
    np.testing.assert_allclose(s.w, d.w, rtol=1e-6)


def test_prompt_tokens_and_preset(tmp_path):
    res = import_fitz_tec(RTRACE, tmp_path / "t.parquet", top_k=2, prompt_tokens=8, norm_topk_prob=False)
    r = load_routing(tmp_path / "t.parquet")
    assert res.phases == {"prefill": 8, "decode": 32} and r.meta.norm_topk_prob is False
    with pytest.raises(MoesimError, match="experts per layer, but qwen3-30b-a3b has 128"):
        import_fitz_tec(RTRACE, tmp_path / "u.parquet", model_id="qwen3-30b-a3b")


def test_streamed_in_chunks_from_shuffled_records(tmp_path, monkeypatch):
    """Records in any order, read a few tokens at a time: the same trace as one chunk."""
    from moesim.traces.importers import fitz_tec

    E, rec = read_records()
    perm = np.random.default_rng(1).permutation(len(rec))
    write_rtrace(tmp_path / "shuf.bin", rec["token"][perm], rec["layer"][perm], rec["probs"][perm])
    import_fitz_tec(RTRACE, tmp_path / "a.parquet", top_k=2)
    monkeypatch.setattr(fitz_tec, "CHUNK_ROWS", 7)
    import_fitz_tec(tmp_path / "shuf.bin", tmp_path / "b.parquet", top_k=2)
    a, b = load_routing(tmp_path / "a.parquet"), load_routing(tmp_path / "b.parquet")
    assert (a.sel == b.sel).all() and (a.cand == b.cand).all() and (a.w == b.w).all()


def test_replay_checks(tmp_path):
    import_fitz_tec(RTRACE, tmp_path / "t.parquet", top_k=2)
    check_replays(load_routing(tmp_path / "t.parquet"), tmp_path)


def _bad(tmp_path):
    E, rec = read_records()
    good = RTRACE.read_bytes()
    (tmp_path / "magic.bin").write_bytes(b"RTRACE02" + good[8:])
    (tmp_path / "short.bin").write_bytes(good[:12])
    (tmp_path / "trunc.bin").write_bytes(good[:-10])
    (tmp_path / "version.bin").write_bytes(good[:12] + struct.pack("<i", 1) + good[16:])
    (tmp_path / "empty.bin").write_bytes(good[:16])
    p = rec["probs"].copy()
    p[5] *= 0.5
    write_rtrace(tmp_path / "sum.bin", rec["token"], rec["layer"], p)
    p = rec["probs"].copy()
    p[3, 2] = np.nan
    write_rtrace(tmp_path / "nan.bin", rec["token"], rec["layer"], p)
    t = rec["token"].copy()
    t[1] = t[0]
    write_rtrace(tmp_path / "dup.bin", t, rec["layer"], rec["probs"])
    keep = ~((rec["token"] == 9) & (rec["layer"] == 3))
    write_rtrace(tmp_path / "missing.bin", rec["token"][keep], rec["layer"][keep], rec["probs"][keep])
    t = rec["token"].copy()
    t[4] = -3
    write_rtrace(tmp_path / "neg.bin", t, rec["layer"], rec["probs"])


BAD = {
    "magic.bin": r"not a fitz-tec router trace \(magic b'RTRACE02'",
    "short.bin": r"truncated header \(12 of 16 bytes\)",
    "trunc.bin": r"truncated: the last record has 62 of its 72 bytes",
    "version.bin": r"header version 1; this reader knows version 0",
    "empty.bin": r"no records after the header",
    "sum.bin": r"token \d+ layer \d: record holds probabilities that sum to 0\.5, not 1",
    "nan.bin": r"values that are not probabilities",
    "dup.bin": r"token 0 has layer 0 twice",
    "missing.bin": r"token 9 has no record for layer 3; 1 of 40 tokens",
    "neg.bin": r"record 5: token -3",
    "nope.bin": r"no such file",
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_malformed(name, tmp_path):
    _bad(tmp_path)
    out = tmp_path / "out.parquet"
    result = run([tmp_path / name, "--top-k", "2", "-o", out])
    assert result.exit_code == 2, result.output
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("moesim: error: ") and "Traceback" not in result.output
    assert re.search(BAD[name], err[0]), err[0]
    assert not out.exists() and not list(tmp_path.glob(".*partial"))


def test_needs_top_k(tmp_path):
    result = run([RTRACE, "-o", tmp_path / "o.parquet"])
    assert result.exit_code == 2 and "--top-k" in result.stderr
