"""The ranked layout's bytes (schema version 3): per row the M candidates' ids in rank order and their
router logits, each row one fixed-size binary value. Parquet's BYTE_STREAM_SPLIT encoding, applied to
these columns, splits a row group's values into one stream per byte position (a candidate rank's low id
bytes together, the exponents of its logits together, ...), which zstd then codes well: smaller and faster
to write than float32 lists (docs/trace-format.md, "Bytes"). Version 2's bytes: traces/ranked_v2.py."""

from __future__ import annotations

import numpy as np

ID_TYPES: dict[int, np.dtype] = {1: np.dtype("u1"), 2: np.dtype("<u2")}
LOGIT_TYPE: np.dtype = np.dtype("<f4")


def code_width(n_experts: int) -> int:
    """Bytes per candidate id: 1 for E <= 256, else 2 (little-endian)."""
    return 1 if n_experts <= 256 else 2


def id_bytes(ids: np.ndarray, width: int) -> np.ndarray:
    """Ids [n, M] (in 0..E-1, checked by the caller) as bytes [n, M * width]."""
    a = np.ascontiguousarray(ids, dtype=ID_TYPES[width])
    return a.view(np.uint8).reshape(a.shape[0], -1)


def ids_of(raw: np.ndarray, width: int) -> np.ndarray:
    """Inverse of id_bytes: bytes [n, M * width] -> ids [n, M] int16 (E <= 32767)."""
    return np.ascontiguousarray(raw).view(ID_TYPES[width]).astype(np.int16)


def logit_bytes(x: np.ndarray) -> np.ndarray:
    """Logits [n, M] as float32 bytes [n, 4M]."""
    a = np.ascontiguousarray(x, dtype=LOGIT_TYPE)
    return a.view(np.uint8).reshape(a.shape[0], -1)


def logits_of(raw: np.ndarray) -> np.ndarray:
    """Inverse of logit_bytes: bytes [n, 4M] -> float32 [n, M] (native byte order)."""
    return np.ascontiguousarray(raw).view(LOGIT_TYPE).astype(np.float32)


def binary_column(raw: np.ndarray, valid: np.ndarray | None = None):
    """Bytes [n, w] as an Arrow fixed_size_binary(w) array, without copying per row; rows where
    ``valid`` is False are null."""
    import pyarrow as pa

    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    bitmap = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
    nulls = -1 if valid is None else int((~valid).sum())
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(raw.shape[1]), raw.shape[0],
                                                [bitmap, pa.py_buffer(raw)], null_count=nulls)


def binary_rows(col, width: int) -> np.ndarray:
    """An Arrow fixed_size_binary(width) array (no nulls) as bytes [n, width]."""
    buf = col.buffers()[1]
    n = len(col)
    flat = np.frombuffer(buf, dtype=np.uint8, count=(col.offset + n) * width)
    return flat[col.offset * width:].reshape(n, width)


def check_rows(ids: np.ndarray, scores: np.ndarray | None, n_experts: int, ties_by_id: bool) -> tuple[int, int]:
    """(the first row of ids [n, M] holding an id outside 0..E-1 or repeating one, the first row whose
    selection scores [n, M] are out of rank order: higher than the one before, or with ``ties_by_id``
    equal with a lower id), each n when there is none; ``scores`` None: no order check (jitted:
    traces/ranked_check.py)."""
    from moesim.traces.ranked_check import first_bad_rows

    a = ids if ids.dtype in (np.int16, np.int32, np.int64) else ids.astype(np.int64)
    sc = np.zeros((0, 0), np.float32) if scores is None else scores
    if sc.dtype not in (np.float32, np.float64):
        sc = sc.astype(np.float64)
    bad_id, bad_order = first_bad_rows(np.ascontiguousarray(a), np.ascontiguousarray(sc), n_experts, ties_by_id)
    return int(bad_id), int(bad_order)
