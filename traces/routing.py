"""Decode a trace once into the routing arrays every replay shares."""

from __future__ import annotations

import dataclasses
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
    - ``logits`` [T, L, M] float32 or None: the router logits of ``cand``'s experts, in the same order:
      enough to redo any (biased) re-selection of the top-k among the M candidates and its gate weights
      with the model's gating (traces/gating.py). Exact for sigmoid gating; for the softmax gatings they
      may be the logits shifted by a constant per step (log-probabilities, as some sources give), which
      softmax weights and any re-selection ignore. None when the trace has no candidate scores
      (``has_scores``: frequency-only and version-2 ranked traces, selected-only imports) or the caller
      did not ask for them (``load_routing(logits=False)``);
    - ``lookahead`` [T, L, k] int16 or None: the experts MoE layer l+1's router selects when applied
      to layer l's input, rank order; -1 where unknown (all of the last layer); None when the trace
      has no ``lookahead`` column;
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
    lookahead: np.ndarray | None = None
    logits: np.ndarray | None = None
    digest: str = ""
    path: Path | None = None
    _memo: dict = field(default_factory=dict, repr=False)

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
    def has_scores(self) -> bool:
        """Does this routing carry its candidates' scores (``logits``), which a step policy re-selects with?"""
        return self.logits is not None

    @property
    def synthetic(self) -> bool:
        return bool(self.meta.synthetic)

    def derived(self, key, compute):
        """``compute()``, computed once per Routing and kept under ``key``: arrays derived from this
        routing that every replay of it shares (next requests, a batch's union routing, ...)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def without_derived(self) -> Routing:
        """The same routing without its derived arrays (to ship to another process)."""
        return dataclasses.replace(self, _memo={})

    def request_counts(self, n_tokens: int | None = None) -> np.ndarray:
        """Router requests per (layer, expert) over the first ``n_tokens`` tokens (default all):
        int64 [L, E]. Negative ids (padding) are not counted."""
        T = self.n_tokens if n_tokens is None else min(int(n_tokens), self.n_tokens)

        def count():
            L, E = self.n_layers, self.n_experts
            sel = self.sel[:T].astype(np.int64)
            flat = (np.arange(L)[None, :, None] * E + sel)[sel >= 0]
            return np.bincount(flat, minlength=L * E).reshape(L, E)

        return self.derived(("request_counts", T), count)

    def next_requests(self) -> tuple[np.ndarray, np.ndarray]:
        """(next [T, L, k], first [L * E]): each request's next request of the same expert and each
        expert's first request, as ticks of the replay (traces/derived.py)."""

        def compute():
            from moesim.traces import derived
            return derived.next_requests(np.ascontiguousarray(self.sel, dtype=np.int16), self.n_experts)

        return self.derived("next_requests", compute)


# the per-token and the per-step arrays of a Routing, as decoded (the decode cache and a sweep's shared copies
# hold these)
TOKEN_ARRAYS = ("seq", "pos", "phase", "domain", "token")
STEP_ARRAYS = ("sel", "w", "cand", "logits", "lookahead")


def load_routing(path: str | os.PathLike | TraceFile, *, candidates: int | None = None,
                 logits: bool = True) -> Routing:
    """Read, validate and decode a trace. ``candidates`` keeps only the best M
    scored experts per step (the substitution candidates, and their logits); default: all stored.
    ``logits=False`` leaves the candidates' scores out (Routing.logits None: 4 bytes per candidate less)."""
    tf = path if isinstance(path, TraceFile) else TraceFile(path)
    return decode(tf, candidates=candidates, logits=logits)


def placeholder_scores(meta: TraceMeta, logits: np.ndarray) -> bool:
    """Are these a selected-only import's placeholder scores (tie order stored, every row's scores
    equal), which files written before the ``scores`` metadata field carry? Such a trace has no
    candidate scores."""
    flat = logits.reshape(-1, logits.shape[-1]) if logits.size else logits.reshape(0, 1)
    return meta.tie_order == "stored" and bool((flat == flat[:, :1]).all())


def decode(tf: TraceFile, *, candidates: int | None = None, logits: bool = True) -> Routing:
    meta = tf.meta
    if meta.frequency_only:
        raise MoesimError(f"{tf.path}: a frequency-only trace (expert counts without time order) cannot be decoded "
                          "into routing steps; 'moesim profile' reads it, replay needs an ordered trace")
    L, k = meta.n_layers, meta.top_k
    M = meta.n_candidates if candidates is None else int(candidates)
    if not (k <= M <= meta.n_candidates):
        raise MoesimError(f"candidates must be between k={k} and the {meta.n_candidates} the trace stores, got {M}")
    keys = tf.read_keys()
    idx = tf.index_keys(keys)
    T = idx.n_tokens

    sel = np.empty((T * L, k), dtype=np.int16)
    w = np.empty((T * L, k), dtype=np.float32)
    cand = np.empty((T * L, M), dtype=np.int16)
    lg = np.empty((T * L, M), dtype=np.float32) if logits and meta.has_scores else None
    # rows in token order (every moesim writer's): slices, not a scatter
    in_order = bool((idx.target == np.arange(len(idx.target))).all())
    for rows, ranked, s_ord, w_ord, x in _decoded_batches(tf, idx.target % L):
        tgt = rows if in_order else idx.target[rows]
        cand[tgt] = ranked[:, :M]
        sel[tgt] = s_ord
        w[tgt] = w_ord
        if lg is not None:
            lg[tgt] = x[:, :M]
    if lg is not None and placeholder_scores(meta, lg):
        lg = None

    look = read_lookahead(tf, idx.target) if "lookahead" in tf.columns else None
    tok = idx.tok_rows
    return Routing(
        meta=meta,
        seq=keys.seq[tok].astype(np.int32),
        pos=keys.pos[tok].astype(np.int32),
        phase=keys.phase[tok].astype(np.int8),
        domain=(keys.domain[tok] if keys.domain is not None else np.full(T, -1)).astype(np.int16),
        domain_names=keys.domain_names,
        token=keys.token[tok].astype(np.int32) if keys.token is not None else None,
        sel=sel.reshape(T, L, k),
        w=w.reshape(T, L, k),
        cand=cand.reshape(T, L, M),
        lookahead=look,
        logits=None if lg is None else lg.reshape(T, L, M),
        digest=tf.digest,
        path=tf.path,
    )


def read_lookahead(tf: TraceFile, target: np.ndarray, row_groups: list[int] | None = None) -> np.ndarray:
    """The ``lookahead`` column as int16 [T, L, k] (slots ``target`` of the file's rows), -1 where
    null and on the last MoE layer, whose next layer does not exist; checked like ``selected``."""
    meta = tf.meta
    L, k, E = meta.n_layers, meta.top_k, meta.n_experts
    T = (int(target.max()) // L + 1) if len(target) else 0
    out = np.full((T * L, k), -1, dtype=np.int16)
    for start, _, batch in tf.iter_group_batches(["lookahead"], row_groups=row_groups):
        col = batch.column("lookahead")
        n = len(col)
        valid = ~col.is_null().to_numpy(zero_copy_only=False) if col.null_count else np.ones(n, dtype=bool)
        flat = col.flatten() if not col.null_count else col.filter(pa.array(valid)).flatten()
        if flat.null_count or len(flat) != int(valid.sum()) * k:
            raise MoesimError(f"{tf.path}: column lookahead has missing values inside a row")
        ids = flat.to_numpy(zero_copy_only=False).astype(np.int64).reshape(-1, k)
        _check_ids(ids, E, "lookahead", tf.path)
        out[target[start:start + n][valid]] = ids
    look = out.reshape(T, L, k)
    look[:, L - 1] = -1
    return look


def _decoded_batches(tf: TraceFile, layer_ord: np.ndarray, row_groups: list[int] | None = None):
    """Decode the score columns a row group at a time (all, or only ``row_groups``). Yields (row
    slice of the file, candidates ranked by selection score [n, M], selected [n, k] in rank order,
    their normalized weights [n, k], the candidates' logits [n, M] float32 or None: version-2 ranked
    traces keep none). Only one batch of scores is in memory at a time, in every layout; ``layer_ord``
    holds every file row's layer ordinal."""
    if tf.meta.layout == "ranked" and tf.meta.schema_version == 2:
        from moesim.traces import ranked_v2
        yield from ranked_v2.batches(tf, layer_ord, row_groups)
        return
    if tf.meta.layout == "ranked":
        yield from _ranked_batches(tf, layer_ord, row_groups)
        return
    for rows, g in _gate_inputs(tf, layer_ord, row_groups):
        yield (rows, *g.decoded(tf.meta, str(tf.path)))


@dataclass
class GateInputs:
    """Rows of a dense or sparse trace decoded up to the gate: ``ranked`` [n, M] candidates,
    ``sel`` [n, k] the selection (not yet ordered by weight), and what its weights come from:
    ``raw_weights`` (the trace's weights column) or ``sel_logits`` (the selected experts' logits).
    ``first_k``: the selection is the k first-ranked candidates (no selected column, no group limit).
    ``ranked_vals``: the ranked candidates' logits [n, M] (float64 of the stored float32)."""

    ranked: np.ndarray
    sel: np.ndarray
    raw_weights: np.ndarray | None
    sel_logits: np.ndarray | None
    first_k: bool
    ranked_vals: np.ndarray

    def weights(self, meta: TraceMeta, where: str) -> np.ndarray:
        if self.raw_weights is not None:
            return _normalized(self.raw_weights, where)
        assert self.sel_logits is not None
        return gating.gate_weights(self.sel_logits, meta.gating)

    def decoded(self, meta: TraceMeta, where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(ranked candidates, selected in rank order, their normalized weights, the candidates' logits
        float32)."""
        s_ord, w_ord = gating.order_selected(self.sel, self.weights(meta, where),
                                             keep_stored=meta.tie_order == "stored")
        return self.ranked, s_ord, w_ord, self.ranked_vals.astype(np.float32)


def _normalized(raw: np.ndarray, where: str) -> np.ndarray:
    try:
        return gating.normalize(raw)
    except MoesimError as exc:
        raise MoesimError(f"{where}: {exc}") from None


def gate_inputs(meta: TraceMeta, ids: np.ndarray, vals: np.ndarray, bias_rows: np.ndarray | None,
                selected: np.ndarray | None, weights: np.ndarray | None, where: str = "routing") -> GateInputs:
    """Rows of scores as a trace stores them, decoded up to the gate (see decode_scores)."""
    k = meta.top_k
    dense = meta.layout == "dense"
    stored = meta.tie_order == "stored"
    score = gating.selection_scores(vals, meta.gating, bias_rows)
    order = gating.rank_order(ids, score, ids_sorted=dense or stored)
    ranked_ids = np.take_along_axis(ids, order, axis=1)
    ranked_vals = np.take_along_axis(vals, order, axis=1)
    if selected is not None:
        if weights is not None:
            return GateInputs(ranked_ids, selected, weights, None, False, ranked_vals)
        sel_logits, found = gating.lookup(ids, vals, selected, dense=dense)
        if not found.all():
            raise MoesimError(f"{where}: a selected expert is not among the row's scored candidates and "
                              "the trace stores no weights to weigh it")
        return GateInputs(ranked_ids, selected, None, sel_logits, False, ranked_vals)
    if meta.gating == "sigmoid" and meta.n_group > 1:
        if not dense:
            raise MoesimError(f"{where}: group-limited sigmoid routing needs dense logits or a "
                              "'selected' column")
        s = gating.group_limited_topk(score, k, meta.n_group, meta.topk_group)
        sel_logits, _ = gating.lookup(ids, vals, s, dense=dense)
        return GateInputs(ranked_ids, s, None, sel_logits, False, ranked_vals)
    return GateInputs(ranked_ids, ranked_ids[:, :k], None, ranked_vals[:, :k], True, ranked_vals)


def decode_scores(meta: TraceMeta, ids: np.ndarray, vals: np.ndarray, bias_rows: np.ndarray | None,
                  selected: np.ndarray | None, weights: np.ndarray | None, where: str = "routing"
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows of scores as a trace stores them -> (candidates ranked by selection score [n, M],
    selected [n, k] in rank order, their normalized weights [n, k], the candidates' logits in that
    order [n, M] float32). ``ids``/``vals``: the
    scored experts and their logits (float64 of the stored float32); ``bias_rows``: the
    selection bias of each row's ids; ``selected``/``weights``: the model's own choice when
    stored. The one decode both a trace file and the emulator's in-memory routing go through
    (the ranked layout stores its result: _ranked_batches)."""
    return gate_inputs(meta, ids, vals, bias_rows, selected, weights, where).decoded(meta, where)


def _gate_inputs(tf: TraceFile, layer_ord: np.ndarray, row_groups: list[int] | None = None):
    """(row slice, GateInputs) per batch of a dense or sparse trace, checked."""
    meta = tf.meta
    k, E = meta.top_k, meta.n_experts
    dense = meta.layout == "dense"
    bias = np.asarray(meta.selection_bias, dtype=np.float64) if meta.selection_bias is not None else None
    has_sel, has_w = "selected" in tf.columns, "weights" in tf.columns
    cols = (["logits"] if dense else ["top_ids", "top_logits", "lse"]) + ["selected"] * has_sel + ["weights"] * has_w
    for start, _, batch in tf.iter_group_batches(cols, row_groups=row_groups):
        n = batch.num_rows
        rows = slice(start, start + n)
        ids, vals = _scores(batch, meta, tf.path)
        bias_rows = bias[layer_ord[rows][:, None], ids] if bias is not None else None
        s = ww = None
        if has_sel:
            s = _fixed(batch.column("selected"), k, np.int64, "selected", tf.path)
            _check_ids(s, E, "selected", tf.path)
            if has_w:
                ww = _weights(batch, k, tf.path)
        yield rows, gate_inputs(meta, ids, vals, bias_rows, s, ww, where=str(tf.path))


def _weights(batch: pa.RecordBatch, k: int, path: Path) -> np.ndarray:
    ww = _fixed(batch.column("weights"), k, np.float64, "weights", path)
    if not np.isfinite(ww).all():
        raise MoesimError(f"{path}: column weights holds NaN or infinite values")
    return ww


def _ranked_batches(tf: TraceFile, layer_ord: np.ndarray, row_groups: list[int] | None = None):
    """_decoded_batches of the ranked layout (version 3): the candidates as stored, in rank order (checked:
    ids distinct and in range, logits finite and ranked), the selection (``selected``, else the k
    first-ranked) and its gate weights (``weights``, else from the selection's logits)."""
    from moesim.traces import ranked as rk

    meta = tf.meta
    k, E, M = meta.top_k, meta.n_experts, meta.n_candidates
    has_sel, has_w = "selected" in tf.columns, "weights" in tf.columns
    stored = meta.tie_order == "stored"
    width = rk.code_width(E)
    bias = np.asarray(meta.selection_bias, dtype=np.float64) if meta.selection_bias is not None else None
    cols = ["ranked_ids", "ranked_logits"] + ["selected"] * has_sel + ["weights"] * has_w
    for start, _, batch in tf.iter_group_batches(cols, row_groups=row_groups):
        n = batch.num_rows
        rows = slice(start, start + n)
        raw = {}
        for name, size in (("ranked_ids", M * width), ("ranked_logits", 4 * M)):
            col = batch.column(name)
            if col.null_count:
                raise MoesimError(f"{tf.path}: column {name} has missing values")
            raw[name] = rk.binary_rows(col, size)
        ids = rk.ids_of(raw["ranked_ids"], width)
        x = rk.logits_of(raw["ranked_logits"])
        if not np.isfinite(x).all():
            raise MoesimError(f"{tf.path}: column ranked_logits holds NaN or infinite values")
        # layer_ord is only sliced by file rows (a streamed decode passes one row group's ordinals)
        bias_rows = None
        if bias is not None:
            bias_rows = bias[np.asarray(layer_ord[rows])[:, None], np.clip(ids, 0, E - 1)]
        score = gating.selection_scores(x, meta.gating, bias_rows) if meta.gating == "sigmoid" else x
        bad_id, bad_order = rk.check_rows(ids, score, E, not stored)
        if bad_id < n:
            raise MoesimError(f"{tf.path}: column ranked_ids row {start + bad_id} holds an expert id outside "
                              f"0..{E - 1} or repeats one (damaged file)")
        if bad_order < n:
            raise MoesimError(f"{tf.path}: ranked_logits row {start + bad_order} is not in rank order (best "
                              "selection score first" + ("" if stored else ", equal scores lower id first")
                              + "; damaged file)")
        if has_sel:
            s = _fixed(batch.column("selected"), k, np.int64, "selected", tf.path)
            _check_ids(s, E, "selected", tf.path)
        else:
            s = ids[:, :k]
        if has_w:
            ww = _normalized(_weights(batch, k, tf.path), str(tf.path))
        elif has_sel:
            sel_logits, found = gating.lookup(ids, x, s)
            if not found.all():
                raise MoesimError(f"{tf.path}: a selected expert is not among the row's candidates and the "
                                  "trace stores no weights to weigh it")
            ww = gating.gate_weights(sel_logits, meta.gating)
        else:
            ww = gating.gate_weights(x[:, :k], meta.gating)
            if meta.gating != "sigmoid":
                # the k first-ranked candidates, weighed by the softmax of their (ranked) logits: already in
                # the selection's rank order (equal weights come from equal logits, ranked as the tie order
                # says), so order_selected would give them back as they are
                yield rows, ids, s, ww, x
                continue
        s_ord, w_ord = gating.order_selected(s, ww, keep_stored=stored)
        yield rows, ids, s_ord, w_ord, x


def validate_trace(path: str | os.PathLike | TraceFile) -> dict:
    """Read every row and check it, streaming (memory: the key columns plus one row
    group of scores). Returns a short summary; raises MoesimError on the first problem."""
    tf = path if isinstance(path, TraceFile) else TraceFile(path)
    keys = tf.read_keys()
    idx = tf.index_keys(keys)
    meta = tf.meta
    if meta.layout == "counts":
        counts = _layer_counts_from_counts(tf, idx)
        return {"tokens": None, "requests": idx.n_tokens, "layers": meta.n_layers,
                "steps": int(counts.sum()) // meta.top_k, "frequency_only": True}
    for _ in _decoded_batches(tf, idx.target % meta.n_layers):
        pass
    if "lookahead" in tf.columns:
        read_lookahead(tf, idx.target)
    return {"tokens": idx.n_tokens, "requests": None, "layers": meta.n_layers,
            "steps": idx.n_tokens * meta.n_layers, "frequency_only": False}


def expert_counts(trace: str | os.PathLike | TraceFile | Routing) -> np.ndarray:
    """How often each expert was selected, per MoE layer: int64 [L, E], layer axis in
    ``meta.moe_layers`` order. Works on ordered traces (the selected experts of every
    step, as decoded) and on frequency-only (counts) traces alike; a file is streamed a
    row group at a time. For layer l, ``counts[l].sum() / k`` is its number of steps."""
    if isinstance(trace, Routing):
        return trace.request_counts()
    tf = trace if isinstance(trace, TraceFile) else TraceFile(trace)
    idx = tf.index_keys(tf.read_keys())
    if tf.meta.layout == "counts":
        return _layer_counts_from_counts(tf, idx)
    L, E = tf.meta.n_layers, tf.meta.n_experts
    layer_ord = idx.target % L
    out = np.zeros(L * E, dtype=np.int64)
    for rows, _, s_ord, _, _ in _decoded_batches(tf, layer_ord):
        out += np.bincount((layer_ord[rows][:, None] * E + s_ord).reshape(-1), minlength=L * E)
    return out.reshape(L, E)


def _layer_counts_from_counts(tf: TraceFile, idx) -> np.ndarray:
    meta = tf.meta
    L, E, k = meta.n_layers, meta.n_experts, meta.top_k
    layer_ord = idx.target % L
    out = np.zeros((L, E), dtype=np.int64)
    start = 0
    for batch in tf.iter_batches(["counts"]):
        n = batch.num_rows
        c = _fixed(batch.column("counts"), E, np.int64, "counts", tf.path)
        if (c < 0).any():
            raise MoesimError(f"{tf.path}: column counts holds negative counts")
        bad = c.sum(axis=1) % k != 0
        if bad.any():
            i = int(np.argmax(bad))
            raise MoesimError(f"{tf.path}: counts row {start + i} sums to {int(c[i].sum())} selections, "
                              f"not a multiple of k={k} (each routed token selects k experts)")
        np.add.at(out, layer_ord[start:start + n], c)
        start += n
    if out.sum() == 0:
        raise MoesimError(f"{tf.path}: every expert count is zero (no routed tokens)")
    return out


def _fixed(col: pa.Array, width: int, dtype, name: str, path: Path) -> np.ndarray:
    flat = col.flatten()
    if col.null_count or flat.null_count or len(flat) != len(col) * width:
        raise MoesimError(f"{path}: column {name} has missing values")
    # Corrupt float data can hold signalling NaNs, whose cast warns; they are rejected right after.
    with np.errstate(invalid="ignore"):
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
        with np.errstate(invalid="ignore"):
            lse_np = lse.to_numpy(zero_copy_only=False).astype(np.float64) if not lse.null_count else None
        if lse_np is None or not np.isfinite(lse_np).all():
            raise MoesimError(f"{path}: column lse holds NaN, infinite or missing values")
        name = "top_logits"
    if not np.isfinite(vals).all():
        raise MoesimError(f"{path}: column {name} holds NaN or infinite scores")
    if meta.layout == "sparse":
        assert lse_np is not None  # read and checked above
        # The log-sum-exp over all E logits is at least the largest of them (float32 slack).
        top = vals.max(axis=1)
        low = lse_np < top - 1e-4 * np.maximum(1.0, np.abs(top))
        if low.any():
            i = int(np.argmax(low))
            raise MoesimError(f"{path}: lse {lse_np[i]:.6g} is below the row's largest logit {top[i]:.6g}; "
                              "lse must be the log-sum-exp over all E logits")
    if meta.layout == "sparse":
        _check_ids(ids, meta.n_experts, "top_ids", path)
    return ids, vals


__all__ = ["Routing", "load_routing", "decode", "decode_scores", "validate_trace", "expert_counts", "PHASES"]
