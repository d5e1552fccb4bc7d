"""The ranked layout's byte packing and its move-to-front state (the codec itself: traces/mtf.py)."""

from __future__ import annotations

import numpy as np


def codec():
    """The jitted move-to-front encoder/decoder (numba's on-disk cache, see moesim.jitcache)."""
    from moesim.traces import mtf

    return mtf


def new_state(n_layers: int, n_experts: int) -> tuple[np.ndarray, np.ndarray]:
    """(lists [L, E] int32: position -> expert, the decoder's state; where [L, E] int64: expert ->
    position, the encoder's), every list 0..E-1: the state at the first row of every row group."""
    lists = np.tile(np.arange(n_experts, dtype=np.int32), (n_layers, 1))
    return lists, lists.astype(np.int64)


def code_width(n_experts: int) -> int:
    """Bytes per move-to-front code: 1 for E <= 256, else 2."""
    return 1 if n_experts <= 256 else 2


def pack_into(codes: np.ndarray, width: int, out: np.ndarray) -> None:
    """Codes [n, M] as bytes into ``out`` [n, M * width] uint8: one byte each, or (width 2) the M low bytes
    then the M high bytes, so the mostly-zero high bytes sit together."""
    if width == 1:
        out[...] = codes
        return
    m = codes.shape[1]
    np.bitwise_and(codes, 0xFF, out=out[:, :m], casting="unsafe")
    np.right_shift(codes, 8, out=out[:, m:], casting="unsafe")


def unpack(raw: np.ndarray, m: int, width: int) -> np.ndarray:
    """Inverse of pack_into: bytes [n, M * width] -> codes [n, M] int32."""
    if width == 1:
        return raw.astype(np.int32)
    return raw[:, :m].astype(np.int32) | (raw[:, m:].astype(np.int32) << 8)


def binary_column(raw: np.ndarray, valid: np.ndarray | None = None):
    """Bytes [n, w] as an Arrow fixed_size_binary(w) array, without copying per row; rows where
    ``valid`` is False are null."""
    import pyarrow as pa

    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    bitmap = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
    nulls = -1 if valid is None else int((~valid).sum())
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(raw.shape[1]), raw.shape[0],
                                                [bitmap, pa.py_buffer(raw)], null_count=nulls)


def gap_columns(gaps: np.ndarray):
    """Gaps [n, k-1] in 0..65535 as (gate_gaps: the low bytes, gate_gaps_high: the high bytes,
    null in rows whose gaps all fit a byte), or None when a gap is out of that range."""
    from moesim.traces.ranked_bytes import split_gaps

    g = np.asarray(gaps)
    low, high, some, ok = split_gaps(
        np.ascontiguousarray(g if g.size else g.astype(np.int64)))
    return (binary_column(low), binary_column(high, some)) if ok else None


def gaps_of(low_col, high_col, width: int) -> np.ndarray:
    """Inverse of gap_columns: int32 [n, width]."""
    g = binary_rows(low_col, width).astype(np.int32)
    if high_col is not None and high_col.null_count < len(high_col):
        rows = np.asarray(high_col.is_valid())
        g[rows] |= binary_rows(high_col, width)[rows].astype(np.int32) << 8
    return g


def binary_rows(col, width: int) -> np.ndarray:
    """An Arrow fixed_size_binary(width) array (no nulls) as bytes [n, width]."""
    buf = col.buffers()[1]
    n = len(col)
    flat = np.frombuffer(buf, dtype=np.uint8, count=(col.offset + n) * width)
    return flat[col.offset * width:].reshape(n, width)
