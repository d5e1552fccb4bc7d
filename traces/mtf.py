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
def encode(ids, layer, where, n_layers):
    """Codes [n, M] (int32) of ranked ids [n, M] whose layer ordinals are ``layer`` [n]; ``where``
    [L, E] (each expert's position in its layer's list) is the state, updated. Layers are
    independent, so they are coded in parallel. Returns (codes, the first row whose ids repeat or
    leave 0..E-1, else n).

    The codes are the ids' entries in ``where``. Only the list's first h + 1 positions change, h the
    row's largest code: walking them from the back, every expert that stays shifts back over the
    moved ones (branch-free: each is stored, and the next one overwrites a moved one), then the row
    fills the front. The walk uses unsigned 16-bit copies of the state (no negative-index checks, and
    a layer's state fits in the L1 cache)."""
    n, m = ids.shape
    E = where.shape[1]
    out = np.empty((n, m), np.int32)
    parts = 2  # layer classes coded in parallel (one per core here); each scans the rows in file order
    bad = np.full(parts, n, np.int64)
    one = np.uint64(1)
    for part in prange(parts):
        lists = np.empty(where.shape, np.uint16)  # position -> expert
        wher = np.empty(where.shape, np.uint16)  # expert -> position
        for lay in range(part, where.shape[0], parts):
            for e in range(E):
                lists[lay, where[lay, e]] = e
                wher[lay, e] = where[lay, e]
        mark = np.zeros(E, np.uint8)
        for i in range(n):
            if layer[i] % parts != part:
                continue
            wh = wher[layer[i]]
            lst = lists[layer[i]]
            ok = True
            h = np.uint64(0)
            for r in range(m):
                e = ids[i, r]
                if e < 0 or e >= E or mark[e]:
                    ok = False  # out of range, or a repeated id
                    break
                mark[e] = 1
                p = np.uint64(wh[e])
                out[i, r] = p
                h = max(h, p)
            if not ok:
                bad[part] = i
                break
            j = h
            q = h + one
            while q > 0:
                q -= one
                e = np.uint64(lst[q])
                lst[j] = e
                wh[e] = j
                j -= one - np.uint64(mark[e])
            for r in range(m):
                e = ids[i, r]
                lst[r] = e
                wh[e] = r
                mark[e] = 0
        for lay in range(part, where.shape[0], parts):
            for e in range(E):
                where[lay, e] = wher[lay, e]
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
