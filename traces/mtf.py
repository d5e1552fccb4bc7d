"""Move-to-front coding of ranked candidate lists, the compact (ranked) layout's expert ids.

Each MoE layer keeps a list of all E experts, most recently ranked first. A row's M ranked ids are
stored as their positions in its layer's list *before* the row, then the row's ids move to the
front in rank order (the rest keep their order). Routing is sticky from token to token, so the
positions are small and repeat, and zstd codes them in ~6.4 bits instead of 7 for E = 128
(docs/trace-format.md). Lists start as 0..E-1 at the first row of every Parquet row group, so a row
group decodes on its own. Imported through moesim.jitcache.jitted (numba's cache).
"""

import numpy as np
from numba import njit


@njit(cache=True)
def encode(ids, layer, lists, where):
    """Codes [n, M] (int32) of ranked ids [n, M] whose layer ordinals are ``layer`` [n]; updates the
    state. Ids must be distinct within a row and in 0..E-1 (the caller checks)."""
    n, m = ids.shape
    E = lists.shape[1]
    out = np.empty((n, m), np.int32)
    mark = np.zeros(E, np.bool_)
    for i in range(n):
        lst = lists[layer[i]]
        pos = where[layer[i]]
        for r in range(m):
            out[i, r] = pos[ids[i, r]]
        _move_to_front(ids[i], lst, pos, mark)
    return out


@njit(cache=True)
def decode(codes, layer, lists, where):
    """Ranked ids [n, M] (int32) of codes [n, M]; updates the state. Returns row -1 at the first row
    whose codes are out of range or repeated (a damaged file), else n."""
    n, m = codes.shape
    E = lists.shape[1]
    out = np.empty((n, m), np.int32)
    mark = np.zeros(E, np.bool_)
    for i in range(n):
        lst = lists[layer[i]]
        pos = where[layer[i]]
        for r in range(m):
            c = codes[i, r]
            if c < 0 or c >= E or mark[c]:
                return out, i
            mark[c] = True
            out[i, r] = lst[c]
        for r in range(m):
            mark[codes[i, r]] = False
        _move_to_front(out[i], lst, pos, mark)
    return out, n


@njit(inline="always")
def _move_to_front(row, lst, pos, mark):
    m = row.shape[0]
    E = lst.shape[0]
    for r in range(m):
        mark[row[r]] = True
    # the experts not in the row keep their order, shifted behind the row's: walk from the back
    j = E - 1
    for q in range(E - 1, -1, -1):
        e = lst[q]
        if not mark[e]:
            lst[j] = e
            pos[e] = j
            j -= 1
    for r in range(m):
        e = row[r]
        lst[r] = e
        pos[e] = r
        mark[e] = False
