"""The synthetic generator's inner loop (generator 2), jitted: per (token, layer, expert) the sticky
drift, the Gumbel noise and the quantized logit, and per (token, layer) the keys of the best
candidates. Cached by numba per component (moesim/jitcache.py); docs/synthetic.md.

Random numbers are counter-based: the draw of (token t, layer l, expert e) is splitmix64 of
key + (t * L + l) * E + e, so the trace does not depend on chunking or on the number of threads.
16 of its bits pick a normal (for the drift) and 16 others a Gumbel (the noise) from their quantile
functions at the 65,536 bucket centres u = (i + 0.5) / 65536: a table lookup the compiler can
vectorize. The discrete draws match the continuous ones to ~1e-4 in the bulk (the logits' grid is
1/32); the extreme buckets stand for the tails, so a normal is within +-4.33 and a Gumbel below
11.79 (each bound passed with probability 7.6e-6 by the continuous law).

Layer coupling (knob ``couple``): with probability ``couple`` an element uses the random bits its
predecessor at the previous layer uses (tests/synth_reference.py reads them off that definition). The
predecessor of the expert of popularity rank j is the expert of rank j at the layer below, so
``generate`` holds every layer's experts in rank order: a linked element copies the draws of the same
position one row down (a plain copy, no gather), and only the ~1 - couple unlinked ones look up the
quantile tables. A thread walks its range of layers a block of tokens at a time, keeping each token's
draws of the layer below (two rows of E), so nothing leaves the CPU cache. The two lists a row keeps (its
own-draw ranks and its keys under the threshold) are branch-free loops (a hand-written AVX-512 compress of
them gained ~6% of `moesim synth` end to end and was removed: docs/synthetic.md).
"""

import math

import numpy as np
from numba import njit, prange

from moesim.jitcache import cached_njit

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
TABLE = 65536
TAIL = 64  # buckets at each end computed exactly (the quantile function is steep there)
QMAX = 1 << 20  # logits are integers q * grid with |q| < QMAX
ID_BITS = 10  # a key packs (QMAX - q) and the expert id into an int32: E <= 1024


def tables() -> tuple[np.ndarray, np.ndarray]:
    """Normal and Gumbel quantile functions at u = (i + 0.5) / 65536, i = 0..65535 (float32)."""
    from statistics import NormalDist

    u = (np.arange(TABLE) + 0.5) / TABLE
    nd = NormalDist()
    normal = np.array([nd.inv_cdf(x) for x in u])
    gumbel = -np.log(-np.log(u))
    return normal.astype(np.float32), gumbel.astype(np.float32)


@njit(inline="always")
def _mix(x):
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@cached_njit(parallel=True, nogil=True)
def lookahead_rows(ids, q, k, n_layers, t0, key, noise_q, gtab, out):
    """The synthetic lookahead column of token-major rows [c * L] starting at token t0 (out [c * L, k]):
    per row the k best of the next layer's candidates ``ids`` after adding Gumbel noise (``noise_q``
    times a standard Gumbel, in the integer logit units of ``q``) to their logits, in rank order (equal
    scores: lower rank first); -1 on the last layer. The noise of (row r, candidate j) is a counter-based
    draw, independent of chunking."""
    n, M = ids.shape
    L = n_layers
    for r in prange(n):
        if r % L == L - 1:
            for j in range(k):
                out[r, j] = -1
            continue
        src = r + 1
        ctr = key + np.uint64((t0 * L + src) * M) * GOLDEN
        sc = np.empty(M, np.float32)
        for j in range(M):
            x = _mix(ctr + np.uint64(j) * GOLDEN)
            sc[j] = np.float32(q[src, j]) + noise_q * gtab[x >> np.uint64(48)]
        for j in range(k):
            b = 0
            for jj in range(1, M):
                if sc[jj] > sc[b]:
                    b = jj
            out[r, j] = ids[src, b]
            sc[b] = -np.inf


@cached_njit(parallel=True, nogil=True)
def generate(key, t0, n_layers, base, order, dom, newseq, z, rho, innov, drift, noise, inv_temp, offset, inv_grid,
             ntab, gtab, thr, m, width, keys, counts, qfull, lse_grid, lse, link16, bounds, block):
    """Tokens t0 .. t0 + c - 1 (c = len(dom)). The experts of every layer are held in rank order:
    ``order`` [L, E] (rank -> expert: coupling_order's popularity ranks, or any order without coupling),
    ``base`` [D, L, E] and the drift state ``z`` [L, E] (carried between calls) in that order. A linked
    expert takes the draws of its predecessor, the expert of the same rank at the layer below, so
    linking is a select between two rows, with no gather. ``bounds`` [P + 1] splits the layers into P
    ranges made in parallel; each walks its layers ``block`` tokens at a time, keeping the draws of
    the layer below in two rows per token. Neither changes the output.

    Per (token, layer) row (r = i * L + l), ``keys[r, :counts[r]]`` are int32 keys
    ((QMAX - q) << ID_BITS | e, smaller is better) that include the row's ``m`` best, in no particular
    order; thr [L] is each layer's adaptive threshold (in key units), carried between calls. With qfull
    non-empty, every expert's q goes there; with lse non-empty, the log-sum-exp of q * lse_grid."""
    for p in prange(bounds.shape[0] - 1):
        _layer_range(key, t0, n_layers, bounds[p], bounds[p + 1], base, order, dom, newseq, z, rho, innov, drift,
                     noise, inv_temp, offset, inv_grid, ntab, gtab, thr, m, width, keys, counts, qfull, lse_grid, lse,
                     link16, block)


@njit(nogil=True)
def _layer_range(key, t0, L, lo, hi, base, order, dom, newseq, z, rho, innov, drift, noise, inv_temp, offset,
                 inv_grid, ntab, gtab, thr, m, width, keys, counts, qfull, lse_grid, lse, link16, block):
    """generate's rows of layers lo .. hi - 1."""
    c = dom.shape[0]
    E = base.shape[2]
    full = qfull.shape[0] > 0
    want_lse = lse.shape[0] > 0
    link = np.uint64(link16)
    linked = link16 > 0
    target = (m + width) // 2
    nvs = np.empty((2, block, E), np.float32)  # the draws (normal, Gumbel) of layers l - 1 and l, alternating
    gvs = np.empty((2, block, E), np.float32)
    lo16 = np.empty(E, np.uint32)
    hi16 = np.empty(E, np.uint32)
    mine = np.empty(E, np.uint8)
    own = np.empty(E, np.int32)
    q = np.empty(E, np.int32)
    kk = np.empty(E, np.int32)
    qe = np.empty(E, np.int32)
    for i0 in range(0, c, block):
        i1 = min(c, i0 + block)
        if linked and lo > 0:  # the layer below the range, made by another range: follow the links down
            for i in range(i0, i1):
                _chain(key, t0 + i, L, lo - 1, order, link, ntab, gtab, nvs[(lo - 1) & 1, i - i0],
                       gvs[(lo - 1) & 1, i - i0])
        for l in range(lo, hi):
            ordl = order[l]
            chained = linked and l > 0
            for i in range(i0, i1):
                nv = nvs[l & 1, i - i0]
                gv = gvs[l & 1, i - i0]
                ctr = key + np.uint64(((t0 + i) * L + l) * E) * GOLDEN
                for j in range(E):  # vectorizes
                    x = _mix(ctr + np.uint64(ordl[j]) * GOLDEN)
                    lo16[j] = np.uint32((x >> np.uint64(16)) & np.uint64(0xFFFF))
                    hi16[j] = np.uint32(x >> np.uint64(48))
                    mine[j] = (x & np.uint64(0xFFFF)) >= link
                n = E
                if chained:
                    nvp = nvs[(l + 1) & 1, i - i0]
                    gvp = gvs[(l + 1) & 1, i - i0]
                    for j in range(E):  # the predecessor's draws (vectorizes); the own ones replace them below
                        nv[j] = nvp[j]
                        gv[j] = gvp[j]
                    n = flagged(mine, E, own)  # the ranks with own draws (~1 - couple of them)
                for k in range(n):  # table lookups only where needed
                    j = own[k] if chained else k
                    nv[j] = ntab[lo16[j]]
                    gv[j] = gtab[hi16[j]]
                r = i * L + l
                a = drift if newseq[i] else rho  # a new sequence starts from the drift's stationary law
                b = drift if newseq[i] else innov
                keep = np.float32(0.0) if newseq[i] else np.float32(1.0)
                bl = base[dom[i], l]
                zl = z[l]
                for j in range(E):  # vectorizes
                    zz = keep * a * zl[j] + b * nv[j]
                    zl[j] = zz
                    s = (bl[j] + zz + noise * gv[j]) * inv_temp + offset
                    qq = min(max(np.rint(s * inv_grid), np.float32(-QMAX + 1)), np.float32(QMAX - 1))
                    qi = np.int32(qq)
                    q[j] = qi
                    kk[j] = ((np.int32(QMAX) - qi) << ID_BITS) | ordl[j]
                th = thr[l]
                n_in = below(kk, E, th)  # the keys under the layer's threshold
                if n_in < m or n_in > width:
                    # the threshold missed this row: take the best `target` exactly, and restart the
                    # threshold from this row (rare once it has settled)
                    n_in, thr[l] = _exact(q, ordl, target, keys[r])
                else:
                    for j in range(n_in):
                        keys[r, j] = kk[j]
                    # aim the next row at ~ target candidates (one q unit is ~0.2 experts near the edge)
                    if n_in < target:
                        thr[l] = th + (4 << ID_BITS)
                    elif n_in > target:
                        thr[l] = th - (4 << ID_BITS)
                for j in range(n_in, width):
                    keys[r, j] = 2147483647
                counts[r] = n_in
                if full or want_lse:
                    for j in range(E):  # expert order: the log-sum-exp adds in it
                        qe[ordl[j]] = q[j]
                if full:
                    for e in range(E):
                        qfull[r, e] = qe[e]
                if want_lse:
                    mx = -1e300
                    for e in range(E):
                        mx = max(mx, qe[e] * lse_grid)
                    acc = 0.0
                    for e in range(E):
                        acc += math.exp(qe[e] * lse_grid - mx)
                    lse[r] = mx + math.log(acc)


@njit(inline="always")
def flagged(flags, E, out):
    """out[:n] = the indices j < E with flags[j] != 0, in order; returns n (out: int32 [>= E])."""
    n = 0
    for i in range(E):  # branch-free
        out[n] = i
        n += flags[i] != 0
    return n


@njit(inline="always")
def below(keys, E, th):
    """Keep keys[:E] below th at the front of keys, in order; returns how many (int32 keys)."""
    n = 0
    for i in range(E):  # branch-free
        keys[n] = keys[i]
        n += keys[i] < th
    return n


@njit(inline="always")
def _chain(key, t, L, l, order, link, ntab, gtab, nv, gv):
    """The draws of row (t, l) (rank order) into nv, gv, each rank following its links down to its first
    own draw (~1 / (1 - couple) steps)."""
    E = nv.shape[0]
    for j in range(E):
        ll = l + 1
        linked = True
        while linked:  # layer 0 has no predecessor
            ll -= 1
            x = _mix(key + np.uint64((t * L + ll) * E) * GOLDEN + np.uint64(order[ll, j]) * GOLDEN)
            linked = ll > 0 and (x & np.uint64(0xFFFF)) < link
        nv[j] = ntab[(x >> np.uint64(16)) & np.uint64(0xFFFF)]
        gv[j] = gtab[x >> np.uint64(48)]


@njit(inline="always")
def _exact(q, ids, n, out):
    """The n best keys of a row (sorted) of logits q [E] of experts ids [E], and the key just after them
    (the next threshold)."""
    E = q.shape[0]
    ks = np.empty(E, np.int32)
    for e in range(E):
        ks[e] = ((np.int32(QMAX) - q[e]) << ID_BITS) | ids[e]
    ks.sort()
    n = min(E, n)
    for j in range(n):
        out[j] = ks[j]
    return n, ks[n] if n < E else np.int32(2147483647)
