"""Decode a trace once into the routing arrays every replay shares."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from moesim.errors import MoesimError
from moesim.traces import gating
from moesim.traces.meta import PHASES, TraceMeta
from moesim.traces.reader import TraceFile


@dataclass
class Routing:
    """A decoded trace. Tokens are ordered by (seq, pos); axis 1 is the MoE layer
    ordinal (``meta.moe_layers[l]`` is its original index).

    - ``sel`` [T, L, k] int16: the selected experts, rank 0 (highest gate weight) first;
    - ``w`` [T, L, k] float32: their gate weights, normalized to sum to 1;
    - ``cand`` [T, L, M] int16: the scored experts, best selection score first;
    - per token: ``seq``, ``pos``, ``phase`` (codes into PHASES), ``domain``
      (codes into ``domain_names``, -1 for none), ``token`` (ids or None).
    """

    meta: TraceMeta
    seq: np.ndarray
    pos: np.ndarray
    phase: np.ndarray
    domain: np.ndarray
    domain_names: list[str]
    token: np.ndarray | None
    sel: np.ndarray
    w: np.ndarray
    cand: np.ndarray
    digest: str = ""
    path: Path | None = None
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def n_tokens(self) -> int:
        return self.sel.shape[0]

    @property
    def n_layers(self) -> int:
        return self.sel.shape[1]

    @property
    def n_experts(self) -> int:
        return self.meta.n_experts

    @property
    def top_k(self) -> int:
        return self.sel.shape[2]

    @property
    def n_candidates(self) -> int:
        return self.cand.shape[2]

    @property
    def n_sequences(self) -> int:
        return int(len(np.unique(self.seq)))

    @property
    def synthetic(self) -> bool:
        return bool(self.meta.synthetic)

    def select_tokens(self, mask: np.ndarray) -> Routing:
        """A Routing restricted to the tokens where ``mask`` is true (e.g. one domain)."""
        m = np.asarray(mask, dtype=bool)
        return Routing(self.meta, self.seq[m], self.pos[m], self.phase[m], self.domain[m], self.domain_names,
                       None if self.token is None else self.token[m], self.sel[m], self.w[m], self.cand[m],
                       digest=f"{self.digest}:subset", path=self.path)


def load_routing(path: str | os.PathLike | TraceFile, *, candidates: int | None = None) -> Routing:
    """Read, validate and decode a trace. ``candidates`` keeps only the best M
    scored experts per step (the substitution candidates); default: all stored."""
    tf = path if isinstance(path, TraceFile) else TraceFile(path)
    return decode(tf, candidates=candidates)


def decode(tf: TraceFile, *, candidates: int | None = None) -> Routing:
    meta = tf.meta
    if meta.frequency_only:
        raise MoesimError(f"{tf.path}: a frequency-only trace (expert counts without time order) cannot be decoded "
                          "into routing steps; 'moesim profile' reads it, replay needs an ordered trace")
    L, k, E = meta.n_layers, meta.top_k, meta.n_experts
    M = meta.n_candidates if candidates is None else int(candidates)
    if not (k <= M <= meta.n_candidates):
        raise MoesimError(f"candidates must be between k={k} and the {meta.n_candidates} the trace stores, got {M}")
    keys = tf.read_keys()
    target, tok_rows, T = _row_targets(tf, keys)

    sel = np.empty((T * L, k), dtype=np.int16)
    w = np.empty((T * L, k), dtype=np.float32)
    cand = np.empty((T * L, M), dtype=np.int16)
    bias = np.asarray(meta.selection_bias, dtype=np.float64) if meta.selection_bias is not None else None
    layer_ord = target % L
    cols = ["logits"] if meta.layout == "dense" else ["top_ids", "top_logits", "lse"]
    has_sel, has_w = "selected" in tf.columns, "weights" in tf.columns
    cols += ["selected"] * has_sel + ["weights"] * has_w
    start = 0
    for batch in tf.iter_batches(cols):
        n = batch.num_rows
        rows = slice(start, start + n)
        tgt = target[rows]
        ids, vals = _scores(batch, meta, tf.path)
        bias_rows = None
        if bias is not None:
            bias_rows = bias[layer_ord[rows][:, None], ids.astype(np.int64)]
        score = gating.selection_scores(vals, meta.gating, bias_rows)
        ranked_ids, _ = gating.rank_rows(ids, score, ids_sorted=meta.layout == "dense")
        cand[tgt] = ranked_ids[:, :M]
        if has_sel:
            s = _fixed(batch.column("selected"), k, np.int64, "selected", tf.path)
            _check_ids(s, E, "selected", tf.path)
            if has_w:
                ww = _fixed(batch.column("weights"), k, np.float64, "weights", tf.path)
                if not np.isfinite(ww).all():
                    raise MoesimError(f"{tf.path}: column weights holds NaN or infinite values")
                try:
                    ww = gating.normalize(ww)
                except MoesimError as exc:
                    raise MoesimError(f"{tf.path}: {exc}") from None
            else:
                sel_logits, found = gating.lookup(ids, vals, s, dense=meta.layout == "dense")
                if not found.all():
                    raise MoesimError(f"{tf.path}: a selected expert is not among the row's scored candidates and "
                                      "the trace stores no weights to weigh it")
                ww = gating.gate_weights(sel_logits, meta.gating)
        else:
            if meta.gating == "sigmoid" and meta.n_group > 1:
                if meta.layout != "dense":
                    raise MoesimError(f"{tf.path}: group-limited sigmoid routing needs dense logits or a "
                                      "'selected' column")
                s = gating.group_limited_topk(score, k, meta.n_group, meta.topk_group)
            else:
                s = ranked_ids[:, :k].astype(np.int64)
            sel_logits, _ = gating.lookup(ids, vals, s, dense=meta.layout == "dense")
            ww = gating.gate_weights(sel_logits, meta.gating)
        s_ord, w_ord = gating.order_selected(s, ww)
        sel[tgt] = s_ord
        w[tgt] = w_ord
        start += n

    shape = (T, L)
    return Routing(
        meta=meta,
        seq=keys.seq[tok_rows].astype(np.int32),
        pos=keys.pos[tok_rows].astype(np.int32),
        phase=keys.phase[tok_rows].astype(np.int8),
        domain=(keys.domain[tok_rows] if keys.domain is not None else np.full(T, -1)).astype(np.int16),
        domain_names=keys.domain_names,
        token=keys.token[tok_rows].astype(np.int32) if keys.token is not None else None,
        sel=sel.reshape(*shape, k),
        w=w.reshape(*shape, k),
        cand=cand.reshape(*shape, M),
        digest=tf.digest,
        path=tf.path,
    )


def _row_targets(tf: TraceFile, keys) -> tuple[np.ndarray, np.ndarray, int]:
    """Map each row to its slot token * L + layer ordinal; check that every token
    has each MoE layer exactly once. Returns (targets, one row per token, T)."""
    meta = tf.meta
    L = meta.n_layers
    lut_size = max(max(meta.moe_layers), int(keys.layer.max(initial=0))) + 1
    lut = np.full(lut_size, -1, dtype=np.int64)
    lut[list(meta.moe_layers)] = np.arange(L)
    bad = (keys.layer < 0) | (lut[np.clip(keys.layer, 0, lut_size - 1)] < 0)
    if bad.any():
        raise MoesimError(f"{tf.path}: layer {int(keys.layer[bad][0])} is not one of the MoE layers the metadata "
                          f"lists ({_layers(meta.moe_layers)})")
    ordinal = lut[keys.layer]
    token_key = (keys.seq << 32) | keys.pos
    uniq, inverse = np.unique(token_key, return_inverse=True)
    T = len(uniq)
    target = inverse * L + ordinal
    counts = np.bincount(target, minlength=T * L)
    if (counts > 1).any():
        slot = int(np.argmax(counts > 1))
        s, p = divmod(int(uniq[slot // L]), 1 << 32)
        raise MoesimError(f"{tf.path}: duplicate rows for (seq={s}, pos={p}, layer={meta.moe_layers[slot % L]})")
    if (counts == 0).any():
        slot = int(np.argmax(counts == 0))
        s, p = divmod(int(uniq[slot // L]), 1 << 32)
        missing = int(((counts.reshape(T, L) == 0).sum(axis=1) > 0).sum())
        raise MoesimError(f"{tf.path}: token (seq={s}, pos={p}) lacks layer {meta.moe_layers[slot % L]} "
                          f"({missing} token(s) miss some MoE layers)")
    tok_rows = np.empty(T, dtype=np.int64)
    tok_rows[inverse] = np.arange(len(inverse))
    return target, tok_rows, T


def _layers(layers) -> str:
    s = ", ".join(map(str, layers[:8]))
    return s + (", ..." if len(layers) > 8 else "")


def _fixed(col: pa.Array, width: int, dtype, name: str, path: Path) -> np.ndarray:
    flat = col.flatten()
    if col.null_count or flat.null_count or len(flat) != len(col) * width:
        raise MoesimError(f"{path}: column {name} has missing values")
    return flat.to_numpy(zero_copy_only=False).astype(dtype, copy=False).reshape(len(col), width)


def _check_ids(ids: np.ndarray, E: int, name: str, path: Path) -> None:
    if ((ids < 0) | (ids >= E)).any():
        bad = int(ids[(ids < 0) | (ids >= E)][0])
        raise MoesimError(f"{path}: column {name} holds expert id {bad}, outside 0..{E - 1}")
    srt = np.sort(ids, axis=1)
    if (srt[:, 1:] == srt[:, :-1]).any():
        raise MoesimError(f"{path}: column {name} repeats an expert within a row")


def _scores(batch: pa.RecordBatch, meta: TraceMeta, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(candidate ids [n, M], logits [n, M]) of a batch, checked."""
    if meta.layout == "dense":
        vals = _fixed(batch.column("logits"), meta.n_experts, np.float64, "logits", path)
        ids = np.broadcast_to(np.arange(meta.n_experts, dtype=np.int64), vals.shape)
        name = "logits"
    else:
        ids = _fixed(batch.column("top_ids"), meta.n_candidates, np.int64, "top_ids", path)
        vals = _fixed(batch.column("top_logits"), meta.n_candidates, np.float64, "top_logits", path)
        lse = batch.column("lse")
        if lse.null_count or not np.isfinite(lse.to_numpy(zero_copy_only=False)).all():
            raise MoesimError(f"{path}: column lse holds NaN, infinite or missing values")
        name = "top_logits"
    if not np.isfinite(vals).all():
        raise MoesimError(f"{path}: column {name} holds NaN or infinite scores")
    if meta.layout == "sparse":
        _check_ids(ids, meta.n_experts, "top_ids", path)
    return ids, vals


__all__ = ["Routing", "load_routing", "decode", "PHASES"]
