"""Convert a dense or sparse trace to the compact ranked layout, row for row, streamed.

The ranked layout keeps what a replay reads and nothing else: the candidates in the rank order the
decoder computes, the selection, and the scores its gate weights come from. Decoding the result
gives the same ``cand``, ``sel`` and ``w`` arrays bit for bit, so every replay decision and counter
is unchanged (tests/test_format_ranked.py). What it drops: the logits of candidates that are not
selected and ``lse`` (so softmax probabilities of unselected experts), docs/trace-format.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from moesim.errors import MoesimError
from moesim.traces.reader import TraceFile
from moesim.traces.routing import _gate_inputs, read_lookahead
from moesim.traces.writer import DEFAULT_ROW_GROUP, TraceWriter

MAX_SCALE_BITS = 24  # logits on a grid of 2^-p, p <= 24, are stored as integer gaps


def _grid_bits(x: np.ndarray) -> int | None:
    """Smallest p <= MAX_SCALE_BITS with every value of x an integer multiple of 2^-p, the gaps between
    neighbours (x is ranked, descending) below 65536 units and |x| * 2^p exact; None if there is none."""
    for p in range(MAX_SCALE_BITS + 1):
        q = x * 2.0 ** p
        if np.array_equal(q, np.rint(q)) and np.abs(q).max(initial=0) < 2 ** 52:
            gaps = q[:, :-1] - q[:, 1:]
            return p if gaps.size == 0 or (gaps.min() >= 0 and gaps.max() < 65536) else None
    return None


def compact_trace(src: str | os.PathLike | TraceFile, dst: str | os.PathLike, *,
                  row_group_size: int = DEFAULT_ROW_GROUP, compression_level: int = 9) -> Path:
    """Write ``src`` (dense or sparse) as a ranked trace at ``dst``. Gate logits go as integer gaps
    when the k first-ranked logits of every row lie on a power-of-two grid (synthetic traces, and
    real routers' logits when they are that coarse), else as float32 logits; stored weights stay."""
    tf = src if isinstance(src, TraceFile) else TraceFile(src)
    meta = tf.meta
    if meta.layout not in ("dense", "sparse"):
        raise MoesimError(f"{tf.path}: only dense and sparse traces convert to the ranked layout "
                          f"(this one is {meta.layout})")
    keys = tf.read_keys()
    idx = tf.index_keys(keys)
    L = meta.n_layers
    layer_ord = idx.target % L
    has_sel, has_w = "selected" in tf.columns, "weights" in tf.columns
    # pass 1: the kind of gate scores, and for gaps the grid
    bits: int | None = -1
    explicit_sel = has_sel
    for _, g in _gate_inputs(tf, layer_ord):
        explicit_sel = explicit_sel or not g.first_k
        if has_w or explicit_sel or meta.gating == "sigmoid" or meta.top_k < 2:
            bits = None
        elif bits is not None:
            b = _grid_bits(g.sel_logits)
            bits = None if b is None else max(bits, b)
        if g.sel_logits is not None and not np.array_equal(g.sel_logits.astype(np.float32), g.sel_logits):
            raise MoesimError(f"{tf.path}: the trace's logits are not float32 values; the ranked layout stores "
                              "float32 gate logits")
    scale = None if bits is None or bits < 0 else 2.0 ** -bits
    out_meta = meta.replace(layout="ranked", logit_scale=scale, schema_version=2)
    look = None
    if "lookahead" in tf.columns:
        look = read_lookahead(tf, idx.target).reshape(-1, meta.top_k)
    writer = TraceWriter(dst, out_meta, domains=keys.domain_names if keys.domain is not None else None,
                         token=keys.token is not None, selected=explicit_sel, weights=has_w,
                         row_group_size=row_group_size, compression_level=compression_level, inputs=(tf.path,),
                         lookahead=look is not None)
    phases = np.array(["prefill", "decode", "decode"])  # codes 0, 1; -1 (counts only) never here
    with writer:
        for rows, g in _gate_inputs(tf, layer_ord):
            extra: dict = {}
            if explicit_sel:
                extra["selected"] = g.sel
            if has_w:
                extra["weights"] = g.raw_weights
            elif scale is not None:
                q = np.rint(g.sel_logits / scale).astype(np.int64)
                extra["gate_gaps"] = q[:, :-1] - q[:, 1:]
            else:
                extra["gate_logits"] = g.sel_logits
            if keys.domain is not None:
                d = keys.domain[rows]
                if (d < 0).any():
                    raise MoesimError(f"{tf.path}: rows without a domain (null) cannot be written")
                extra["domain"] = np.asarray(keys.domain_names, dtype=object)[d]
            if keys.token is not None:
                extra["token"] = keys.token[rows]
            if look is not None:
                extra["lookahead"] = look[idx.target[rows]]
            writer.write(seq=keys.seq[rows], pos=keys.pos[rows], layer=keys.layer[rows],
                         phase=phases[keys.phase[rows]], ranked_ids=g.ranked, **extra)
    return Path(dst)
