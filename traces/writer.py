"""Write traces: buffered, row-group at a time, atomically renamed into place."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from moesim.errors import MoesimError
from moesim.files import Output, write_error
from moesim.traces import gating
from moesim.traces import ranked as rk
from moesim.traces.meta import PHASES, TraceMeta
from moesim.traces.schema import arrow_schema, byte_stream_split

DEFAULT_ROW_GROUP = 65536
# zstd level of the ranked layout: level 1 writes its columns ~2x faster than 3 at sizes within ~1% (its binary
# rows are split into byte streams first; docs/trace-format.md); the other layouts' float lists gain from 9
RANKED_ZSTD_LEVEL = 1
OTHER_ZSTD_LEVEL = 9
_INFO = {t: np.iinfo(t) for t in (np.int16, np.int32)}  # the column types' ranges, looked up per write


def _fixed_list(values: np.ndarray, width: int, dtype) -> pa.FixedSizeListArray:
    values = np.ascontiguousarray(values, dtype=dtype)
    if values.ndim != 2 or values.shape[1] != width:
        raise MoesimError(f"expected rows of {width} values, got an array of shape {values.shape}")
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), width)


def _dictionary(codes: np.ndarray | list, names: pa.Array, index_type) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(np.asarray(codes), type=index_type), names)


class TraceWriter:
    """Append rows of one trace; ``close()`` (or leaving the ``with`` block) publishes the file.

    Rows are buffered and written one row group at a time, so a tracer's memory
    stays bounded by one chunk. The file appears under its final name only when
    complete (written to a temporary ``.NAME.PID-N.partial`` unique to the writer,
    then fsynced and renamed); an exception inside the ``with`` block, or a full
    disk, leaves no file behind. ``inputs``: files the command reads, which the
    destination must not be. ``compression_level``: zstd's, default RANKED_ZSTD_LEVEL for the ranked
    layout and OTHER_ZSTD_LEVEL for the others.
    """

    def __init__(self, path: str | os.PathLike, meta: TraceMeta, *, domains: list[str] | None = None,
                 token: bool = False, selected: bool = False, weights: bool = False,
                 row_group_size: int = DEFAULT_ROW_GROUP, phase: bool = True, inputs=(),
                 compression_level: int | None = None, lookahead: bool = False):
        self.path = Path(path)
        self.meta = meta
        self.domains = list(domains) if domains else None
        if weights and not selected:
            raise MoesimError("a trace with a weights column needs the selected column too")
        if meta.layout == "counts" and (selected or weights or token):
            raise MoesimError("a counts (frequency-only) trace has no selected, weights or token columns")
        if row_group_size < 1:
            raise MoesimError(f"row_group_size must be >= 1, got {row_group_size}")
        if lookahead and meta.layout == "counts":
            raise MoesimError("a counts (frequency-only) trace has no lookahead column")
        if meta.layout == "ranked" and meta.gating == "sigmoid" and meta.n_group > 1 and not selected:
            raise MoesimError("a ranked trace of group-limited sigmoid routing needs the selected column (its "
                              "selection is not the k first-ranked candidates)")
        self.has_token, self.has_selected, self.has_weights = token, selected, weights
        self.has_lookahead = lookahead
        self.has_phase = phase or meta.layout != "counts"
        self.schema = arrow_schema(meta, domain=self.domains is not None, token=token,
                                   selected=selected, weights=weights, phase=self.has_phase,
                                   lookahead=lookahead)
        self.row_group_size = row_group_size
        self._buf: list[pa.RecordBatch] = []
        self._buffered = 0
        self._bias = np.asarray(meta.selection_bias, dtype=np.float64) if meta.selection_bias is not None else None
        # a layer's ordinal among the MoE layers, -1 for any other int16 layer: one lookup checks and maps
        self._lut = np.full(max(np.iinfo(np.int16).max, *meta.moe_layers) + 1, -1, np.int32)
        self._lut[list(meta.moe_layers)] = np.arange(meta.n_layers, dtype=np.int32)
        # the dictionaries, built once rather than per write
        self._names = {"phase": pa.array(list(PHASES), pa.string()),
                       "domain": pa.array(self.domains or [], pa.string())}
        self.rows_written = 0
        # refuses an input of the command or a special file as the destination, before any work
        self._out = Output(self.path, inputs)
        self._tmp = self._out.tmp
        self._pq: pq.ParquetWriter | None = None
        try:
            self._pq = pq.ParquetWriter(
                self._tmp, self.schema, compression="zstd",
                compression_level=compression_level if compression_level is not None
                else RANKED_ZSTD_LEVEL if meta.layout == "ranked" else OTHER_ZSTD_LEVEL,
                use_dictionary=["phase", "domain"], write_statistics=["seq", "pos", "layer"],
                # CRC32 per page: damaged bytes in incompressible float data would otherwise decode silently
                write_page_checksum=True,
                use_byte_stream_split=byte_stream_split(self.schema),
            )
        except OSError as exc:
            self._out.discard()
            raise write_error(self.path, exc) from None

    def write(self, *, seq, pos, layer, phase="decode", logits=None, top_ids=None, top_logits=None, lse=None,
              counts=None, domain=None, token=None, selected=None, weights=None, ranked_ids=None,
              ranked_logits=None, lookahead=None) -> None:
        """Append rows. ``phase``/``domain`` are a name for all rows, an array of names
        (``domain`` names must be among the writer's ``domains``) or an integer array of codes
        into PHASES / the writer's ``domains``. Cheap checks run here
        (lengths, layers, expert ids, finite scores) so a tracer bug fails at the source.
        Ranked layout: ``ranked_ids`` [n, M] best selection score first, ties already broken (checked),
        and ``ranked_logits`` [n, M], their router logits (stored as float32).
        ``lookahead`` [n, k]: the experts the next MoE layer's router selects from this row's input,
        in rank order; a row of -1 is stored as null (unknown: the last MoE layer)."""
        seq = np.asarray(seq).reshape(-1)
        n = len(seq)
        layout = self.meta.layout
        given = {"logits": logits, "top_ids": top_ids, "top_logits": top_logits, "lse": lse, "counts": counts,
                 "token": token, "selected": selected, "weights": weights, "ranked_ids": ranked_ids,
                 "ranked_logits": ranked_logits, "lookahead": lookahead}
        wanted = {"dense": {"logits"}, "sparse": {"top_ids", "top_logits", "lse"}, "counts": {"counts"},
                  "ranked": {"ranked_ids", "ranked_logits"}}[layout]
        wanted |= {name for name, on in (("token", self.has_token), ("selected", self.has_selected),
                                         ("weights", self.has_weights), ("lookahead", self.has_lookahead))
                   if on}
        for name, value in given.items():
            if value is None and name in wanted:
                raise MoesimError(f"write() needs {name} for this trace ({layout} layout)")
            if value is not None and name not in wanted:
                raise MoesimError(f"write() got {name}, which this writer does not store ({layout} layout"
                                  + ("" if name in {"logits", "top_ids", "top_logits", "lse", "counts",
                                                    "ranked_ids", "ranked_logits"}
                                     else f"; open the writer with {name}=True") + ")")
        layers, ordinals = self._layers(layer, n)
        cols = {
            "seq": pa.array(self._ints(seq, n, "seq", np.int32)),
            "pos": pa.array(self._ints(pos, n, "pos", np.int32)),
            "layer": pa.array(layers),
        }
        if self.has_phase:
            cols["phase"] = _dictionary(self._codes(phase, list(PHASES), n, "phase"), self._names["phase"], pa.int8())
        if self.domains is not None:
            cols["domain"] = _dictionary(self._codes(domain, self.domains, n, "domain"), self._names["domain"],
                                         pa.int16())
        elif domain is not None:
            raise MoesimError("this writer was opened without domains")
        if self.has_token:
            cols["token"] = pa.array(self._ints(token, n, "token", np.int32, minimum=None))
        E = self.meta.n_experts
        if layout == "dense":
            cols["logits"] = _fixed_list(self._finite(logits, n, "logits"), E, np.float32)
        elif layout == "sparse":
            cols["top_ids"] = _fixed_list(self._ids(top_ids, n, "top_ids"), self.meta.n_candidates, np.int16)
            cols["top_logits"] = _fixed_list(self._finite(top_logits, n, "top_logits"), self.meta.n_candidates,
                                             np.float32)
            cols["lse"] = pa.array(self._broadcast(self._finite(lse, None, "lse").astype(np.float32), n, "lse"))
        elif layout == "ranked":
            cols["ranked_ids"], cols["ranked_logits"] = self._ranked(ranked_ids, ranked_logits, n, ordinals)
        else:
            c = np.asarray(counts)
            if c.ndim != 2 or c.shape[0] != n or (c.size and (c.dtype.kind not in "iu" or c.min() < 0)):
                raise MoesimError(f"counts must be non-negative integers, one row of E={E} per row")
            cols["counts"] = _fixed_list(c, E, np.int32)
        if self.has_selected:
            cols["selected"] = _fixed_list(self._ids(selected, n, "selected"), self.meta.top_k, np.int16)
        if self.has_weights:
            cols["weights"] = _fixed_list(self._finite(weights, n, "weights"), self.meta.top_k, np.float32)
        if self.has_lookahead:
            cols["lookahead"] = self._lookahead(lookahead, n)
        batch = pa.RecordBatch.from_arrays([cols[f.name] for f in self.schema], schema=self.schema)
        self._buf.append(batch)
        self._buffered += n
        if self._buffered >= self.row_group_size:
            self._flush()

    @staticmethod
    def _ints(values, n: int, what: str, dtype, minimum: int | None = 0) -> np.ndarray:
        a = np.asarray(values)
        if a.size and a.dtype.kind not in "iu":
            raise MoesimError(f"{what} must be integers, got {a.dtype}")
        a = TraceWriter._broadcast(a, n, what)
        info = _INFO.get(dtype) or np.iinfo(dtype)
        if a.size and (a.min() < (info.min if minimum is None else minimum) or a.max() > info.max):
            raise MoesimError(f"{what} out of range ({int(a.min())}..{int(a.max())})")
        return a.astype(dtype)

    @staticmethod
    def _broadcast(a: np.ndarray, n: int, what: str) -> np.ndarray:
        if a.ndim == 1 and len(a) == n:
            return a  # the usual case, without broadcast_to's Python overhead
        if a.ndim > 1 or (a.ndim == 1 and len(a) not in (1, n)):
            raise MoesimError(f"{what} has {a.size} values for {n} rows")
        return np.broadcast_to(a.reshape(-1), (n,))

    def _layers(self, layer, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(layers as int16, their ordinals among the MoE layers)."""
        a = self._ints(layer, n, "layer", np.int16)
        ordinals = self._lut[a]  # a is in 0..32767 here
        if a.size and ordinals.min() < 0:
            raise MoesimError(f"layer {int(a[ordinals < 0][0])} is not one of the MoE layers in the metadata")
        return a, ordinals

    def _ids(self, ids, n: int, what: str) -> np.ndarray:
        a = np.asarray(ids)
        if a.ndim != 2 or a.shape[0] != n:
            raise MoesimError(f"{what} must have one row per trace row ({n}), got shape {a.shape}")
        if a.size and a.dtype.kind not in "iu":
            raise MoesimError(f"{what} must be integer expert ids, got {a.dtype}")
        if a.size and (a.min() < 0 or a.max() >= self.meta.n_experts):
            raise MoesimError(f"{what} holds expert ids outside 0..{self.meta.n_experts - 1}")
        return a

    def _ranked(self, ranked_ids, ranked_logits, n: int, ordinals: np.ndarray):
        """The ranked layout's two columns, checked: ids in range and distinct, logits finite and in rank
        order (what the reader checks, so that a writer's bug fails here)."""
        meta = self.meta
        E, M = meta.n_experts, meta.n_candidates
        ids = np.asarray(ranked_ids)
        if ids.ndim != 2 or ids.shape != (n, M) or (ids.size and ids.dtype.kind not in "iu"):
            raise MoesimError(f"ranked_ids must be integer expert ids, M={M} per row, got an array of shape "
                              f"{ids.shape}")
        with np.errstate(invalid="ignore", over="ignore"):
            x = np.asarray(ranked_logits)
            x = x if x.dtype == np.float32 else np.asarray(x, dtype=np.float64).astype(np.float32)
        if x.shape != (n, M):
            raise MoesimError(f"ranked_logits must be M={M} numbers per row, got an array of shape {x.shape}")
        if not np.isfinite(x).all():
            raise MoesimError("ranked_logits holds NaN or infinite values (or values beyond float32)")
        score = x  # the logit as stored (float32), or for sigmoid gating sigmoid + bias of it
        if meta.gating == "sigmoid":
            bias = self._bias[ordinals[:, None], np.clip(ids, 0, E - 1)] if self._bias is not None else None
            score = gating.selection_scores(x, meta.gating, bias)
        bad_id, bad_order = rk.check_rows(ids, score, E, meta.tie_order != "stored")
        if bad_id < n:
            raise MoesimError(f"ranked_ids repeats an expert within a row or holds one outside 0..{E - 1} "
                              f"(row {self.rows_written + self._buffered + bad_id})")
        if bad_order < n:
            raise MoesimError(f"ranked_logits are not in rank order (best selection score first, equal scores "
                              f"lower id first) at row {self.rows_written + self._buffered + bad_order}")
        width = rk.code_width(E)
        return rk.binary_column(rk.id_bytes(ids, width)), rk.binary_column(rk.logit_bytes(x))

    def _lookahead(self, ids, n: int) -> pa.FixedSizeListArray:
        a = np.asarray(ids)
        k = self.meta.top_k
        if a.ndim != 2 or a.shape != (n, k) or (a.size and a.dtype.kind not in "iu"):
            raise MoesimError(f"lookahead must be integer expert ids, k={k} per row, got an array of shape {a.shape}")
        unknown = np.asarray((a < 0).all(axis=1), dtype=bool)
        if ((a < 0) & ~unknown[:, None]).any() or (a.size and a.max() >= self.meta.n_experts):
            raise MoesimError(f"lookahead holds expert ids outside 0..{self.meta.n_experts - 1} "
                              "(a row of -1 means unknown)")
        srt = np.sort(a[~unknown], axis=1)
        if (srt[:, 1:] == srt[:, :-1]).any():
            raise MoesimError("lookahead repeats an expert within a row")
        flat = pa.array(np.ascontiguousarray(np.where(unknown[:, None], 0, a), dtype=np.int16).reshape(-1))
        mask = pa.array(unknown) if unknown.any() else None
        return pa.FixedSizeListArray.from_arrays(flat, k, mask=mask)

    @staticmethod
    def _finite(values, n: int | None, what: str) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            a = np.asarray(values, dtype=np.float64)
        if n is not None and (a.ndim != 2 or a.shape[0] != n):
            raise MoesimError(f"{what} must have one row per trace row ({n}), got shape {a.shape}")
        if not np.isfinite(a).all():
            raise MoesimError(f"{what} holds NaN or infinite values")
        return a

    @staticmethod
    def _codes(values, names: list[str], n: int, what: str) -> np.ndarray:
        lookup = {name: i for i, name in enumerate(names)}
        if values is None:
            raise MoesimError(f"{what} is required for every row")
        if isinstance(values, str):
            if values not in lookup:
                raise MoesimError(f"unknown {what} {values!r} (expected one of {', '.join(names)})")
            return np.full(n, lookup[values], dtype=np.int64)
        if isinstance(values, np.ndarray) and values.dtype.kind in "iu":
            # codes into `names` (a generator that already has them skips the string round trip)
            codes = values.reshape(-1)
            if len(codes) != n or (n and (codes.min() < 0 or codes.max() >= len(names))):
                raise MoesimError(f"{what} codes must be one per row in 0..{len(names) - 1}")
            return codes
        arr = np.asarray(values, dtype=object).reshape(-1)
        if len(arr) != n:
            raise MoesimError(f"{what} has {len(arr)} values for {n} rows")
        uniq, inverse = np.unique(arr.astype(str), return_inverse=True)
        missing = [u for u in uniq.tolist() if u not in lookup]
        if missing:
            raise MoesimError(f"unknown {what} {missing[0]!r} (expected one of {', '.join(names)})")
        return np.array([lookup[u] for u in uniq.tolist()], dtype=np.int64)[inverse]

    def _flush(self, final: bool = False) -> None:
        """Write the buffered rows' complete row groups of ``row_group_size`` rows (all rows when final),
        so the file's row groups do not depend on how the rows were split into writes."""
        if not self._buf:
            return
        if self._pq is None:
            raise MoesimError(f"{self.path}: the writer is closed")
        table = pa.Table.from_batches(self._buf, schema=self.schema)
        R = self.row_group_size
        cut = table.num_rows if final else table.num_rows // R * R
        try:
            self._pq.write_table(table.slice(0, cut), row_group_size=R)
        except OSError as exc:  # a full disk: no half-written file stays behind
            self.abort()
            raise write_error(self.path, exc) from None
        self.rows_written += cut
        rest = table.slice(cut)
        self._buf = rest.to_batches() if rest.num_rows else []
        self._buffered = rest.num_rows

    def close(self) -> Path:
        try:
            self._flush(final=True)
        except BaseException:
            self.abort()
            raise
        if self.rows_written == 0:
            self.abort()
            raise MoesimError(f"{self.path}: no rows were written; an empty trace is not published")
        if self._pq is None:
            raise MoesimError(f"{self.path}: the writer is closed")
        try:
            self._pq.close()  # writes the footer: may hit a full disk too
        except OSError as exc:
            self.abort()
            raise write_error(self.path, exc) from None
        self._pq = None
        return self._out.commit()

    def abort(self) -> None:
        self._buf = []
        try:
            if self._pq is not None:
                with contextlib.suppress(OSError):
                    self._pq.close()
        finally:
            self._pq = None
            self._out.discard()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False
