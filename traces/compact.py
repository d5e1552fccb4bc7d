"""Convert a dense or sparse trace to the compact ranked layout, row for row, streamed.

The ranked layout keeps what a replay and a step policy read: the candidates in the rank order the
decoder computes, their router logits, and the selection and weights where the trace stores them.
Decoding the result gives the same ``cand``, ``sel``, ``w`` and ``logits`` arrays bit for bit, so every
replay decision and counter is unchanged (tests/test_format_ranked.py). What it drops: ``lse`` (the
softmax probabilities of the candidates over all E experts; the logits keep every ratio among them),
docs/trace-format.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from moesim.errors import MoesimError
from moesim.traces.meta import RANKED_SCHEMA_VERSION
from moesim.traces.reader import TraceFile
from moesim.traces.routing import _gate_inputs, read_lookahead
from moesim.traces.writer import DEFAULT_ROW_GROUP, TraceWriter


def compact_trace(src: str | os.PathLike | TraceFile, dst: str | os.PathLike, *,
                  row_group_size: int = DEFAULT_ROW_GROUP, compression_level: int | None = None) -> Path:
    """Write ``src`` (dense or sparse) as a ranked trace at ``dst``: the candidates ranked, their logits
    (float32, as stored), the selection when it is not the k first-ranked candidates, and stored weights.
    A selected-only import written before the ``scores`` metadata field (placeholder scores, all equal)
    is marked ``scores: false``."""
    tf = src if isinstance(src, TraceFile) else TraceFile(src)
    meta = tf.meta
    if meta.layout not in ("dense", "sparse"):
        raise MoesimError(f"{tf.path}: only dense and sparse traces convert to the ranked layout "
                          f"(this one is {meta.layout}" + (", schema version 2: it is read as it is"
                                                           if meta.layout == "ranked" else "") + ")")
    keys = tf.read_keys()
    idx = tf.index_keys(keys)
    L = meta.n_layers
    layer_ord = idx.target % L
    has_sel, has_w = "selected" in tf.columns, "weights" in tf.columns
    # group-limited routing without a selected column: the converter resolves the selection once
    explicit_sel = has_sel or (meta.gating == "sigmoid" and meta.n_group > 1)
    scores = meta.scores
    if scores and meta.tie_order == "stored":
        from moesim.traces.routing import placeholder_scores

        scores = not all(placeholder_scores(meta, g.ranked_vals) for _, g in _gate_inputs(tf, layer_ord))
    out_meta = meta.replace(layout="ranked", schema_version=RANKED_SCHEMA_VERSION, scores=scores)
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
            x = g.ranked_vals.astype(np.float32)
            if not np.array_equal(x, g.ranked_vals):
                raise MoesimError(f"{tf.path}: the trace's logits are not float32 values; the ranked layout stores "
                                  "float32 logits")
            extra: dict = {}
            if explicit_sel:
                extra["selected"] = g.sel
            if has_w:
                extra["weights"] = g.raw_weights
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
                         phase=phases[keys.phase[rows]], ranked_ids=g.ranked, ranked_logits=x, **extra)
    return Path(dst)
