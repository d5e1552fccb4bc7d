"""Import bigrig routing traces: its ``{tag}_full.npz`` files.

bigrig 0.9.1 reads them in ``bigrig_engine/pool.py`` (``load_trace``): the selected ids under
``idx`` (integers ``[L, T, k]``, layer-major, in router-rank order: "requests are flattened in
ROUTER-RANK ORDER within each token"), or router ``logits`` ``[L, T, E]`` (bigrig then takes the 8
best of each row), and ``seq_bounds``, the sequence boundaries. bigrig's code returns
``seq_bounds`` without reading it, so its layout is read here as either the token offsets where
sequences start (``[0, s1, s2, ...]``, optionally ending with T) or ``[n, 2]`` (start, end) pairs.

Logits keep every candidate's score (dense, or the M best with ``candidates``); their top-k needs
``--top-k`` or a model preset (the file does not say k). Members are memory-mapped (a compressed
one is inflated once into a scratch file beside the output), so a trace larger than memory imports
token chunk by token chunk.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from moesim.errors import MoesimError
from moesim.files import check_output
from moesim.traces.importers.common import ImportResult, tracer_info
from moesim.traces.importers.geometry import check_gating, geometry
from moesim.traces.importers.moe_infinity import parse_layers
from moesim.traces.importers.npyfile import mapped_arrays
from moesim.traces.importers.tokens import TokenWriter, score_meta
from moesim.traces.meta import PHASES
from moesim.traces.writer import DEFAULT_ROW_GROUP

CHUNK_ROWS = 1 << 16


def sequence_starts(bounds: np.ndarray | None, T: int, where: str) -> np.ndarray:
    """Start offsets of the sequences (ascending, from 0), from ``seq_bounds`` in either layout."""
    if bounds is None:
        return np.zeros(1, np.int64)
    b = np.asarray(bounds)
    if b.dtype.kind not in "iu" or b.size == 0:
        raise MoesimError(f"{where}: seq_bounds must hold integer token offsets, got {b.dtype} {b.shape}")
    b = b.astype(np.int64)
    if b.ndim == 2 and b.shape[1] == 2:
        starts, ends = b[:, 0], b[:, 1]
        if starts[0] != 0 or ends[-1] != T or (ends[:-1] != starts[1:]).any() or (ends <= starts).any():
            raise MoesimError(f"{where}: seq_bounds (start, end) pairs must cover tokens 0..{T} back to back, each "
                              "sequence non-empty")
        return starts
    if b.ndim != 1:
        raise MoesimError(f"{where}: seq_bounds must be 1-D start offsets or [n, 2] (start, end) pairs, got shape "
                          f"{b.shape}")
    if b[-1] == T and len(b) > 1:
        b = b[:-1]
    if b[0] != 0 or (np.diff(b) <= 0).any() or b[-1] >= T:
        raise MoesimError(f"{where}: seq_bounds must be increasing token offsets starting at 0 and below T={T} "
                          f"(got {b[:6].tolist()}{' ...' if len(b) > 6 else ''})")
    return b


def import_bigrig(file: str | os.PathLike, out: str | os.PathLike, *, n_experts: int | None = None,
                  top_k: int | None = None, model_id: str | None = None, layers: str | None = None,
                  candidates: int | None = None, gating: str | None = None, phase: str = "decode",
                  row_group_size: int = DEFAULT_ROW_GROUP) -> ImportResult:
    """Convert a bigrig ``*_full.npz``. ``layers``: the original indices of its L layers ('0-23';
    default 0..L-1)."""
    path = Path(file)
    check_output(out, [path])
    if phase not in PHASES:
        raise MoesimError(f"unknown phase {phase!r} (expected prefill or decode)")
    check_gating(gating)
    where = str(path)
    with mapped_arrays(path, scratch=Path(out).resolve().parent) as arrays:
        if "" in arrays:
            raise MoesimError(f"{path}: a single .npy; bigrig traces are .npz archives with idx or logits and "
                              "seq_bounds")
        has = [k for k in ("idx", "logits") if k in arrays]
        if len(has) != 1:
            raise MoesimError(f"{path}: expected one of the arrays idx [L, T, k] or logits [L, T, E] (bigrig's "
                              f"pool.load_trace); the archive holds {', '.join(sorted(arrays)) or 'nothing'}")
        data = arrays[has[0]]
        if data.ndim != 3 or 0 in data.shape:
            raise MoesimError(f"{path}: {has[0]} must have shape [layers, tokens, {'k' if has[0] == 'idx' else 'E'}], "
                              f"got {data.shape}")
        L, T, width = data.shape
        starts = sequence_starts(arrays.get("seq_bounds"), T, where)
        moe_layers = parse_layers(layers, L)
        if has[0] == "idx":
            if data.dtype.kind not in "iu":
                raise MoesimError(f"{path}: idx must hold integer expert ids, got {data.dtype}")
            g = geometry(model_id, n_experts=n_experts, top_k=top_k, file_top_k=width, where=where)
        else:
            if data.dtype.kind != "f":
                raise MoesimError(f"{path}: logits must be floating point, got {data.dtype}")
            g = geometry(model_id, n_experts=n_experts, top_k=top_k, file_experts=width, where=where)
        g.check_layers(moe_layers, where)
        source = {"path": str(path.resolve()), "format": f"bigrig *_full.npz, {has[0]} [L, T, "
                  f"{'k' if has[0] == 'idx' else 'E'}] (bigrig_engine/pool.py load_trace, 0.9.1)",
                  "sequences": "seq_bounds" if "seq_bounds" in arrays else "no seq_bounds: one sequence",
                  "weights": "not in the file: exactly 1/k" if has[0] == "idx" else "from the logits"}
        notes = [] if "seq_bounds" in arrays else ["the archive has no seq_bounds: one sequence"]
        seq_of = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, T]))
        pos_of = np.arange(T) - starts[seq_of]
        scores = has[0] == "logits"
        meta = g.meta(moe_layers, tracer=tracer_info("bigrig"), source=source, gating=gating)
        if scores:
            meta = score_meta(meta, candidates)
        elif candidates is not None:
            raise MoesimError(f"{path}: --candidates needs logits; an idx trace has only the selected experts")
        per = max(1, CHUNK_ROWS // L)
        with TokenWriter(out, meta, scores=scores, selected=not scores, where=where, inputs=[path], notes=notes,
                         row_group_size=row_group_size) as w:
            for a in range(0, T, per):
                b = min(T, a + per)
                block = np.ascontiguousarray(np.asarray(data[:, a:b, :]).transpose(1, 0, 2))
                if scores:
                    w.add(seq_of[a:b], pos_of[a:b], phase, scores=block)
                else:
                    w.add(seq_of[a:b], pos_of[a:b], phase, ids=block)
            return w.close()
