"""The synthetic generator's main-thread step (generator 2), jitted: sorted candidate keys to the
rows the writer takes. Cached by numba per component (moesim/jitcache.py)."""

import numpy as np

from moesim.jitcache import cached_njit
from moesim.traces.synth_kernel import ID_BITS, QMAX


@cached_njit(nogil=True)
def unpack(keys, m, n_gaps, with_q):
    """Sorted keys [n, >= m] -> (ids [n, m] int16, q [n, m] int32 of the m best (no rows unless
    ``with_q``), gaps [n, n_gaps] int32: q[:, j] - q[:, j + 1], the ranked layout's gate gaps). One pass
    over the keys: the gaps need no q array and no strided numpy slices."""
    n = keys.shape[0]
    ids = np.empty((n, m), np.int16)
    q = np.empty((n if with_q else 0, m), np.int32)
    gaps = np.empty((n, n_gaps), np.int32)
    mask = (1 << ID_BITS) - 1
    for i in range(n):
        for j in range(m):
            ids[i, j] = keys[i, j] & mask
        if with_q:
            for j in range(m):
                q[i, j] = QMAX - (keys[i, j] >> ID_BITS)
        for j in range(n_gaps):  # (QMAX - q_{j+1}) - (QMAX - q_j), from the keys' high bits
            gaps[i, j] = (keys[i, j + 1] >> ID_BITS) - (keys[i, j] >> ID_BITS)
    return ids, q, gaps
