"""Write a trace from whole tokens at a time, in token order: the streamed importers' writer.

An importer that reads a file larger than memory hands over chunks of tokens, each token with all
its MoE layers: ``ids`` [n, L, k] (the selected experts, first choice first) and/or ``scores``
[n, L, E] (router logits or log-probabilities of all E experts). Scores keep the candidates
(rerouting and substitution need them): all E in the dense layout, or the M best (``candidates``)
with the log-sum-exp over all E in the sparse one. Tokens must come in (seq, pos) order, which is
what a streamed replay reads; every chunk is checked as it arrives and nothing is published unless
the whole input was read (TraceWriter's atomic rename).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import numpy as np

from moesim.errors import MoesimError
from moesim.traces.importers.common import ImportResult, check_topk_ids
from moesim.traces.meta import PHASES, TraceMeta
from moesim.traces.writer import DEFAULT_ROW_GROUP, TraceWriter

# log(p) of a probability of exactly 0: below every positive float32 (log of the smallest subnormal is -103.3),
# so the expert ranks last and exp() gives it no weight, without an infinite logit the trace cannot store
LOG_ZERO = -104.0


def score_meta(meta: TraceMeta, candidates: int | None) -> TraceMeta:
    """The layout that keeps a full-score source's candidates: dense with all E, sparse with M < E."""
    E = meta.n_experts
    M = E if candidates is None else int(candidates)
    if not meta.top_k <= M <= E:
        raise MoesimError(f"--candidates must be in k..E = {meta.top_k}..{E}, got {M}")
    if M == E:
        return meta.replace(layout="dense", n_candidates=E)
    return meta.replace(layout="sparse", n_candidates=M)


class TokenWriter:
    """Append whole tokens; ``close()`` publishes the trace and returns what an importer reports.

    ``selected``: the source records the experts the model ran (stored as the ``selected``
    column, which replay uses as is). Without scores the trace is sparse with M = k, weights
    exactly 1/k and the source's order as the rank order (``tie_order: stored``); with scores
    the weights come from the scores through the trace's gating."""

    def __init__(self, out: str | os.PathLike, meta: TraceMeta, *, scores: bool, selected: bool, where: str,
                 inputs=(), notes: list[str] | None = None, row_group_size: int = DEFAULT_ROW_GROUP):
        if not scores and not selected:
            raise MoesimError("a trace needs scores or selected experts")
        if not scores:
            meta = meta.replace(layout="sparse", n_candidates=meta.top_k, tie_order="stored")
        self.meta, self.scores, self.selected, self.where = meta, scores, selected, where
        self.notes = list(notes or [])
        self.layers = np.asarray(meta.moe_layers, dtype=np.int64)
        self.tokens = 0
        self.seqs: set[int] = set()
        self.phases: Counter = Counter()
        self._last = (-1, -1)
        self._writer = TraceWriter(out, meta, selected=selected, weights=not scores, inputs=inputs,
                                   row_group_size=row_group_size)

    def add(self, seq, pos, phase, *, ids=None, scores=None) -> None:
        """Tokens ``seq``/``pos`` [n] (ascending (seq, pos), after every token already added),
        ``phase`` a name or [n] names; ``ids`` [n, L, k] and/or ``scores`` [n, L, E]."""
        seq = np.asarray(seq, dtype=np.int64).reshape(-1)
        pos = np.asarray(pos, dtype=np.int64).reshape(-1)
        n, L, m = len(seq), self.meta.n_layers, self.meta
        if n == 0:
            return
        if (seq < 0).any() or (pos < 0).any() or (seq >= 2**31).any() or (pos >= 2**31).any():
            raise MoesimError(f"{self.where}: seq and pos must be non-negative 32-bit integers")
        key = (seq << 32) | pos
        if (np.diff(key) <= 0).any() or int(key[0]) <= ((self._last[0] << 32) | self._last[1]):
            i = int(np.argmax(np.diff(np.r_[(self._last[0] << 32) | self._last[1], key]) <= 0))
            raise MoesimError(f"{self.where}: token (seq={int(seq[i])}, pos={int(pos[i])}) comes twice or out of "
                              "order")
        self._last = (int(seq[-1]), int(pos[-1]))
        phase_arr = np.broadcast_to(np.asarray(phase, dtype=object), (n,))
        cols: dict = {}
        if ids is not None:
            ids = np.asarray(ids)
            if ids.shape != (n, L, m.top_k):
                raise MoesimError(f"{self.where}: {ids.shape} selected ids for {n} tokens x {L} layers x k={m.top_k}")
            flat = ids.reshape(n * L, m.top_k).astype(np.int64)
            check_topk_ids(flat, m.n_experts, self.where)
            if self.selected:
                cols["selected"] = flat
        if self.scores:
            if scores is None:
                raise MoesimError(f"{self.where}: this trace stores scores: every token needs them")
            s = np.asarray(scores, dtype=np.float64)
            if s.shape != (n, L, m.n_experts):
                raise MoesimError(f"{self.where}: scores of shape {s.shape} for {n} tokens x {L} layers x "
                                  f"E={m.n_experts}")
            s = s.reshape(n * L, m.n_experts)
            if not np.isfinite(s).all():
                row = int(np.argmax(~np.isfinite(s).all(axis=1)))
                raise MoesimError(f"{self.where}: token (seq={int(seq[row // L])}, pos={int(pos[row // L])}) "
                                  f"layer {int(self.layers[row % L])}: scores hold NaN or infinite values")
            if m.layout == "dense":
                cols["logits"] = s
            else:
                cols.update(self._sparse(s, cols.get("selected")))
        else:
            flat = cols["selected"]
            cols.update(top_ids=flat, top_logits=np.zeros(flat.shape), lse=np.log(m.top_k),
                        weights=np.full(flat.shape, 1.0 / m.top_k))
        self._writer.write(seq=np.repeat(seq, L), pos=np.repeat(pos, L), layer=np.tile(self.layers, n),
                           phase=np.repeat(phase_arr, L), **cols)
        self.tokens += n
        self.seqs.update(np.unique(seq).tolist())
        for p, c in zip(*np.unique(phase_arr.astype(str), return_counts=True)):
            self.phases[str(p)] += int(c)

    def _sparse(self, s: np.ndarray, selected: np.ndarray | None) -> dict:
        """The M best-scored experts (the selected ones always among them), their scores and the
        log-sum-exp over all E."""
        M, E = self.meta.n_candidates, self.meta.n_experts
        top = s.max(axis=1)
        lse = top + np.log(np.exp(s - top[:, None]).sum(axis=1))
        ids = np.broadcast_to(np.arange(E), s.shape)
        key = s.copy()
        if selected is not None:
            np.put_along_axis(key, selected, np.inf, axis=1)
        order = np.lexsort((ids, -key), axis=1)[:, :M]
        return {"top_ids": order, "top_logits": np.take_along_axis(s, order, axis=1), "lse": lse}

    def close(self) -> ImportResult:
        if self.tokens == 0:
            self._writer.abort()
            raise MoesimError(f"{self.where}: no routing records found")
        path = self._writer.close()
        return ImportResult(Path(path), self.meta, rows=self.tokens * self.meta.n_layers, tokens=self.tokens,
                            sequences=len(self.seqs),
                            phases={p: self.phases[p] for p in PHASES if self.phases[p]}, notes=self.notes)

    def abort(self) -> None:
        self._writer.abort()

    def __enter__(self) -> TokenWriter:
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
        return False
