"""Move-to-front coding of ranked candidate lists, the compact (ranked) layout's expert ids.

Each MoE layer keeps a list of all E experts, most recently ranked first. A row's M ranked ids are
stored as their positions in its layer's list *before* the row, then the row's ids move to the
front in rank order (the rest keep their order). Routing is sticky from token to token, so the
positions are small and repeat, and zstd codes them in ~6.4 bits instead of 7 for E = 128
(docs/trace-format.md). Lists start as 0..E-1 at the first row of every Parquet row group, so a row
group decodes on its own. Cached by numba per component (moesim/jitcache.py).
"""

import numba
import numpy as np
from numba import njit, prange

from moesim.jitcache import cached_njit

SMALL = 128  # up to this many experts (two 64-bit words of positions), encode counts bits instead of walking


def thread_parts() -> int:
    """encode's ``parts`` for the calling thread (numba's thread count is per thread)."""
    return 2 if numba.get_num_threads() > 1 else 1


def encode(ids, layer, where, n_layers, parts=2):
    """Codes [n, M] (int32) of ranked ids [n, M] whose layer ordinals are ``layer`` [n]; ``where``
    [L, E] (each expert's position in its layer's list, a permutation of 0..E-1) is the state, updated.
    Returns (codes, the first row whose ids repeat or leave 0..E-1, else n); ``parts``: see encode_into."""
    out = np.empty(ids.shape, np.int32)
    return out, encode_into(ids, layer, where, parts, out)


@cached_njit(parallel=True, nogil=True)
def encode_into(ids, layer, where, parts, out):
    """encode's codes into ``out`` [n, M] (int32, or uint8 when E <= 256: the ranked layout's bytes, with
    no int32 copy between); returns the first bad row or n. Layers are independent, so ``parts`` (1 or 2:
    pass 1 when numba runs this thread's calls on one thread, where a second part only rescans the rows)
    classes of layers are coded in parallel.

    The codes are the ids' entries in ``where``; then the row's ids take positions 0..M-1 and every
    other expert moves back by the number of the row's ids that were ahead of it. Up to SMALL experts
    that number is a popcount of the row's position bits above the expert's position, for all E
    experts at once (vectorizes); above, a walk of the list's first h + 1 positions (h the row's
    largest code), the only ones that change."""
    n = ids.shape[0]
    E = where.shape[1]
    bad = np.full(parts, n, np.int64)
    for part in prange(parts):  # each part scans the rows in file order
        if E <= SMALL:
            bad[part] = _encode_bits(ids, layer, where, part, parts, out)
        else:
            bad[part] = _encode_walk(ids, layer, where, part, parts, out)
    return bad.min()


@njit(inline="always")
def _popcount(x):
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return (x * np.uint64(0x0101010101010101)) >> np.uint64(56)  # LLVM makes this a popcnt instruction


@njit(nogil=True)
def _encode_bits(ids, layer, where, part, parts, out):
    """encode's rows of the layers ``part`` mod ``parts``, E <= SMALL: returns the first bad row or n.
    The state is copied to bytes (all layers' lists fit the L1 cache). A repeated id shows as a
    repeated position (``where`` is a permutation), so a row is checked once, by its bits' popcount,
    and the loop over its ids has no data-dependent branch but the range check."""
    n, m = ids.shape
    E = where.shape[1]
    zero, one, c64 = np.uint64(0), np.uint64(1), np.uint64(64)
    wher = np.empty(where.shape, np.uint8)
    for lay in range(part, where.shape[0], parts):
        for e in range(E):
            wher[lay, e] = where[lay, e]
    bad = n
    for i in range(n):
        if parts > 1 and layer[i] % parts != part:
            continue
        wh = wher[layer[i]]
        b0, b1 = zero, zero  # the row's positions: bit p of b0 (p < 64) or bit p - 64 of b1
        ok = True
        for r in range(m):
            e = np.uint64(ids[i, r])  # a negative id wraps around to a large one
            if e >= np.uint64(E):
                ok = False
                break
            p = np.uint64(wh[e])
            out[i, r] = p
            bit = one << (p & np.uint64(63))
            bit0 = bit if p < c64 else zero
            b0 |= bit0
            b1 |= bit ^ bit0
        if not ok or _popcount(b0) + _popcount(b1) != np.uint64(m):
            bad = i  # out of range, or a repeated id
            break
        high = np.int64(_popcount(b1))  # the row's positions above any position < 64 in b1
        for e in range(E):  # branch-free; a shift by >= 64 (p = 63 or 127) is selected away
            p = np.int64(wh[e])
            low = p < 64
            x = b0 if low else b1
            s = np.uint64(p + 1 if low else p - 63)
            above = (x >> s) if s < c64 else zero
            wh[e] = p + np.int64(_popcount(above)) + (high if low else 0)
        for r in range(m):
            wh[np.uint64(ids[i, r])] = r
    for lay in range(part, where.shape[0], parts):
        for e in range(E):
            where[lay, e] = wher[lay, e]
    return bad


@njit(nogil=True)
def _encode_walk(ids, layer, where, part, parts, out):
    """encode's rows of the layers ``part`` mod ``parts``: returns the first bad row or n. Walking the
    list's first h + 1 positions from the back, every expert that stays shifts back over the moved
    ones (branch-free: each is stored, and the next one overwrites a moved one), then the row fills
    the front. The walk uses unsigned 16-bit copies of the state (no negative-index checks, and a
    layer's state fits in the L1 cache)."""
    n, m = ids.shape
    E = where.shape[1]
    one = np.uint64(1)
    lists = np.empty(where.shape, np.uint16)  # position -> expert
    wher = np.empty(where.shape, np.uint16)  # expert -> position
    for lay in range(part, where.shape[0], parts):
        for e in range(E):
            lists[lay, where[lay, e]] = e
            wher[lay, e] = where[lay, e]
    mark = np.zeros(E, np.uint8)
    bad = n
    for i in range(n):
        if parts > 1 and layer[i] % parts != part:
            continue
        wh = wher[layer[i]]
        lst = lists[layer[i]]
        h = np.uint64(0)
        for r in range(m):
            e = ids[i, r]
            if e < 0 or e >= E or mark[e]:
                bad = i  # out of range, or a repeated id
                break
            mark[e] = 1
            p = np.uint64(wh[e])
            out[i, r] = p
            h = max(h, p)
        if bad < n:
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
    return bad


@cached_njit()
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
