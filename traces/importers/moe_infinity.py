"""Import MoE-Infinity expert-count matrices as a frequency-only trace.

MoE-Infinity's ExpertTracer keeps, per request, a [layers x experts] matrix of
how many of the request's tokens selected each expert, and saves the collection
as one ``.npy`` array [requests, layers, experts] (float; all-zero rows are unused
capacity). Counts carry no time order, so the trace is ``frequency_only`` in the
``counts`` layout: ``moesim info`` and expert-frequency statistics work on it,
replay refuses it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from moesim.errors import MoesimError
from moesim.files import check_output
from moesim.traces.importers.common import ImportResult, tracer_info
from moesim.traces.importers.npy import load_npy, magic
from moesim.traces.meta import GATINGS, TraceMeta
from moesim.traces.writer import DEFAULT_ROW_GROUP, TraceWriter

MAX_LAYER_INDEX = 32767  # the trace's int16 layer column


def parse_layers(spec: str | None, n: int) -> tuple[int, ...]:
    """'0-23', '1,3,5' or None (0..n-1) -> layer indices; must name n layers (counted before any range is
    built: '0-999999999999' would not fit in memory)."""
    if spec is None:
        return tuple(range(n))
    spans = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        a, dash, b = part.partition("-")
        try:
            lo, hi = int(a), int(b if dash else a)
        except ValueError:
            raise MoesimError(f"--layers {spec!r}: expected indices like '0-23' or '1,3,5'") from None
        if not 0 <= lo <= hi <= MAX_LAYER_INDEX:
            raise MoesimError(f"--layers {spec!r}: {part!r} is not a range of layer indices in 0..{MAX_LAYER_INDEX}")
        spans.append((lo, hi))
    count = sum(hi - lo + 1 for lo, hi in spans)
    if count != n:
        raise MoesimError(f"--layers {spec!r} names {count} layers, the matrix has {n}")
    return tuple(i for lo, hi in spans for i in range(lo, hi + 1))


def import_moe_infinity(file: str | os.PathLike, out: str | os.PathLike, *, top_k: int,
                        model_id: str = "unknown", family: str = "unknown", layers: str | None = None,
                        n_experts: int | None = None, gating: str = "softmax", norm_topk_prob: bool = True,
                        row_group_size: int = DEFAULT_ROW_GROUP) -> ImportResult:
    """Write a counts trace: one row per (request, MoE layer) with the E counts.
    Requests keep their index in the matrix as ``seq``; all-zero requests (unused
    trace capacity) are skipped."""
    path = Path(file)
    check_output(out, [path])
    counts = load_counts(path)
    R, L, E = counts.shape
    if n_experts is not None and n_experts != E:
        raise MoesimError(f"{path}: the matrix has {E} experts per layer, --experts says {n_experts}")
    if gating not in GATINGS:
        raise MoesimError(f"unknown gating {gating!r} (expected one of {', '.join(GATINGS)})")
    moe_layers = parse_layers(layers, L)
    used = counts.reshape(R, -1).sum(axis=1) > 0
    if not used.any():
        raise MoesimError(f"{path}: every count is zero (no request was recorded)")
    sums = counts.sum(axis=2)
    bad = (sums % top_k) != 0
    if bad.any():
        r, layer = map(int, np.argwhere(bad)[0])
        raise MoesimError(f"{path}: request {r}, layer {moe_layers[layer]} counts {int(sums[r, layer])} "
                          f"selections, not a multiple of top-k={top_k} (is --top-k right?)")
    notes = []
    if (~used).any():
        notes.append(f"skipped {int((~used).sum())} all-zero request slot(s) (unused trace capacity)")
    uneven = [r for r in np.flatnonzero(used) if len(set(sums[r].tolist())) > 1]
    if uneven:
        notes.append(f"{len(uneven)} request(s) have different token counts across layers (e.g. request "
                     f"{int(uneven[0])}: {sorted(set((sums[uneven[0]] // top_k).tolist()))} tokens); "
                     "MoE-Infinity zeroes encoder layers in some modes")
    meta = TraceMeta(
        model_id=model_id, family=family, n_experts=E, top_k=top_k, moe_layers=moe_layers, gating=gating,
        norm_topk_prob=norm_topk_prob, layout="counts", n_candidates=0, frequency_only=True, synthetic=False,
        tracer=tracer_info("moe-infinity"),
        source={"path": str(path.resolve()), "format": "MoE-Infinity expert-count matrix [requests, layers, experts]",
                "requests_in_file": R},
    )
    reqs = np.flatnonzero(used)
    with TraceWriter(out, meta, phase=False, row_group_size=row_group_size, inputs=[path]) as w:
        step = max(1, row_group_size // L)
        for start in range(0, len(reqs), step):
            rr = reqs[start:start + step]
            w.write(seq=np.repeat(rr, L), pos=0, layer=np.tile(np.asarray(moe_layers), len(rr)),
                    counts=counts[rr].reshape(-1, E))
    return ImportResult(Path(out), meta, rows=len(reqs) * L, tokens=None, sequences=len(reqs), notes=notes)


def load_counts(path: Path) -> np.ndarray:
    """The [requests, layers, experts] matrix as int64, checked."""
    head = magic(path, ".npy file")
    if head[:2] == b"PK":
        raise MoesimError(f"{path}: is an .npz archive; expected a single .npy array")
    if head != b"\x93NUMPY":
        raise MoesimError(f"{path}: not a .npy file (no NumPy header)")
    a = load_npy(path)
    if a.dtype.kind not in "iuf":
        raise MoesimError(f"{path}: expected a numeric array, got dtype {a.dtype}")
    if a.ndim != 3:
        raise MoesimError(f"{path}: expected a [requests, layers, experts] array, got shape {a.shape}")
    if 0 in a.shape:
        raise MoesimError(f"{path}: empty array of shape {a.shape}")
    if a.dtype.kind == "f" and not np.isfinite(a).all():
        raise MoesimError(f"{path}: holds NaN or infinite counts")
    if (a < 0).any():
        raise MoesimError(f"{path}: holds negative counts")
    if a.dtype.kind == "f" and (a != np.round(a)).any():
        raise MoesimError(f"{path}: holds fractional counts; expected whole numbers of selections")
    if a.max() > np.iinfo(np.int32).max:
        raise MoesimError(f"{path}: a count exceeds 2^31-1")
    return a.astype(np.int64)
