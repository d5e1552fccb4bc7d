"""The synthetic generator's main-thread step (generator 2), jitted: sorted candidate keys to the
rows the writer takes. Cached by numba per component (moesim/jitcache.py)."""

import numpy as np

from moesim.jitcache import cached_njit
from moesim.traces.synth_kernel import ID_BITS, QMAX


@cached_njit(nogil=True)
def unpack(keys, m):
    """Sorted keys [n, >= m] -> (ids [n, m] int16, q [n, m] int32 of the m best), in one pass over the keys
    (no strided numpy slices)."""
    n = keys.shape[0]
    ids = np.empty((n, m), np.int16)
    q = np.empty((n, m), np.int32)
    mask = (1 << ID_BITS) - 1
    for i in range(n):
        for j in range(m):
            ids[i, j] = keys[i, j] & mask
            q[i, j] = QMAX - (keys[i, j] >> ID_BITS)
    return ids, q
