"""Summaries of a trace that need only its metadata and key columns."""

from __future__ import annotations

import os

import numpy as np

from moesim.traces.meta import PHASES
from moesim.traces.reader import TraceFile


def trace_info(path: str | os.PathLike | TraceFile) -> dict:
    """Model, geometry, size and provenance of a trace, without decoding its scores."""
    tf = path if isinstance(path, TraceFile) else TraceFile(path)
    m = tf.meta
    keys = tf.read_keys()
    token_key = (keys.seq << 32) | keys.pos
    uniq, first = np.unique(token_key, return_index=True)
    phases = {PHASES[int(c)]: int(n) for c, n in zip(*np.unique(keys.phase[first], return_counts=True))}
    domains = {}
    if keys.domain is not None:
        codes, counts = np.unique(keys.domain[first], return_counts=True)
        domains = {(keys.domain_names[c] if c >= 0 else None): int(n) for c, n in zip(codes.tolist(), counts)}
    optional = [c for c in ("domain", "token", "selected", "weights") if c in tf.columns]
    return {
        "path": str(tf.path),
        "model": m.model_id,
        "family": m.family,
        "synthetic": bool(m.synthetic),
        "moe_layers": m.n_layers,
        "layer_indices": list(m.moe_layers),
        "dense_layers": list(m.dense_layers),
        "experts": m.n_experts,
        "top_k": m.top_k,
        "gating": m.gating,
        "norm_topk_prob": m.norm_topk_prob,
        "routed_scaling_factor": m.routed_scaling_factor,
        "shared_experts": m.n_shared_experts,
        "bytes_per_expert": dict(m.bytes_per_expert),
        "layout": m.layout,
        "candidates_per_row": m.n_candidates,
        "optional_columns": optional,
        "frequency_only": bool(m.frequency_only),
        "rows": tf.num_rows,
        "row_groups": tf.num_row_groups,
        "tokens": int(len(uniq)),
        "sequences": int(len(np.unique(keys.seq))),
        "phases": phases,
        "domains": domains,
        "size_bytes": tf.size_bytes,
        "tracer": dict(m.tracer),
        "source": dict(m.source),
    }
