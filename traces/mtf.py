"""Move-to-front coding of ranked candidate lists, the compact (ranked) layout's expert ids.

Each MoE layer keeps a list of all E experts, most recently ranked first. A row's M ranked ids are
stored as their positions in its layer's list *before* the row, then the row's ids move to the
front in rank order (the rest keep their order). Routing is sticky from token to token, so the
positions are small and repeat, and zstd codes them in ~6.4 bits instead of 7 for E = 128
(docs/trace-format.md). Lists start as 0..E-1 at the first row of every Parquet row group, so a row
group decodes on its own. Imported through moesim.jitcache.jitted (numba's cache).
"""

import numpy as np
from numba import njit, prange


@njit(cache=True, parallel=True, nogil=True)
def encode(ids, layer, lists, where, n_layers):
    """Codes [n, M] (int32) of ranked ids [n, M] whose layer ordinals are ``layer`` [n]; updates the
    state. Layers are independent, so they are coded in parallel. Returns (codes, the first row
    whose ids repeat or leave 0..E-1, else n)."""
    n, m = ids.shape
    E = lists.shape[1]
    out = np.empty((n, m), np.int32)
    order = np.argsort(layer, kind="mergesort")  # rows of each layer, in file order
    starts = np.searchsorted(layer[order], np.arange(n_layers + 1))
    bad = np.full(n_layers, n, np.int64)
    for l in prange(n_layers):
        mark = np.zeros(E, np.int8)
        tmp = np.empty(E, np.int32)
        lst = lists[l]
        pos = where[l]
        for j in range(starts[l], starts[l + 1]):
            i = order[j]
            ok = True
            for r in range(m):
                e = ids[i, r]
                if e < 0 or e >= E or mark[e]:
                    ok = False
                    break
                mark[e] = 1
                out[i, r] = pos[e]
            if not ok:
                bad[l] = i
                break
            _move_to_front(ids[i], lst, tmp, mark)
            for q in range(E):
                pos[lst[q]] = q
    return out, bad.min()


@njit(cache=True)
def decode(codes, layer, lists):
    """Ranked ids [n, M] (int32) of codes [n, M]; updates the state. Returns (ids, the first row
    whose codes are out of range or repeated, a damaged file, else n)."""
    n, m = codes.shape
    E = lists.shape[1]
    out = np.empty((n, m), np.int32)
    mark = np.zeros(E, np.int8)
    tmp = np.empty(E, np.int32)
    for i in range(n):
        lst = lists[layer[i]]
        for r in range(m):
            c = codes[i, r]
            if c < 0 or c >= E or mark[c]:
                return out, i
            mark[c] = 1
        for r in range(m):
            mark[codes[i, r]] = 0
            out[i, r] = lst[codes[i, r]]
        for r in range(m):
            mark[out[i, r]] = 1
        _move_to_front(out[i], lst, tmp, mark)
    return out, n


@njit(inline="always")
def _move_to_front(row, lst, tmp, mark):
    """The row's ids (marked 1) to the front in rank order; the others keep their order behind them.
    Clears the marks."""
    m = row.shape[0]
    E = lst.shape[0]
    # walk from the back into a scratch list: an unmarked expert takes slot j, a marked one is
    # overwritten by the next (a separate buffer keeps the loads independent of the stores)
    j = E - 1
    for q in range(E - 1, -1, -1):
        e = lst[q]
        tmp[j] = e
        j -= 1 - mark[e]
    for r in range(m):
        e = row[r]
        tmp[r] = e
        mark[e] = 0
    for q in range(E):
        lst[q] = tmp[q]
