"""Engine-neutral part of a tracer: captured router outputs of one forward pass -> trace rows.

Both tracers (PyTorch hooks, llama.cpp eval callback) hand a ``RouterRecorder`` the
logits of every MoE layer for a block of tokens, plus the model's own selected ids
and gate weights where the engine exposes them. The recorder turns them into v1
rows (token-major: all MoE layers of a token, then the next token) and streams them
through a TraceWriter, so memory stays bounded by one forward pass.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moesim.errors import MoesimError
from moesim.traces import gating
from moesim.traces.meta import TraceMeta
from moesim.traces.writer import DEFAULT_ROW_GROUP, TraceWriter


def candidate_count(candidates: int | None, n_experts: int, top_k: int, layout: str) -> int:
    """Candidates stored per row: E in the dense layout, else ``candidates`` (default_candidates when None;
    0 is refused, not taken for the default), between top-k and E."""
    if layout == "dense":
        return n_experts
    m = default_candidates(n_experts, top_k) if candidates is None else int(candidates)
    if not top_k <= m <= n_experts:
        raise MoesimError(f"--candidates must be between top-k={top_k} and E={n_experts}, got {m}")
    return m


def default_candidates(n_experts: int, top_k: int) -> int:
    """Sparse layout default M: enough resident alternatives for substitution, small on disk."""
    return min(n_experts, max(32, 2 * top_k))


@dataclass
class Capture:
    """One MoE layer's router output for n tokens (rows in token order)."""

    logits: np.ndarray                   # [n, E] raw router logits (gpt-oss: with the router bias)
    selected: np.ndarray | None = None   # [n, k] the model's chosen experts
    weights: np.ndarray | None = None    # [n, k] their gate weights as the model applies them
    # the next MoE layer's router applied to this layer's router input (lookahead), same three parts
    ahead_logits: np.ndarray | None = None
    ahead_selected: np.ndarray | None = None
    ahead_weights: np.ndarray | None = None


def logsumexp(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))[:, 0]


def sparse_rows(logits: np.ndarray, M: int, gating_name: str, bias: np.ndarray | None,
                selected: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The M best experts by selection score, with the model's selected experts always
    among them (group-limited routing can pick an expert outside the global top-M).
    Returns (ids [n, M] int16, logits [n, M] float32)."""
    n, E = logits.shape
    score = gating.selection_scores(logits, gating_name, None if bias is None else bias[None, :])
    ids, _ = gating.rank_rows(np.broadcast_to(np.arange(E), (n, E)), score, ids_sorted=True)
    top = ids[:, :M].copy()
    if selected is not None:
        sel = np.asarray(selected, dtype=np.int64)
        missing = ~(top[:, None, :] == sel[:, :, None]).any(axis=2)   # [n, k]
        for r in np.flatnonzero(missing.any(axis=1)):
            need = sel[r][missing[r]]
            keep = [i for i in top[r] if i in set(sel[r])]
            rest = [i for i in top[r] if i not in set(sel[r])]
            top[r] = np.array(keep + list(need) + rest)[:M]
    vals = np.take_along_axis(np.asarray(logits, dtype=np.float32), top, axis=1)
    return top.astype(np.int16), vals


def derive_selection(logits: np.ndarray, meta: TraceMeta, bias: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Top-k ids and gate weights from raw logits with the metadata's gating (when the
    engine does not expose the model's own choice)."""
    k = meta.top_k
    score = gating.selection_scores(logits, meta.gating, None if bias is None else bias[None, :])
    n, E = score.shape
    if meta.gating == "sigmoid" and meta.n_group > 1:
        sel = gating.group_limited_topk(score, k, meta.n_group, meta.topk_group)
    else:
        sel, _ = gating.rank_rows(np.broadcast_to(np.arange(E), (n, E)), score, ids_sorted=True)
        sel = sel[:, :k]
    w = gating.gate_weights(np.take_along_axis(np.asarray(logits, np.float64), sel, axis=1), meta.gating)
    return sel, w


class RouterRecorder:
    """Streams captured router outputs into one trace file.

    ``meta_fields`` are TraceMeta keyword arguments; ``n_experts``/``top_k`` may be
    missing and are then taken from the first capture (``top_k`` from the model's
    selection). The writer opens at the first ``add`` so the columns can follow
    what the engine exposes (selected ids, weights, token ids).
    """

    def __init__(self, path: str | os.PathLike, meta_fields: dict[str, Any], *, layout: str = "sparse",
                 candidates: int | None = None, domains: list[str] | None = None,
                 selection_bias: dict[int, np.ndarray] | None = None, row_group_size: int | None = None,
                 lookahead: bool = False):
        if layout not in ("sparse", "dense"):
            raise MoesimError(f"unknown layout {layout!r} (expected sparse or dense)")
        self.path = Path(path)
        self.meta_fields = dict(meta_fields)
        self.layout = layout
        self.candidates = candidates
        self.domains = list(dict.fromkeys(domains)) if domains else None
        self.selection_bias = selection_bias or {}
        self.row_group_size = row_group_size
        self.lookahead = lookahead
        self.meta: TraceMeta | None = None
        self.writer: TraceWriter | None = None
        self.tokens = 0
        self.sequences: set[int] = set()

    # -- metadata -------------------------------------------------------------------------------------
    def _open(self, captures: dict[int, Capture], has_token: bool) -> None:
        first = captures[min(captures)]
        f = dict(self.meta_fields)
        E = first.logits.shape[1]
        if f.setdefault("n_experts", E) != E:
            raise MoesimError(f"the router produced {E} logits per token but the model declares "
                              f"{f['n_experts']} experts")
        if "top_k" not in f:
            if first.selected is None:
                raise MoesimError("top_k is unknown: the router modules do not return their selection; pass top_k=")
            f["top_k"] = int(first.selected.shape[1])
        f.setdefault("moe_layers", sorted(captures))
        M = candidate_count(self.candidates, E, f["top_k"], self.layout)
        f.update(layout=self.layout, n_candidates=M)
        layers = list(f["moe_layers"])
        if self.selection_bias:
            bias = [np.asarray(self.selection_bias[i], dtype=np.float64) for i in layers]
            if any(b.any() for b in bias):
                f["selection_bias"] = [b.tolist() for b in bias]
        self.meta = TraceMeta(**f)
        self._layer_set = set(layers)
        self._has_sel = first.selected is not None or (
            self.meta.gating == "sigmoid" and self.meta.n_group > 1 and self.layout == "sparse")
        self._has_w = first.weights is not None
        self.writer = TraceWriter(self.path, self.meta, domains=self.domains, token=has_token,
                                  selected=self._has_sel, weights=self._has_w,
                                  row_group_size=self.row_group_size or DEFAULT_ROW_GROUP, lookahead=self.lookahead)

    # -- rows -----------------------------------------------------------------------------------------
    def add(self, *, seq: np.ndarray, pos: np.ndarray, captures: dict[int, Capture], token: np.ndarray | None = None,
            phase: str | np.ndarray = "prefill", domain: str | np.ndarray | None = None) -> None:
        """Append n tokens; ``captures`` maps each MoE layer's original index to its Capture."""
        if not captures:
            raise MoesimError("no router output was captured for this forward pass (are the hooked modules "
                              "the model's routers?)")
        if self.writer is None:
            self._open(captures, token is not None)
        meta = self.meta
        assert meta is not None and self.writer is not None  # opened by the first add()
        if set(captures) != self._layer_set:
            missing = sorted(self._layer_set - set(captures))
            unexpected = sorted(set(captures) - self._layer_set)
            raise MoesimError(f"router outputs do not match the MoE layers (missing {missing}, "
                              f"unexpected {unexpected})")
        if self.domains is not None and domain is None:
            raise MoesimError(f"set the recorder's domain (one of {', '.join(self.domains)}) before a forward pass")
        seq = np.asarray(seq, dtype=np.int32).reshape(-1)
        n, L = len(seq), meta.n_layers
        if n == 0:
            return
        cols: dict[str, list[np.ndarray]] = {}
        for layer in meta.moe_layers:
            cap = captures[layer]
            logits = np.asarray(cap.logits, dtype=np.float32)
            if logits.shape != (n, meta.n_experts):
                raise MoesimError(f"layer {layer}: router logits of shape {logits.shape}, expected "
                                  f"({n}, {meta.n_experts})")
            if not np.isfinite(logits).all():
                raise MoesimError(f"layer {layer}: the router produced NaN or infinite logits")
            bias = self.selection_bias.get(layer) if meta.selection_bias is not None else None
            sel: np.ndarray | None = cap.selected
            w: np.ndarray | None = cap.weights
            if self._has_sel and sel is None:
                sel, w_derived = derive_selection(logits, meta, bias)
                w = w if w is not None else w_derived
            if sel is not None:
                sel = np.asarray(sel, dtype=np.int64)
                if sel.shape != (n, meta.top_k):
                    raise MoesimError(f"layer {layer}: selected ids of shape {sel.shape}, expected ({n}, {meta.top_k})")
            if self._has_w:
                w = np.asarray(w, dtype=np.float32)
                if w.shape != (n, meta.top_k):
                    raise MoesimError(f"layer {layer}: gate weights of shape {w.shape}, expected ({n}, {meta.top_k})")
            c: dict[str, np.ndarray] = {}
            if meta.layout == "dense":
                c["logits"] = logits
            else:
                c["top_ids"], c["top_logits"] = sparse_rows(logits, meta.n_candidates, meta.gating, bias, sel)
                c["lse"] = logsumexp(logits).astype(np.float32)
            if sel is not None and self._has_sel:
                c["selected"] = sel
            if w is not None and self._has_w:
                c["weights"] = w
            if self.lookahead:
                c["lookahead"] = self._ahead(cap, layer, n)
            for name, v in c.items():
                cols.setdefault(name, []).append(v)
        # [L, n, ...] -> token-major rows [n * L, ...]
        rows = {name: np.stack(v, axis=1).reshape(n * L, *v[0].shape[1:]) for name, v in cols.items()}
        rep = lambda a: np.repeat(np.asarray(a), L, axis=0)  # noqa: E731
        extra: dict[str, Any] = {}
        if token is not None:
            extra["token"] = rep(np.asarray(token, dtype=np.int32).reshape(-1))
        if domain is not None:
            extra["domain"] = domain if isinstance(domain, str) else list(rep(domain))
        self.writer.write(seq=rep(seq), pos=rep(np.broadcast_to(np.asarray(pos, dtype=np.int32), (n,))),
                          layer=np.tile(np.asarray(meta.moe_layers, dtype=np.int16), n),
                          phase=phase if isinstance(phase, str) else list(rep(phase)), **extra, **rows)
        self.tokens += n
        self.sequences.update(np.unique(seq).tolist())

    def _ahead(self, cap: Capture, layer: int, n: int) -> np.ndarray:
        """[n, k] the lookahead ids of one layer's rows, rank order (by gate weight, as ``sel``); -1 on
        the last MoE layer. Selected with the next layer's gating and selection bias, as its own rows are."""
        meta = self.meta
        assert meta is not None
        layers = list(meta.moe_layers)
        i = layers.index(layer)
        k = meta.top_k
        if i == len(layers) - 1:
            return np.full((n, k), -1, dtype=np.int64)
        if cap.ahead_logits is None:
            raise MoesimError(f"layer {layer}: no lookahead was captured (the next MoE layer's router did not run "
                              "on this layer's input)")
        logits = np.asarray(cap.ahead_logits, dtype=np.float64)
        if logits.shape != (n, meta.n_experts) or not np.isfinite(logits).all():
            raise MoesimError(f"layer {layer}: lookahead logits of shape {logits.shape} or not finite")
        sel, w = cap.ahead_selected, cap.ahead_weights
        if sel is None or w is None or np.shape(sel) != (n, k) or np.shape(w) != (n, k):
            nxt = layers[i + 1]
            bias = self.selection_bias.get(nxt) if meta.selection_bias is not None else None
            sel, w = derive_selection(logits, meta, bias)
        s_ord, _ = gating.order_selected(np.asarray(sel, dtype=np.int64), np.asarray(w, dtype=np.float64))
        return s_ord

    def close(self) -> Path:
        if self.writer is None:
            raise MoesimError("nothing was traced (no forward pass ran while recording)")
        return self.writer.close()

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()
