"""The LRU stack-distance pass (numba): see sweeps/mrc.py."""

import numpy as np

from moesim.jitcache import cached_njit


@cached_njit(inline="always")
def _bit_add(bit, i, v):
    i += 1
    n = bit.shape[0]
    while i < n:
        bit[i] += v
        i += i & (-i)


@cached_njit(inline="always")
def _bit_prefix(bit, i):
    """Sum of positions 0..i (0 when i < 0)."""
    s = 0
    i += 1
    while i > 0:
        s += bit[i]
        i -= i & (-i)
    return s


@cached_njit()
def _distance(bit, last, o, pos, cold):
    """Stack distance of a request to object o at stream position pos; moves o's mark to pos."""
    p = last[o]
    if p < 0:
        d = cold
    else:
        d = _bit_prefix(bit, pos - 1) - _bit_prefix(bit, p)
        _bit_add(bit, p, -1)
    _bit_add(bit, pos, 1)
    last[o] = pos
    return d


@cached_njit()
def _forget(bit, last):
    for o in range(last.shape[0]):
        if last[o] >= 0:
            _bit_add(bit, last[o], -1)
            last[o] = -1


@cached_njit()
def _histograms(sel, n_experts, tok_seq, warmup_tokens, reset_per_seq, tok_unit, n_rows):
    """LRU stack-distance histograms of the requests of tokens >= warmup_tokens (the cache still sees the
    earlier ones), a row per layer (``tok_unit`` empty) or per resampling unit ``tok_unit[t]`` (-1: not
    counted): (per_layer [n_rows, E+1]: distance within the layer's own stream, column E = first request
    (never a hit); pooled [n_rows, L*E+1]: distance in the global (token, layer, rank) stream, column L*E =
    first request). reset_per_seq: every sequence starts with an empty cache. sel < 0 is padding."""
    T, L, k = sel.shape
    E = n_experts
    by_layer = tok_unit.shape[0] == 0
    per_layer = np.zeros((n_rows, E + 1), np.int64)
    pooled = np.zeros((n_rows, L * E + 1), np.int64)
    bit = np.zeros(T * k + 1, np.int32)
    last = np.full(E, -1, np.int64)
    for l in range(L):
        bit[:] = 0
        last[:] = -1
        pos = 0
        for t in range(T):
            if reset_per_seq and t > 0 and tok_seq[t] != tok_seq[t - 1]:
                _forget(bit, last)
            row = l if by_layer else tok_unit[t]
            for r in range(k):
                e = sel[t, l, r]
                if e < 0:
                    continue
                d = _distance(bit, last, e, pos, E)
                pos += 1
                if t >= warmup_tokens and row >= 0:
                    per_layer[row, d] += 1
    gbit = np.zeros(T * L * k + 1, np.int32)
    glast = np.full(L * E, -1, np.int64)
    pos = 0
    for t in range(T):
        if reset_per_seq and t > 0 and tok_seq[t] != tok_seq[t - 1]:
            _forget(gbit, glast)
        for l in range(L):
            row = l if by_layer else tok_unit[t]
            for r in range(k):
                e = sel[t, l, r]
                if e < 0:
                    continue
                d = _distance(gbit, glast, l * E + e, pos, L * E)
                pos += 1
                if t >= warmup_tokens and row >= 0:
                    pooled[row, d] += 1
    return per_layer, pooled


def stack_histograms(sel, n_experts, tok_seq, warmup_tokens, reset_per_seq):
    """Histograms of LRU stack distances by layer: (per_layer [L, E+1], pooled [L, L*E+1]) (_histograms)."""
    return _histograms(sel, n_experts, tok_seq, warmup_tokens, reset_per_seq, np.empty(0, np.int64), sel.shape[1])


def unit_histograms(sel, n_experts, tok_seq, warmup_tokens, reset_per_seq, tok_unit, n_units):
    """As stack_histograms, summed over layers and split by resampling unit (``tok_unit[t]``, -1: not
    counted): (per_layer [n_units, E+1], pooled [n_units, L*E+1]). The hits of unit u at N slots per
    layer are the sum of per_layer[u, :N] (per-layer caches) or of pooled[u, :N*L] (one pool)."""
    return _histograms(sel, n_experts, tok_seq, warmup_tokens, reset_per_seq, tok_unit, n_units)
