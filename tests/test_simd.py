"""The generator kernel's stream compaction (traces/simd.py): the AVX-512 path (where the CPU has it)
and the plain loop keep the same elements in the same order as numpy, for any E (whole blocks of 16
and a remainder)."""

import numpy as np
import pytest
from numba import njit

from moesim.traces import simd

IMPLS = [("plain", simd.flagged_plain, simd.below_plain)]
if simd.AVX512:
    IMPLS.append(("avx512", simd.flagged_avx512, simd.below_avx512))


def _runner(flagged, below):
    @njit
    def run(flags, keys, th):
        E = flags.shape[0]
        out = np.full(E, -1, np.int32)
        n = flagged(flags, E, out)
        kk = keys.copy()
        m = below(kk, E, th)
        return out[:n].copy(), kk[:m].copy()

    return run


@pytest.mark.parametrize("name,flagged,below", IMPLS, ids=[i[0] for i in IMPLS])
def test_compaction_matches_numpy(name, flagged, below):
    run = _runner(flagged, below)
    rng = np.random.default_rng(17)
    for E in (1, 7, 8, 15, 16, 17, 31, 32, 60, 64, 100, 128, 256, 257):
        for p in (0.0, 0.1, 0.5, 1.0):
            flags = (rng.random(E) < p).astype(np.uint8) * rng.integers(1, 4, E).astype(np.uint8)
            keys = rng.integers(-(1 << 30), 1 << 30, E).astype(np.int32)
            th = np.int32(np.quantile(keys, p)) if p else np.int32(-(1 << 31))
            ranks, kept = run(flags, keys, th)
            assert ranks.tolist() == np.flatnonzero(flags).tolist(), (name, E, p)
            assert kept.tolist() == keys[keys < th].tolist(), (name, E, p)


def test_kernel_uses_the_cpus_path():
    """The kernel calls the AVX-512 path exactly when numba compiles for a CPU with AVX-512F."""
    assert (simd.flagged is simd.flagged_avx512) == simd.AVX512
    assert (simd.below is simd.below_avx512) == simd.AVX512


@pytest.mark.skipif(not simd.AVX512, reason="the AVX-512 path needs a CPU with AVX-512F")
def test_vector_path_refuses_strided_arrays():
    """The intrinsics read 16 elements from the data pointer: a strided view must not type."""
    from numba.core.errors import TypingError

    run = _runner(simd.flagged_avx512, simd.below_avx512)
    with pytest.raises(TypingError):
        run(np.ones(64, np.uint8)[::2], np.zeros(32, np.int32), np.int32(0))
