"""Import routing saved as NumPy arrays: selected expert ids [T, L, k] in a .npy or .npz file.

- ``.npy``: one integer array ``[T, L, k]``: for each of T tokens (in order) and L
  logged MoE layers, the k selected expert ids, first choice first.
- ``.npz``: the ids under one of ``ids`` / ``selected`` / ``experts`` / ``topk_ids``,
  optional ``weights`` (or ``topk_weights``) ``[T, L, k]`` gate weights in the same
  order, optional ``seq`` (or ``seq_ids``) ``[T]`` sequence ids.

Files are read with ``allow_pickle=False``: an object array is refused, never
unpickled. Positions count the tokens of each sequence in array order.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from moesim.errors import MoesimError
from moesim.files import check_output
from moesim.traces.importers.common import (
    ImportResult,
    id_span_note,
    preset_for,
    preset_meta,
    to_int64,
    tracer_info,
    write_topk_trace,
)
from moesim.traces.importers.moe_infinity import parse_layers
from moesim.traces.importers.npy import load_npy, load_npz, magic
from moesim.traces.meta import PHASES, TraceMeta
from moesim.traces.writer import DEFAULT_ROW_GROUP

NAMES = {"ids": ("ids", "selected", "experts", "topk_ids"), "weights": ("weights", "topk_weights"),
         "seq": ("seq", "seq_ids")}


def import_array(file: str | os.PathLike, out: str | os.PathLike, *, n_experts: int | None = None,
                 top_k: int | None = None, model_id: str = "unknown", layers: str | None = None,
                 phase: str = "decode", row_group_size: int = DEFAULT_ROW_GROUP) -> ImportResult:
    """Write a sparse trace from ``[T, L, k]`` selected ids (and optional weights and
    sequence ids). ``layers`` gives the original indices of the L layers ('0-23',
    '1,3,5'; default 0..L-1)."""
    path = Path(file)
    check_output(out, [path])
    if phase not in PHASES:
        raise MoesimError(f"unknown phase {phase!r} (expected prefill or decode)")
    arrays = load_arrays(path)
    ids, weights, seq = arrays["ids"], arrays.get("weights"), arrays.get("seq")
    if ids.ndim != 3 or 0 in ids.shape:
        raise MoesimError(f"{path}: expected selected ids of shape [tokens, layers, k], got {ids.shape}")
    if ids.dtype.kind not in "iu" and (ids.dtype.kind != "f" or not np.isfinite(ids).all()
                                       or (ids != np.round(ids)).any()):
        raise MoesimError(f"{path}: selected ids must be integers, got dtype {ids.dtype}")
    T, L, k = ids.shape
    if weights is not None:
        if weights.shape != ids.shape:
            raise MoesimError(f"{path}: weights have shape {weights.shape}, the ids {ids.shape}")
        if weights.dtype.kind not in "iuf":
            raise MoesimError(f"{path}: weights must be numbers, got dtype {weights.dtype}")
        weights = weights.astype(np.float64).reshape(T * L, k)
    if seq is not None:
        if seq.shape != (T,):
            raise MoesimError(f"{path}: seq must hold one sequence id per token ({T}), got shape {seq.shape}")
        if seq.dtype.kind not in "iu":
            raise MoesimError(f"{path}: seq must hold integers, got dtype {seq.dtype}")
        seq = to_int64(seq, str(path), "seq id")
        if (seq < 0).any() or (seq >= 2**31).any():
            raise MoesimError(f"{path}: seq ids must be non-negative 32-bit integers")
    else:
        seq = np.zeros(T, dtype=np.int64)
    moe_layers = parse_layers(layers, L)
    preset = preset_for(model_id if model_id != "unknown" else None)
    E = n_experts or (preset.n_experts if preset else None)
    if E is None:
        raise MoesimError("give the number of routed experts per layer with --experts E (or a --model id that "
                          "names a moesim model preset)")
    if top_k is not None and top_k != k:
        raise MoesimError(f"{path}: the array holds {k} experts per token, --top-k says {top_k}")
    source = {"path": str(path.resolve()), "format": f"NumPy {path.suffix} selected ids [T, L, k]",
              "weights": "from the file" if weights is not None else "not in the file: exactly 1/k"}
    if preset is not None:
        bad = sorted(set(moe_layers) - set(preset.moe_layers))
        if bad:
            raise MoesimError(f"layer {bad[0]} is not an MoE layer of {preset.name}; give the logged layers' "
                              "indices with --layers")
        source["preset"] = preset.name
    pos = _positions(seq)
    known = preset_meta(preset)
    meta = TraceMeta(model_id=model_id, family=known.pop("family", "unknown"), n_experts=int(E), top_k=k,
                     moe_layers=moe_layers, layout="sparse", n_candidates=k, synthetic=False, tie_order="stored",
                     tracer=tracer_info("array"), source=source, **known)
    flat = to_int64(ids, str(path), "expert id").reshape(T * L, k)
    return write_topk_trace(out, meta, seq=np.repeat(seq, L), pos=np.repeat(pos, L),
                            layer=np.tile(np.asarray(moe_layers), T), phase=phase, ids=flat, weights=weights,
                            where=str(path), row_group_size=row_group_size, notes=id_span_note(flat, int(E)),
                            inputs=[path])


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    """{'ids': ..., 'weights': ..., 'seq': ...} from a .npy or .npz, without unpickling."""
    head = magic(path, ".npy or .npz file")
    if head == b"\x93NUMPY":
        return {"ids": load_npy(path)}
    if head[:2] != b"PK":
        raise MoesimError(f"{path}: not a .npy or .npz file (no NumPy header)")
    return load_npz(path, NAMES, "ids", "selected-id")


def _positions(seq: np.ndarray) -> np.ndarray:
    """0, 1, 2, ... within each sequence, in array order."""
    order = np.argsort(seq, kind="stable")
    s = seq[order]
    start = np.r_[0, np.flatnonzero(s[1:] != s[:-1]) + 1]
    idx = np.arange(len(s)) - np.repeat(start, np.diff(np.r_[start, len(s)]))
    out = np.empty(len(s), dtype=np.int64)
    out[order] = idx
    return out
