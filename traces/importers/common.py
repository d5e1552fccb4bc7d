"""What every importer shares: key checks with a clear message, and writing a top-k trace."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from moesim import __version__
from moesim.errors import MoesimError
from moesim.files import read_bytes
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


def to_int64(a: np.ndarray, where: str, what: str) -> np.ndarray:
    """Whole numbers as int64; a value past its range is named as it is (a uint64 2^64-1 would wrap to -1)."""
    if a.dtype.kind == "u" and a.size and int(a.max()) > np.iinfo(np.int64).max:
        raise MoesimError(f"{where}: {what} {int(a.max())} is out of range (at most 2^63-1)")
    if a.dtype.kind == "f" and a.size and not (np.abs(a) < 2.0**63).all():
        raise MoesimError(f"{where}: {what} {float(a[~(np.abs(a) < 2.0**63)][0])!r} is out of range")
    return a.astype(np.int64)


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
                     row_group_size: int = DEFAULT_ROW_GROUP, notes: list[str] | None = None,
                     inputs=()) -> ImportResult:
    """Write rows that carry the k selected experts of each (seq, pos, layer).

    Scores: ``logits`` (the router logits of those k experts, with ``lse`` the
    log-sum-exp over all E when known) are stored as the sparse scores; without
    logits, log(weights) stands in (so softmax over the k gives back the
    weights: for softmax gatings they are the logits shifted by a constant per
    step, candidate scores a step policy can use; a sigmoid router's are not,
    and the trace is marked ``scores: false``); without either, the weights are
    exactly 1/k with equal scores, the trace is marked ``scores: false``, and
    its ``tie_order`` is ``stored`` so that the source's order still says
    which expert was the first choice. The selected experts are always stored,
    and the weights when given, so replay uses what the source recorded.
    ``inputs``: the files imported, which ``out`` must not be.
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
        if meta.gating == "sigmoid":
            meta = meta.replace(scores=False)
    else:
        # No scores in the source: true 1/k weights (a threshold rule must see exactly 1/k);
        # the rank order lives in the stored order of `selected`, which tie_order keeps.
        weights = np.full((n, k), 1.0 / k)
        scores = np.zeros((n, k))
        meta = meta.replace(tie_order="stored", scores=False)
    if lse is None:
        top = scores.max(axis=1)
        lse = top + np.log(np.exp(scores - top[:, None]).sum(axis=1))
    lse = np.broadcast_to(np.asarray(lse, dtype=np.float64), (n,))
    if not np.isfinite(lse).all():
        raise MoesimError(f"{where}: lse holds NaN or infinite values")

    order = np.lexsort((layer, pos, seq))
    phase_arr = np.broadcast_to(np.asarray(phase, dtype=object), (n,))
    writer = TraceWriter(out, meta, selected=True, weights=weights is not None, domains=domains,
                         token=token is not None, row_group_size=row_group_size, inputs=inputs)
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


def load_json(path: Path):
    """The document of one JSON file. Malformed, unreadable or absurdly nested input
    (Python's parser recurses once per level) is a MoesimError, never a traceback."""
    data = read_bytes(path, "JSON file")
    try:
        return json.loads(data, object_pairs_hook=_one_of_each)
    except _Duplicate as dup:
        raise MoesimError(f"{path}: a JSON object names {dup.args[0]!r} twice (two prompts or fields of one name: "
                          "one would be lost)") from None
    except RecursionError:
        raise MoesimError(f"{path}: JSON nested too deeply (routing records are a few levels deep)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise MoesimError(f"{path}: not valid JSON ({' '.join(str(exc).split())[:120]})") from None


class _Duplicate(Exception):
    pass


def _one_of_each(pairs: list) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise _Duplicate(k)
        out[k] = v
    return out


def preset_for(model_id: str | None):
    """The moesim model preset whose name or Hugging Face id is ``model_id``, else None:
    it supplies the gating, shared experts and bytes per expert an import cannot see."""
    if not model_id:
        return None
    from moesim.costmodel.models import find_model

    return find_model(model_id)


def preset_meta(p) -> dict:
    """TraceMeta fields a model preset knows (empty without one)."""
    if p is None:
        return {}
    return {"family": p.family, "gating": p.gating, "norm_topk_prob": p.norm_topk_prob,
            "routed_scaling_factor": p.routed_scaling_factor, "n_shared_experts": p.n_shared_experts,
            "dense_layers": tuple(x for x in p.dense_layers), "bytes_per_expert": p.bytes_per_expert_table()}


def complete_tokens(seq: np.ndarray, pos: np.ndarray, layer: np.ndarray, moe_layers, where: str) -> np.ndarray:
    """Mask of the rows whose token (seq, pos) has every one of ``moe_layers``.
    A (seq, pos, layer) given twice is still an error: dropping cannot fix it."""
    lut = np.full(max(moe_layers) + 1, -1, dtype=np.int64)
    lut[list(moe_layers)] = np.arange(len(moe_layers))
    tok = (seq.astype(np.int64) << 32) | pos.astype(np.int64)
    uniq, inv, counts = np.unique(tok, return_inverse=True, return_counts=True)
    slot = inv * len(moe_layers) + lut[layer]
    srt = np.sort(slot)
    dup = srt[1:] == srt[:-1]
    if dup.any():
        t = int(srt[1:][dup][0]) // len(moe_layers)
        s, p = int(uniq[t] >> 32), int(uniq[t] & 0xFFFFFFFF)
        raise MoesimError(f"{where}: token (seq={s}, pos={p}) has some layer twice")
    return counts[inv] == len(moe_layers)


def id_span_note(ids: np.ndarray, E: int) -> list[str]:
    """A warning when the ids never reach the upper half of 0..E-1 although there are
    plenty of selections: E is then probably wrong, and every budget fraction with it."""
    top = int(ids.max()) + 1 if ids.size else 0
    if ids.size >= 4 * E and top <= E // 2:
        return [f"expert ids only span 0..{top - 1} of E={E}: is the number of experts (--experts) right?"]
    return []


def _span(xs) -> str:
    xs = list(xs)
    if len(xs) > 2 and xs == list(range(xs[0], xs[-1] + 1)):
        return f"{xs[0]}..{xs[-1]}"
    return ", ".join(map(str, xs))
