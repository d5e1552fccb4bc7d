"""Read ranked traces of schema version 2, which moesim wrote before version 3 and no longer writes:
move-to-front coded candidate ids and only the scores the gate weights need (docs/trace-format.md,
"Version 2"). Plain numpy, vectorized over the MoE layers of a token rather than fast: ~0.1 s per
100,000 rows. They decode exactly as the version-2 decoder did (tests/test_format_ranked_v2.py, on
files that decoder's writer made), without candidate scores (Routing.logits is None).

Move-to-front: every MoE layer keeps a list of its E experts, 0..E-1 at the first row of every row
group; a row stores each of its M ranked experts' position in its layer's list before the row (one
byte each for E <= 256, else the M low bytes then the M high bytes), then its experts move to the
front in rank order, the others keeping their order behind them.
"""

from __future__ import annotations

import numpy as np

from moesim.errors import MoesimError
from moesim.traces import gating
from moesim.traces import ranked as rk


def unpack(raw: np.ndarray, m: int, width: int) -> np.ndarray:
    """Codes [n, M] int64 of bytes [n, M * width] (width 2: the M low bytes, then the M high bytes)."""
    if width == 1:
        return raw.astype(np.int64)
    return raw[:, :m].astype(np.int64) | (raw[:, m:].astype(np.int64) << 8)


def move_to_front_decode(codes: np.ndarray, layer: np.ndarray, lists: np.ndarray) -> tuple[np.ndarray, int]:
    """Ranked ids [n, M] of move-to-front codes [n, M] whose layer ordinals are ``layer`` [n]; ``lists``
    [L, E] (position -> expert per layer) is the state, updated. Returns (ids, the first row whose codes
    leave 0..E-1 or repeat one, else n); on a bad row nothing is decoded. Rows are decoded in waves: the
    i-th row of every layer together (distinct layers, so independent), the waves in file order."""
    n, m = codes.shape
    E = lists.shape[1]
    out = np.zeros((n, m), np.int64)
    if n == 0:
        return out, 0
    srt = np.sort(codes, axis=1)
    bad = (srt[:, 0] < 0) | (srt[:, -1] >= E) | (srt[:, 1:] == srt[:, :-1]).any(axis=1)
    if bad.any():
        return out, int(np.argmax(bad))
    by_layer = np.argsort(layer, kind="stable")
    lay = layer[by_layer]
    first = np.r_[0, np.flatnonzero(lay[1:] != lay[:-1]) + 1]
    wave = np.empty(n, np.int64)
    wave[by_layer] = np.arange(n) - np.repeat(first, np.diff(np.r_[first, n]))
    by_wave = np.argsort(wave, kind="stable")
    bounds = np.r_[0, np.flatnonzero(np.diff(wave[by_wave])) + 1, n]
    for a, b in zip(bounds[:-1], bounds[1:]):
        rows = by_wave[a:b]
        ls = layer[rows]
        lst = lists[ls]
        c = codes[rows]
        ids = np.take_along_axis(lst, c, axis=1)
        out[rows] = ids
        moved = np.zeros(lst.shape, dtype=bool)
        np.put_along_axis(moved, c, True, axis=1)
        lists[ls] = np.concatenate([ids, lst[~moved].reshape(len(rows), E - m)], axis=1)
    return out, n


def gaps_of(low_col, high_col, width: int) -> np.ndarray:
    """The gate gaps int64 [n, width]: low bytes, plus the high bytes in rows where they are not null."""
    g = rk.binary_rows(low_col, width).astype(np.int64)
    if high_col is not None and high_col.null_count < len(high_col):
        rows = np.asarray(high_col.is_valid())
        g[rows] |= rk.binary_rows(high_col, width)[rows].astype(np.int64) << 8
    return g


def batches(tf, layer_ord: np.ndarray, row_groups: list[int] | None = None):
    """_decoded_batches of a version-2 ranked trace: (rows, ranked [n, M], selected in rank order [n, k],
    normalized weights [n, k], None: no candidate scores)."""
    from moesim.traces.routing import _check_ids, _fixed, _normalized, _weights

    meta = tf.meta
    L, k, E, M = meta.n_layers, meta.top_k, meta.n_experts, meta.n_candidates
    has_sel, has_w = "selected" in tf.columns, "weights" in tf.columns
    gaps = meta.logit_scale is not None
    logits = not gaps and not has_w
    stored = meta.tie_order == "stored"
    width = rk.code_width(E)
    cols = ["ranked_ids"] + ["gate_gaps", "gate_gaps_high"] * gaps + ["gate_logits"] * logits \
        + ["selected"] * has_sel + ["weights"] * has_w
    lists = None
    for start, first, batch in tf.iter_group_batches(cols, row_groups=row_groups):
        n = batch.num_rows
        rows = slice(start, start + n)
        if first or lists is None:
            lists = np.tile(np.arange(E, dtype=np.int64), (L, 1))  # the state restarts at every row group
        col = batch.column("ranked_ids")
        if col.null_count:
            raise MoesimError(f"{tf.path}: column ranked_ids has missing values")
        codes = unpack(rk.binary_rows(col, M * width), M, width)
        # layer_ord is only sliced by file rows (a streamed decode passes one row group's ordinals)
        ranked, good = move_to_front_decode(codes, np.asarray(layer_ord[rows], dtype=np.int64), lists)
        if good < n:
            raise MoesimError(f"{tf.path}: column ranked_ids row {start + good} holds a code out of 0..{E - 1} or "
                              "repeats one (damaged file)")
        if has_sel:
            s = _fixed(batch.column("selected"), k, np.int64, "selected", tf.path)
            _check_ids(s, E, "selected", tf.path)
        else:
            s = ranked[:, :k]
        if has_w:
            ww = _normalized(_weights(batch, k, tf.path), str(tf.path))
        elif gaps:
            gcol = batch.column("gate_gaps")
            if gcol.null_count:
                raise MoesimError(f"{tf.path}: column gate_gaps has missing values")
            g = gaps_of(gcol, batch.column("gate_gaps_high"), k - 1)
            x = np.zeros((n, k), dtype=np.float64)
            # logits relative to the first-ranked one: softmax gate weights do not change under a shift
            np.cumsum(-g, axis=1, out=x[:, 1:])
            ww = gating.gate_weights(x * meta.logit_scale, meta.gating)
        else:
            gl = _fixed(batch.column("gate_logits"), k, np.float64, "gate_logits", tf.path)
            if not np.isfinite(gl).all():
                raise MoesimError(f"{tf.path}: column gate_logits holds NaN or infinite values")
            ww = gating.gate_weights(gl, meta.gating)
        s_ord, w_ord = gating.order_selected(s, ww, keep_stored=stored)
        yield rows, ranked, s_ord, w_ord, None
