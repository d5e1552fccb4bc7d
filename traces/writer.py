"""Write v1 traces: buffered, row-group at a time, atomically renamed into place."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from moesim.errors import MoesimError
from moesim.traces.meta import PHASES, TraceMeta
from moesim.traces.schema import arrow_schema

DEFAULT_ROW_GROUP = 65536


def _fixed_list(values: np.ndarray, width: int, dtype) -> pa.FixedSizeListArray:
    values = np.ascontiguousarray(values, dtype=dtype)
    if values.ndim != 2 or values.shape[1] != width:
        raise MoesimError(f"expected rows of {width} values, got an array of shape {values.shape}")
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), width)


def _dictionary(codes: np.ndarray | list, names: list[str], index_type) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(np.asarray(codes), type=index_type), pa.array(names, pa.string()))


class TraceWriter:
    """Append rows of one trace; ``close()`` (or leaving the ``with`` block) publishes the file.

    Rows are buffered and written one row group at a time, so a tracer's memory
    stays bounded by one chunk. The file appears under its final name only when
    complete (written to ``NAME.partial`` first, then renamed); an exception
    inside the ``with`` block leaves no file behind.
    """

    def __init__(self, path: str | os.PathLike, meta: TraceMeta, *, domains: list[str] | None = None,
                 token: bool = False, selected: bool = False, weights: bool = False,
                 row_group_size: int = DEFAULT_ROW_GROUP):
        self.path = Path(path)
        self.meta = meta
        self.domains = list(domains) if domains else None
        self.has_token, self.has_selected, self.has_weights = token, selected, weights
        self.schema = arrow_schema(meta, domain=self.domains is not None, token=token,
                                   selected=selected, weights=weights)
        self.row_group_size = row_group_size
        self._buf: list[pa.RecordBatch] = []
        self._buffered = 0
        self.rows_written = 0
        self._tmp = self.path.with_name(self.path.name + ".partial")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._pq = pq.ParquetWriter(
            self._tmp, self.schema, compression="zstd", compression_level=9,
            use_dictionary=["phase", "domain"], write_statistics=["seq", "pos", "layer"],
            use_byte_stream_split=[c for c in ("logits", "top_logits", "lse", "weights")
                                   if c in self.schema.names],
        )

    def write(self, *, seq, pos, layer, phase="decode", logits=None, top_ids=None, top_logits=None, lse=None,
              domain=None, token=None, selected=None, weights=None) -> None:
        """Append rows. ``phase``/``domain`` are a name for all rows or an array of names
        (``domain`` names must be among the writer's ``domains``)."""
        seq = np.asarray(seq, dtype=np.int32).reshape(-1)
        n = len(seq)
        cols = {
            "seq": pa.array(seq),
            "pos": pa.array(np.broadcast_to(np.asarray(pos, dtype=np.int32), (n,))),
            "layer": pa.array(np.broadcast_to(np.asarray(layer, dtype=np.int16), (n,))),
            "phase": _dictionary(self._codes(phase, list(PHASES), n, "phase"), list(PHASES), pa.int8()),
        }
        if self.domains is not None:
            cols["domain"] = _dictionary(self._codes(domain, self.domains, n, "domain"), self.domains, pa.int16())
        elif domain is not None:
            raise MoesimError("this writer was opened without domains")
        if self.has_token:
            cols["token"] = pa.array(np.broadcast_to(np.asarray(token, dtype=np.int32), (n,)))
        if self.meta.layout == "dense":
            cols["logits"] = _fixed_list(logits, self.meta.n_experts, np.float32)
        else:
            cols["top_ids"] = _fixed_list(top_ids, self.meta.n_candidates, np.int16)
            cols["top_logits"] = _fixed_list(top_logits, self.meta.n_candidates, np.float32)
            cols["lse"] = pa.array(np.broadcast_to(np.asarray(lse, dtype=np.float32), (n,)))
        if self.has_selected:
            cols["selected"] = _fixed_list(selected, self.meta.top_k, np.int16)
        if self.has_weights:
            cols["weights"] = _fixed_list(weights, self.meta.top_k, np.float32)
        batch = pa.RecordBatch.from_arrays([cols[f.name] for f in self.schema], schema=self.schema)
        self._buf.append(batch)
        self._buffered += n
        if self._buffered >= self.row_group_size:
            self._flush()

    @staticmethod
    def _codes(values, names: list[str], n: int, what: str) -> np.ndarray:
        lookup = {name: i for i, name in enumerate(names)}
        if values is None:
            raise MoesimError(f"{what} is required for every row")
        if isinstance(values, str):
            if values not in lookup:
                raise MoesimError(f"unknown {what} {values!r} (expected one of {', '.join(names)})")
            return np.full(n, lookup[values], dtype=np.int64)
        try:
            return np.fromiter((lookup[v] for v in values), dtype=np.int64, count=n)
        except KeyError as exc:
            raise MoesimError(f"unknown {what} {exc.args[0]!r} (expected one of {', '.join(names)})") from None

    def _flush(self) -> None:
        if not self._buf:
            return
        table = pa.Table.from_batches(self._buf, schema=self.schema)
        self._pq.write_table(table, row_group_size=self.row_group_size)
        self.rows_written += table.num_rows
        self._buf, self._buffered = [], 0

    def close(self) -> Path:
        self._flush()
        self._pq.close()
        os.replace(self._tmp, self.path)
        return self.path

    def abort(self) -> None:
        self._buf = []
        try:
            self._pq.close()
        finally:
            self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False
