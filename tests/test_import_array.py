"""`moesim import array`: selected ids [T, L, k] in .npy / .npz files, never unpickled."""

from __future__ import annotations

import re

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from moesim.cli import cli
from moesim.traces import load_routing
from moesim.traces.importers.arrays import import_array

NPZ = FIXTURES / "array_routing.npz"  # ids [5, 2, 2], weights [5, 2, 2], seq [5] = 4, 4, 9, 9, 4


def run(args):
    return CliRunner().invoke(cli, ["import", "array", *map(str, args)])


def test_npz_with_weights_and_sequences(tmp_path):
    out = tmp_path / "t.parquet"
    res = import_array(NPZ, out, n_experts=8, layers="3,7")
    r = load_routing(out)
    z = np.load(NPZ, allow_pickle=False)
    ids, w, seq = z["ids"], z["weights"], z["seq"]
    assert r.meta.moe_layers == (3, 7) and res.tokens == 5 and res.sequences == 2
    # tokens ordered by (seq, pos); positions count each sequence's tokens in array order
    order = [0, 1, 4, 2, 3]
    assert r.seq.tolist() == seq[order].tolist() and r.pos.tolist() == [0, 1, 2, 0, 1]
    for t, src in enumerate(order):
        for l in range(2):
            rank = sorted(range(2), key=lambda j: -w[src, l, j])  # equal weights: the array's order
            assert r.sel[t, l].tolist() == [int(ids[src, l, j]) for j in rank]
            np.testing.assert_allclose(r.w[t, l], w[src, l][rank] / w[src, l].sum(), rtol=1e-6)
    assert r.sel[0, 1].tolist() == [7, 0]  # a 0.5/0.5 tie keeps the array's order, not the lower id first


def test_npy_ids_only(tmp_path):
    ids = np.array([[[3, 1, 2, 0]], [[1, 0, 3, 2]]])
    np.save(tmp_path / "ids.npy", ids)
    result = run([tmp_path / "ids.npy", "--experts", "4", "--model", "m", "-o", tmp_path / "t.parquet"])
    assert result.exit_code == 0, result.output
    r = load_routing(tmp_path / "t.parquet")
    assert r.sel[:, 0].tolist() == ids[:, 0].tolist() and (r.w == 0.25).all() and r.meta.tie_order == "stored"
    assert r.meta.source["weights"] == "not in the file: exactly 1/k"


def test_preset_by_model_id(tmp_path):
    np.save(tmp_path / "ids.npy", np.tile(np.arange(8), (3, 1, 1)))
    res = import_array(tmp_path / "ids.npy", tmp_path / "t.parquet", model_id="allenai/OLMoE-1B-7B-0924",
                       layers="4")
    assert res.meta.n_experts == 64 and res.meta.moe_layers == (4,) and res.meta.source["preset"] == "olmoe-1b-7b"


def bad_files(tmp_path):
    np.save(tmp_path / "obj.npy", np.array([[1, 2], "x"], dtype=object), allow_pickle=True)
    np.save(tmp_path / "2d.npy", np.zeros((3, 2), dtype=np.int64))
    np.save(tmp_path / "float.npy", np.full((2, 1, 2), 0.5))
    np.savez(tmp_path / "noids.npz", other=np.zeros(3))
    np.savez(tmp_path / "wshape.npz", ids=np.array([[[0, 1]]]), weights=np.ones((1, 1, 3)))
    np.savez(tmp_path / "seqshape.npz", ids=np.array([[[0, 1]]]), seq=np.zeros(2, dtype=np.int64))
    np.savez(tmp_path / "two.npz", ids=np.array([[[0, 1]]]), topk_ids=np.array([[[0, 1]]]))
    np.savez(tmp_path / "objnpz.npz", ids=np.array([None, 1], dtype=object))
    np.save(tmp_path / "range.npy", np.array([[[0, 9]]]))
    np.save(tmp_path / "dup.npy", np.array([[[2, 2]]]))
    (tmp_path / "text.npy").write_text("not numpy")
    (tmp_path / "trunc.npz").write_bytes(b"PK\x03\x04garbage")


BAD = {
    "obj.npy": "holds Python objects \\(pickled\\)",
    "2d.npy": "expected selected ids of shape \\[tokens, layers, k\\], got \\(3, 2\\)",
    "float.npy": "selected ids must be integers",
    "noids.npz": "no selected-id array",
    "wshape.npz": "weights have shape \\(1, 1, 3\\)",
    "seqshape.npz": "seq must hold one sequence id per token",
    "two.npz": "arrays ids, topk_ids all mean ids",
    "objnpz.npz": "holds Python objects",
    "range.npy": "expert id 9 is outside 0..7",
    "dup.npy": "appears twice",
    "text.npy": "not a .npy or .npz file",
    "trunc.npz": "not a readable NumPy file",
    "missing.npy": "no such file",
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_malformed(name, tmp_path):
    bad_files(tmp_path)
    out = tmp_path / "out.parquet"
    result = run([tmp_path / name, "--experts", "8", "-o", out])
    assert result.exit_code == 2, result.output
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("moesim: error: ") and "Traceback" not in result.output
    assert re.search(BAD[name], err[0]), err[0]
    assert not out.exists()


def test_needs_experts(tmp_path):
    np.save(tmp_path / "ids.npy", np.array([[[0, 1]]]))
    result = run([tmp_path / "ids.npy", "-o", tmp_path / "o.parquet"])
    assert result.exit_code == 2 and "--experts E" in result.stderr
