"""What every importer shares: key checks with a clear message, and writing a top-k trace."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from moesim import __version__
from moesim.errors import MoesimError
from moesim.traces.meta import PHASES, TraceMeta
from moesim.traces.reader import slot_index
from moesim.traces.writer import DEFAULT_ROW_GROUP, TraceWriter


@dataclass
class ImportResult:
    """What an importer wrote. ``notes`` are things a user should know about the
    source (printed as warnings by the CLI); they do not make the import fail."""

    path: Path
    meta: TraceMeta
    rows: int
    tokens: int | None
    sequences: int
    phases: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        m = self.meta
        what = (f"{self.tokens} tokens in {self.sequences} sequence(s)" if self.tokens is not None
                else f"expert counts of {self.sequences} request(s), frequency-only")
        phases = ", ".join(f"{k} {v}" for k, v in self.phases.items())
        tag = "SYNTHETIC" if m.synthetic else "real"
        return (f"wrote {self.path}: {what} x {m.n_layers} MoE layers (original indices {_span(m.moe_layers)}), "
                f"top-{m.top_k} of {m.n_experts}" + (f", {phases}" if phases else "") + f", {m.model_id} ({tag})")


def tracer_info(name: str) -> dict:
    return {"name": f"moesim import {name}", "version": __version__}


def check_keys(seq: np.ndarray, pos: np.ndarray, layer: np.ndarray, moe_layers, where: str) -> int:
    """Every (seq, pos) has each MoE layer exactly once. Returns the number of tokens."""
    if len(seq) == 0:
        raise MoesimError(f"{where}: no routing rows found")
    if (seq < 0).any() or (pos < 0).any() or (seq >= 2**31).any() or (pos >= 2**31).any():
        raise MoesimError(f"{where}: seq and pos must be non-negative 32-bit integers")
    return slot_index(seq, pos, layer, tuple(moe_layers), where)[2]


def check_topk_ids(ids: np.ndarray, E: int, where: str) -> None:
    if ids.size and (ids.min() < 0 or ids.max() >= E):
        bad = int(ids[(ids < 0) | (ids >= E)][0])
        raise MoesimError(f"{where}: expert id {bad} is outside 0..{E - 1}")
    srt = np.sort(ids, axis=1)
    if (srt[:, 1:] == srt[:, :-1]).any():
        row = int(np.argmax((srt[:, 1:] == srt[:, :-1]).any(axis=1)))
        raise MoesimError(f"{where}: expert {int(srt[row][np.argmax(srt[row, 1:] == srt[row, :-1])])} appears "
                          f"twice in one row (row {row}); a router selects k distinct experts")


def write_topk_trace(out: str | os.PathLike, meta: TraceMeta, *, seq, pos, layer, phase, ids, weights=None,
                     logits=None, lse=None, domain=None, domains=None, token=None, where: str,
                     row_group_size: int = DEFAULT_ROW_GROUP, notes: list[str] | None = None) -> ImportResult:
    """Write rows that carry the k selected experts of each (seq, pos, layer).

    Scores: ``logits`` (the router logits of those k experts, with ``lse`` the
    log-sum-exp over all E when known) are stored as the sparse scores; without
    logits, log(weights) stands in (so softmax over the k gives back the
    weights); without either, near-equal scores that keep the source's order
    (weights 1/k within 1e-6). The selected experts are always stored, and the
    weights when given, so replay uses what the source recorded, not a guess.
    """
    seq = np.asarray(seq, dtype=np.int64)
    pos = np.asarray(pos, dtype=np.int64)
    layer = np.asarray(layer, dtype=np.int64)
    ids = np.asarray(ids, dtype=np.int64)
    n, k = ids.shape
    if k != meta.top_k or meta.n_candidates != k:
        raise MoesimError(f"{where}: rows hold {k} experts but the trace is top-{meta.top_k}")
    check_topk_ids(ids, meta.n_experts, where)
    tokens = check_keys(seq, pos, layer, meta.moe_layers, where)
    if weights is not None:
        weights = np.asarray(weights, dtype=np.float64)
        if not np.isfinite(weights).all() or (weights < 0).any() or (weights.sum(axis=1) <= 0).any():
            raise MoesimError(f"{where}: gate weights must be finite, >= 0, with a positive sum in every row")
    if logits is not None:
        logits = np.asarray(logits, dtype=np.float64)
        if not np.isfinite(logits).all():
            raise MoesimError(f"{where}: router logits hold NaN or infinite values")
        scores = logits
    elif weights is not None:
        # a zero weight has no logit: floor it far below any real one so the rank order survives
        scores = np.log(np.maximum(weights, 1e-30))
    else:
        # No scores in the source: equal weights, less 1e-6 per rank so that the source's
        # order (its first choice first) survives ranking instead of falling back to ids.
        scores = np.broadcast_to(-1e-6 * np.arange(k), (n, k)).copy()
    if lse is None:
        top = scores.max(axis=1)
        lse = top + np.log(np.exp(scores - top[:, None]).sum(axis=1))
    lse = np.broadcast_to(np.asarray(lse, dtype=np.float64), (n,))
    if not np.isfinite(lse).all():
        raise MoesimError(f"{where}: lse holds NaN or infinite values")

    order = np.lexsort((layer, pos, seq))
    phase_arr = np.broadcast_to(np.asarray(phase, dtype=object), (n,))
    writer = TraceWriter(out, meta, selected=True, weights=weights is not None, domains=domains,
                         token=token is not None, row_group_size=row_group_size)
    with writer:
        for start in range(0, n, row_group_size):
            o = order[start:start + row_group_size]
            writer.write(seq=seq[o], pos=pos[o], layer=layer[o], phase=phase_arr[o], top_ids=ids[o],
                         top_logits=scores[o], lse=lse[o], selected=ids[o],
                         weights=None if weights is None else weights[o],
                         domain=None if domain is None else np.asarray(domain, dtype=object)[o],
                         token=None if token is None else np.asarray(token)[o])
    first = np.unique((seq << 32) | pos, return_index=True)[1]
    ph, cnt = np.unique(phase_arr[first].astype(str), return_counts=True)
    return ImportResult(Path(out), meta, rows=n, tokens=tokens, sequences=int(len(np.unique(seq))),
                        phases={p: int(c) for p, c in zip(ph, cnt) if p in PHASES}, notes=list(notes or []))


def _span(xs) -> str:
    xs = list(xs)
    if len(xs) > 2 and xs == list(range(xs[0], xs[-1] + 1)):
        return f"{xs[0]}..{xs[-1]}"
    return ", ".join(map(str, xs))
