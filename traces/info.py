"""Summaries of a trace that need only its metadata and key columns."""

from __future__ import annotations

import os

import numpy as np

from moesim.traces.meta import PHASES
from moesim.traces.reader import TraceFile


def trace_info(path: str | os.PathLike | TraceFile) -> dict:
    """Model, geometry, size and provenance of a trace, without decoding its scores.

    It reads the metadata and the key columns (seq, pos, layer, phase, domain,
    token: ~10 bytes a row) and checks the key structure (known layers, no
    duplicate rows, every token has every MoE layer). It does not read the score
    columns, so NaN scores or out-of-range expert ids are found by
    ``validate_trace`` (``moesim validate``), not here.
    """
    tf = path if isinstance(path, TraceFile) else TraceFile(path)
    m = tf.meta
    keys = tf.read_keys()
    idx = tf.index_keys(keys)
    first = idx.tok_rows
    counts_layout = m.layout == "counts"
    phases = {}
    for code, n in zip(*np.unique(keys.phase[first], return_counts=True)):
        phases["all (whole request)" if code < 0 else PHASES[int(code)]] = int(n)
    domains = {}
    if keys.domain is not None:
        codes, counts = np.unique(keys.domain[first], return_counts=True)
        domains = {(keys.domain_names[c] if c >= 0 else None): int(n) for c, n in zip(codes.tolist(), counts)}
    optional = [c for c in ("phase", "domain", "token", "selected", "weights")
                if c in tf.columns and not (c == "phase" and not counts_layout)]
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
        "schema_version": m.schema_version,
        "candidate_scores": m.has_scores,
        "tie_order": m.tie_order,
        "columns": list(tf.columns),
        "optional_columns": optional,
        "frequency_only": bool(m.frequency_only),
        "rows": tf.num_rows,
        "row_groups": tf.num_row_groups,
        "tokens": None if counts_layout else idx.n_tokens,
        "requests": idx.n_tokens if counts_layout else None,
        "sequences": int(len(np.unique(keys.seq))),
        "phases": phases,
        "domains": domains,
        "size_bytes": tf.size_bytes,
        "scores_checked": False,
        "tracer": dict(m.tracer),
        "source": dict(m.source),
    }
