"""The synthetic generator's last jitted step (generator 2): sorted candidate keys to the rows the writer
takes, run on the generator's thread. Cached by numba per component (moesim/jitcache.py)."""

import numpy as np

from moesim.jitcache import cached_njit
from moesim.traces.synth_kernel import ID_BITS, QMAX


@cached_njit(nogil=True)
def unpack(keys, m, grid):
    """Sorted keys [n, >= m] -> (ids [n, m] int16, q [n, m] int32 and the logits q * grid [n, m] float32 of the
    m best), in one pass over the keys (no strided numpy slices)."""
    n = keys.shape[0]
    ids = np.empty((n, m), np.int16)
    q = np.empty((n, m), np.int32)
    x = np.empty((n, m), np.float32)
    mask = (1 << ID_BITS) - 1
    for i in range(n):
        for j in range(m):
            ids[i, j] = keys[i, j] & mask
            q[i, j] = QMAX - (keys[i, j] >> ID_BITS)
            x[i, j] = np.float32(np.float64(q[i, j]) * grid)  # as numpy's (q * grid).astype(float32)
    return ids, q, x
