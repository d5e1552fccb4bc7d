"""The ranked layout's gate-gap bytes, jitted (one pass instead of numpy's six over a batch).
Cached by numba per component (moesim/jitcache.py)."""

import numpy as np

from moesim.jitcache import cached_njit


@cached_njit(nogil=True)
def split_gaps(g):
    """Gaps [n, w] -> (low bytes [n, w] uint8, high bytes [n, w] uint8, rows with a high byte [n] bool,
    whether every gap is in 0..65535; the bytes are undefined when not)."""
    n, w = g.shape
    low = np.empty((n, w), np.uint8)
    high = np.empty((n, w), np.uint8)
    some = np.empty(n, np.bool_)
    flat, lo, hi = g.reshape(-1), low.reshape(-1), high.reshape(-1)
    least, most = 0, 0
    for t in range(flat.size):  # flat, so that it vectorizes
        v = np.int64(flat[t])  # a uint64 above 2**63 wraps negative: out of range either way
        least = min(least, v)
        most = max(most, v)
        lo[t] = v & 0xFF
        hi[t] = (v >> 8) & 0xFF
    for i in range(n):
        row = 0
        for j in range(w):
            row |= high[i, j]
        some[i] = row != 0
    return low, high, some, least >= 0 and most <= 0xFFFF
