"""Generator 2's kernel (traces/synth_kernel.py `generate`) against a plain numpy reference that reads the
model off its definition: every element's random bits (tests/synth_reference.py), the quantile tables, the
drift, the noise, the quantized logit, and the m best keys of each row. The kernel's rank-order layout,
layer ranges and token blocks are implementation: the outputs must be equal for any of them."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
from synth_reference import linked_bits, predecessors

from moesim.traces import synth_kernel
from moesim.traces.synthetic import _quantile_tables, coupling_link16, coupling_order, layer_split, rank_layout

QMAX, ID_BITS = 1 << 20, 10
F = np.float32


def _setup(E: int, couple: float):
    rng = np.random.default_rng(zlib.crc32(b"synth-kernel"))
    D, L, c, m = 2, 6, 40, 8
    base = rng.normal(0, 1.5, (D, L, E)).astype(np.float32)
    weights = np.array([0.7, 0.3])
    dom = np.repeat(rng.integers(0, D, 8), 5).astype(np.int64)
    newseq = np.zeros(c, np.bool_)
    newseq[[0, 17]] = True
    link16 = coupling_link16(couple)
    pred = predecessors(coupling_order(base, weights))
    knobs = dict(rho=F(0.81), innov=F(0.6), drift=F(1.04), noise=F(1.0), inv_temp=F(1.1), offset=F(0.25),
                 inv_grid=F(32.0))
    return base, weights, dom, newseq, pred, link16, knobs, m


def _reference(key, t0, base, dom, newseq, pred, link16, kn, m, grid):
    """Best m keys [c * L, m] (sorted), every q [c * L, E] (expert order), log-sum-exps [c * L]."""
    D, L, E = base.shape
    c = len(dom)
    bits = linked_bits(key, t0, c, pred, link16)
    ntab, gtab = _quantile_tables()
    z = np.zeros((L, E), np.float32)
    best = np.empty((c * L, m), np.int32)
    qs = np.empty((c * L, E), np.int32)
    lse = np.empty(c * L)
    ids = np.arange(E, dtype=np.int32)
    for i in range(c):
        a, b = (kn["drift"], kn["drift"]) if newseq[i] else (kn["rho"], kn["innov"])
        keep = F(0.0) if newseq[i] else F(1.0)
        for lay in range(L):
            nv, gv = ntab[bits[i, lay] & 0xFFFF], gtab[bits[i, lay] >> 16]
            z[lay] = keep * a * z[lay] + b * nv
            s = (base[dom[i], lay] + z[lay] + kn["noise"] * gv) * kn["inv_temp"] + kn["offset"]
            q = np.clip(np.rint(s * kn["inv_grid"]), F(-QMAX + 1), F(QMAX - 1)).astype(np.int32)
            r = i * L + lay
            best[r] = np.sort(((QMAX - q) << ID_BITS) | ids)[:m]
            qs[r] = q
            x = q * grid
            mx = max(x)
            lse[r] = mx + math.log(sum(math.exp(v - mx) for v in x))
    return best, qs, lse


def _kernel(key, t0, base, weights, dom, newseq, link16, kn, m, grid, parts, block):
    D, L, E = base.shape
    c = len(dom)
    order, base_r = rank_layout(base, weights, link16)
    width = min(E + 1, m + 24)
    z = np.zeros((L, E), np.float32)
    thr = np.full(L, np.iinfo(np.int32).max, np.int32)
    keys = np.empty((c * L, width), np.int32)
    counts = np.empty(c * L, np.int32)
    qfull = np.empty((c * L, E), np.int32)
    lse = np.empty(c * L)
    synth_kernel.generate(
        np.uint64(key), t0, L, base_r, order, dom, newseq, z, kn["rho"], kn["innov"], kn["drift"], kn["noise"],
        kn["inv_temp"], kn["offset"], kn["inv_grid"], *_quantile_tables(), thr, m, width, keys, counts, qfull, grid,
        lse, link16, layer_split(L, parts), block)
    assert (counts >= m).all() and (counts <= width).all()
    for r in range(c * L):  # past the row's count: the sentinel
        assert (keys[r, counts[r]:] == np.iinfo(np.int32).max).all()
    return np.sort(keys, axis=1)[:, :m], qfull, lse


@pytest.mark.parametrize("E,couple", [(64, 0.9), (64, 0.0), (100, 1.0)])
@pytest.mark.parametrize("parts,block", [(1, 16), (3, 7), (6, 1)])
def test_kernel_equals_reference(E, couple, parts, block):
    base, weights, dom, newseq, pred, link16, kn, m = _setup(E, couple)
    key, t0, grid = 0x5EED_0F_2, 1234, 1 / 32
    want = _reference(key, t0, base, dom, newseq, pred, link16, kn, m, grid)
    got = _kernel(key, t0, base, weights, dom, newseq, link16, kn, m, grid, parts, block)
    np.testing.assert_array_equal(got[0], want[0])  # the m best: ids and logits, in rank order
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_allclose(got[2], want[2], rtol=1e-12)


def test_the_generator_runs_without_the_jit(tmp_path):
    """NUMBA_DISABLE_JIT=1 (numba's debugging mode: the kernels run as plain Python) writes the same file,
    the lookahead column included, with no warning on stderr."""
    import os
    import subprocess
    import sys

    args = ["synth", "--preset", "mixtral-8x7b", "--tokens", "3", "--seed", "1", "--lookahead", "-o", "t.parquet"]
    run = [sys.executable, "-c", "import sys; from moesim.cli import main; sys.argv[0] = 'moesim'; main()", *args]
    outs = []
    for name, env in (("jit", {}), ("python", {"NUMBA_DISABLE_JIT": "1"})):
        d = tmp_path / name
        d.mkdir()
        res = subprocess.run(run, cwd=d, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0 and not res.stderr.strip(), (name, res.stderr)
        outs.append((d / "t.parquet").read_bytes())
    assert outs[0] == outs[1]
