"""`moesim import vllm-routed`: vLLM's routed_experts arrays (docs/importers.md, "vLLM routed experts")."""

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
from moesim.traces.importers.vllm_routed import import_vllm_routed

sys.path.insert(0, str(FIXTURES))
from peer_formats import vllm_routed_bytes  # noqa: E402

NPZ = FIXTURES / "peers" / "vllm_routed.npz"  # requests cmpl-a1 [9, 4, 2], cmpl-b2 [6, 4, 2]; layer 0 dense (zeros)


def run(args):
    return CliRunner().invoke(cli, ["import", "vllm-routed", *map(str, args)])


def test_fixture_is_the_published_layout():
    assert NPZ.read_bytes() == vllm_routed_bytes()


def test_requests_become_sequences_and_dense_layers_drop(tmp_path):
    res = import_vllm_routed(NPZ, tmp_path / "t.parquet", n_experts=16)
    r = load_routing(tmp_path / "t.parquet")
    z = np.load(NPZ)
    assert r.meta.moe_layers == (1, 2, 3) and res.sequences == 2 and res.tokens == 15
    assert any("layer(s) 0 all zero" in n for n in res.notes)
    assert r.meta.source["requests"] == ["cmpl-a1", "cmpl-b2"]
    assert (r.sel[:9] == z["cmpl-a1"][:, 1:]).all() and (r.sel[9:] == z["cmpl-b2"][:, 1:]).all()
    assert r.seq.tolist() == [0] * 9 + [1] * 6 and r.meta.tie_order == "stored"


def test_layers_flag_and_single_npy(tmp_path):
    a = np.load(NPZ)["cmpl-a1"]
    np.save(tmp_path / "one.npy", a)
    res = import_vllm_routed(tmp_path / "one.npy", tmp_path / "t.parquet", n_experts=16, layers="1-3")
    assert res.tokens == 9 and res.meta.moe_layers == (1, 2, 3) and res.meta.source["requests"] is None
    result = run([tmp_path / "one.npy", "--experts", "16", "--layers", "0-3", "-o", tmp_path / "u.parquet"])
    assert result.exit_code == 2 and "token 0 layer 0: all ids 0 (not captured" in result.stderr


def test_streamed_in_chunks(tmp_path, monkeypatch):
    from moesim.traces.importers import vllm_routed

    import_vllm_routed(NPZ, tmp_path / "a.parquet", n_experts=16)
    monkeypatch.setattr(vllm_routed, "CHUNK_ROWS", 4)
    import_vllm_routed(NPZ, tmp_path / "b.parquet", n_experts=16)
    a, b = load_routing(tmp_path / "a.parquet"), load_routing(tmp_path / "b.parquet")
    assert (a.sel == b.sel).all() and (a.pos == b.pos).all()


def test_replay_checks(tmp_path):
    import_vllm_routed(NPZ, tmp_path / "t.parquet", n_experts=16)
    check_replays(load_routing(tmp_path / "t.parquet"), tmp_path)


def _bad(tmp_path):
    z = dict(np.load(NPZ))
    np.savez(tmp_path / "shape.npz", a=z["cmpl-a1"][:, 0])
    np.savez(tmp_path / "mismatch.npz", a=z["cmpl-a1"], b=z["cmpl-b2"][:, :3])
    np.savez(tmp_path / "float.npz", a=z["cmpl-a1"].astype(float))
    bad = z["cmpl-a1"].copy()
    bad[2, 2, 1] = 99
    np.savez(tmp_path / "range.npz", a=bad)
    bad = z["cmpl-a1"].copy()
    bad[3, 1, 1] = bad[3, 1, 0]
    np.savez(tmp_path / "dup.npz", a=bad)
    np.savez(tmp_path / "zeros.npz", a=np.zeros((3, 2, 2), np.int32))
    np.savez(tmp_path / "empty.npz")


BAD = {
    "shape.npz": r"must be routed_experts \[tokens, layers, k\], got shape \(9, 2\)",
    "mismatch.npz": r"disagree on \[layers, k\]",
    "float.npz": r"must hold integer expert ids",
    "range.npz": r"expert id 99 is outside 0\.\.15",
    "dup.npz": r"appears twice",
    "zeros.npz": r"every layer's ids are all zero",
    "empty.npz": r"holds no arrays",
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_malformed(name, tmp_path):
    _bad(tmp_path)
    out = tmp_path / "out.parquet"
    result = run([tmp_path / name, "--experts", "16", "-o", out])
    assert result.exit_code == 2, result.output
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("moesim: error: ") and "Traceback" not in result.output
    assert re.search(BAD[name], err[0]), err[0]
    assert not out.exists() and not list(tmp_path.glob(".*partial"))
