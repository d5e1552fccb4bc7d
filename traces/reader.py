"""Open a v1 trace, check its schema and metadata, and stream its row groups."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from moesim.errors import MoesimError
from moesim.traces.meta import METADATA_KEY, PHASES, TraceMeta
from moesim.traces.schema import DENSE_COLUMNS, REQUIRED_COLUMNS, SPARSE_COLUMNS

_INT_TYPES = {"seq": pa.int32(), "pos": pa.int32(), "layer": pa.int16(), "lse": pa.float32(), "token": pa.int32()}


@dataclass
class Keys:
    """The small per-row columns, read in full (about 10 bytes a row)."""

    seq: np.ndarray
    pos: np.ndarray
    layer: np.ndarray
    phase: np.ndarray  # int8 codes into PHASES
    domain: np.ndarray | None  # int16 codes into domain_names, -1 where null
    domain_names: list[str]
    token: np.ndarray | None


class TraceFile:
    """A trace on disk. Opening it checks the file, the schema and the metadata;
    the rows are read only on demand, one row group at a time."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.exists():
            raise MoesimError(f"{self.path}: no such file")
        if self.path.is_dir():
            raise MoesimError(f"{self.path}: is a directory, not a trace file")
        try:
            self._pf = pq.ParquetFile(self.path)
            schema = self._pf.schema_arrow
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise MoesimError(f"{self.path}: not a Parquet file, or truncated ({_short(exc)})") from None
        raw = (schema.metadata or {}).get(METADATA_KEY)
        if raw is None:
            raise MoesimError(f"{self.path}: not a moesim trace (no '{METADATA_KEY.decode()}' metadata in the Parquet file)")
        try:
            self.meta = TraceMeta.from_json(raw)
        except MoesimError as exc:
            raise MoesimError(f"{self.path}: {exc}") from None
        self.schema = schema
        self._check_columns()
        self.num_rows = self._pf.metadata.num_rows
        if self.num_rows == 0:
            raise MoesimError(f"{self.path}: empty trace (no rows)")

    def _check_columns(self) -> None:
        names = set(self.schema.names)
        layout_cols = DENSE_COLUMNS if self.meta.layout == "dense" else SPARSE_COLUMNS
        missing = [c for c in (*REQUIRED_COLUMNS, *layout_cols) if c not in names]
        if missing:
            raise MoesimError(f"{self.path}: missing column(s) {', '.join(missing)} for a {self.meta.layout} trace")
        m, k, e = self.meta.n_candidates, self.meta.top_k, self.meta.n_experts
        widths = {"logits": e, "top_ids": m, "top_logits": m, "selected": k, "weights": k}
        for name, width in widths.items():
            if name not in names:
                continue
            t = self.schema.field(name).type
            size = t.list_size if pa.types.is_fixed_size_list(t) else None
            if size != width or not (pa.types.is_integer(t.value_type) or pa.types.is_floating(t.value_type)):
                raise MoesimError(f"{self.path}: column {name} must be a fixed-size list of {width} numbers, found {t}")
        for name, want in _INT_TYPES.items():
            if name in names and not (pa.types.is_integer(self.schema.field(name).type)
                                      or pa.types.is_floating(self.schema.field(name).type)):
                raise MoesimError(f"{self.path}: column {name} must be numeric ({want}), found {self.schema.field(name).type}")
        for name in ("phase", "domain"):
            if name in names:
                t = self.schema.field(name).type
                if not (pa.types.is_dictionary(t) or pa.types.is_string(t) or pa.types.is_large_string(t)):
                    raise MoesimError(f"{self.path}: column {name} must hold strings, found {t}")
        if "weights" in names and "selected" not in names:
            raise MoesimError(f"{self.path}: column weights needs the column selected")

    @property
    def columns(self) -> list[str]:
        return list(self.schema.names)

    @property
    def num_row_groups(self) -> int:
        return self._pf.num_row_groups

    @property
    def size_bytes(self) -> int:
        return self.path.stat().st_size

    @cached_property
    def digest(self) -> str:
        """Content hash of the file: keys sweep results to the exact trace they came from."""
        with open(self.path, "rb") as f:
            return hashlib.file_digest(f, "blake2b").hexdigest()[:32]

    def iter_batches(self, columns: list[str], batch_rows: int = 65536) -> Iterator[pa.RecordBatch]:
        """Stream the given columns, a row group at a time, in file order."""
        try:
            for i in range(self._pf.num_row_groups):
                table = self._pf.read_row_group(i, columns=columns)
                yield from table.to_batches(max_chunksize=batch_rows)
        except (pa.ArrowException, OSError) as exc:
            raise MoesimError(f"{self.path}: unreadable row data, the file may be truncated ({_short(exc)})") from None

    def read_keys(self) -> Keys:
        """The per-row keys of the whole trace, streamed; score columns are not read."""
        cols = ["seq", "pos", "layer", "phase"] + [c for c in ("domain", "token") if c in self.schema.names]
        parts: dict[str, list] = {c: [] for c in cols}
        for batch in self.iter_batches(cols):
            for c in cols:
                parts[c].append(batch.column(c))
        seq = _ints(parts["seq"], np.int64, "seq", self.path)
        pos = _ints(parts["pos"], np.int64, "pos", self.path)
        layer = _ints(parts["layer"], np.int64, "layer", self.path)
        phase_codes, phase_names = _strings(parts["phase"])
        if None in phase_names or (phase_codes < 0).any():
            raise MoesimError(f"{self.path}: column phase has missing values")
        bad = sorted(set(phase_names) - set(PHASES))
        if bad:
            raise MoesimError(f"{self.path}: unknown phase {bad[0]!r} (expected prefill or decode)")
        phase_map = np.array([PHASES.index(n) for n in phase_names] or [0], dtype=np.int8)
        phase = phase_map[phase_codes]
        domain, domain_names = None, []
        if "domain" in parts:
            codes, names = _strings(parts["domain"])
            domain_names = sorted(n for n in set(names) if n is not None)
            remap = np.array([domain_names.index(n) if n is not None else -1 for n in names] + [-1], dtype=np.int16)
            domain = remap[codes]
        token = _ints(parts["token"], np.int64, "token", self.path, nulls=-1) if "token" in parts else None
        if (seq < 0).any() or (pos < 0).any():
            raise MoesimError(f"{self.path}: seq and pos must be non-negative")
        return Keys(seq, pos, layer, phase, domain, domain_names, token)


def _short(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text[:160] + ("..." if len(text) > 160 else "")


def _ints(chunks: list, dtype, name: str, path: Path, nulls: int | None = None) -> np.ndarray:
    arr = pa.chunked_array(chunks) if chunks else pa.chunked_array([], pa.int64())
    if arr.null_count:
        if nulls is None:
            raise MoesimError(f"{path}: column {name} has missing values")
        arr = arr.fill_null(nulls)
    out = arr.to_numpy()
    if out.dtype.kind == "f":
        if not np.isfinite(out).all() or (out != np.round(out)).any():
            raise MoesimError(f"{path}: column {name} must hold whole numbers")
    return out.astype(dtype)


def _strings(chunks: list) -> tuple[np.ndarray, list]:
    """Dictionary-encode string chunks: (codes with -1 for null, names)."""
    arr = pa.chunked_array(chunks)
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(arr.type.value_type)
    enc = arr.combine_chunks().dictionary_encode() if len(arr) else pa.array([], pa.string()).dictionary_encode()
    codes = enc.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, enc.dictionary.to_pylist()


def open_trace(path: str | os.PathLike) -> TraceFile:
    return TraceFile(path)
