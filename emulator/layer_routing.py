"""Router outputs of one forward pass -> the Routing the replay reads, exactly as a trace of the
same pass would decode (the tracer's sparse rows, then traces.routing.decode_scores)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moesim.traces import gating
from moesim.traces.meta import TraceMeta
from moesim.traces.routing import Routing, decode_scores
from moesim.traces.tracers.recorder import candidate_count, sparse_rows


def trace_meta(fields: dict, bias: dict[int, np.ndarray], *, layout: str, candidates: int | None) -> TraceMeta:
    """The TraceMeta a RouterRecorder opens with these fields (tracers.torch_hooks.trace_fields)."""
    f = dict(fields)
    E, k = int(f["n_experts"]), int(f["top_k"])
    M = candidate_count(candidates, E, k, layout)
    f.update(layout=layout, n_candidates=M)
    layers = list(f["moe_layers"])
    rows = [np.asarray(bias[i], dtype=np.float64) for i in layers] if bias else []
    if rows and any(b.any() for b in rows):
        f["selection_bias"] = [b.tolist() for b in rows]
    return TraceMeta(**f)


@dataclass
class Tokens:
    """Per-token keys of a run, in replay order (window by window, position by position)."""

    seq: np.ndarray
    pos: np.ndarray
    domain: np.ndarray        # codes into domain_names, -1 for none
    domain_names: list[str]
    token: np.ndarray


@dataclass
class LayerRows:
    """One MoE layer's routing over a run: rank-ordered selection and the model's column order."""

    sel: np.ndarray     # [T, k] int16, rank order
    w: np.ndarray       # [T, k] float32, normalized
    cand: np.ndarray    # [T, M] int16, best selection score first
    perm: np.ndarray    # [T, k]: rank r of token t is the router's output column perm[t, r]
    logits: np.ndarray  # [T, M] float32, the candidates' router logits (Routing.logits)


def layer_rows(meta: TraceMeta, ordinal: int, logits: np.ndarray, selected: np.ndarray,
               weights: np.ndarray) -> LayerRows:
    """Decode one layer's router output (logits [T, E], the model's selected ids and gate weights
    [T, k], in the router's column order) as the tracer would record and the reader decode it."""
    logits = np.asarray(logits, dtype=np.float32)
    sel = np.asarray(selected, dtype=np.int64)
    w32 = np.asarray(weights, dtype=np.float32)
    bias = None
    if meta.selection_bias is not None:
        bias = np.asarray(meta.selection_bias[ordinal], dtype=np.float64)
    if meta.layout == "dense":
        ids = np.broadcast_to(np.arange(meta.n_experts, dtype=np.int64), logits.shape)
        vals = logits.astype(np.float64)
    else:
        top, top_logits = sparse_rows(logits, meta.n_candidates, meta.gating, bias, sel)
        ids, vals = top.astype(np.int64), top_logits.astype(np.float64)
    bias_rows = bias[ids] if bias is not None else None
    ww = w32.astype(np.float64)
    ranked, s_ord, w_ord, ranked_logits = decode_scores(meta, ids, vals, bias_rows, sel, ww)
    # decode_scores ranks the selection with order_selected = rank_rows; the same permutation maps
    # each rank back to the router's output column
    perm = gating.rank_order(sel, gating.normalize(ww), ids_sorted=meta.tie_order == "stored")
    return LayerRows(s_ord.astype(np.int16), w_ord.astype(np.float32), ranked.astype(np.int16), perm, ranked_logits)


def routing_of(meta: TraceMeta, tokens: Tokens, layers: list[LayerRows], ordinals: list[int]) -> Routing:
    """A Routing of the given MoE layers (ordinals into ``meta.moe_layers``)."""
    ids = tuple(meta.moe_layers[i] for i in ordinals)
    bias = None
    if meta.selection_bias is not None:
        bias = tuple(meta.selection_bias[i] for i in ordinals)
    sub = meta.replace(moe_layers=ids, selection_bias=bias,
                       dense_layers=tuple(x for x in meta.dense_layers if x not in ids))
    T = len(tokens.seq)
    return Routing(
        meta=sub, seq=tokens.seq, pos=tokens.pos, phase=np.zeros(T, np.int8), domain=tokens.domain,
        domain_names=tokens.domain_names, token=tokens.token,
        sel=np.stack([x.sel for x in layers], axis=1),
        w=np.stack([x.w for x in layers], axis=1),
        cand=np.stack([x.cand for x in layers], axis=1),
        logits=np.stack([x.logits for x in layers], axis=1),
    )
