"""Open a trace, check its schema and metadata, and stream its row groups."""

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
from moesim.files import regular_file
from moesim.traces.meta import METADATA_KEY, PHASES, TraceMeta
from moesim.traces.schema import required_columns

_INT_TYPES = {"seq": pa.int32(), "pos": pa.int32(), "layer": pa.int16(), "lse": pa.float32(), "token": pa.int32()}


@dataclass
class Keys:
    """The small per-row columns, read in full (about 10 bytes a row)."""

    seq: np.ndarray
    pos: np.ndarray
    layer: np.ndarray
    phase: np.ndarray  # int8 codes into PHASES; -1: not given (counts traces only: the whole request)
    domain: np.ndarray | None  # int16 codes into domain_names, -1 where null
    domain_names: list[str]
    token: np.ndarray | None


@dataclass
class KeyIndex:
    """Where each row goes once tokens are ordered by (seq, pos): row i fills slot
    ``target[i]`` = token * L + layer ordinal; ``tok_rows[t]`` is one row of token t."""

    target: np.ndarray
    tok_rows: np.ndarray
    n_tokens: int


class TraceFile:
    """A trace on disk. Opening it checks the file, the schema and the metadata;
    the rows are read only on demand, streamed in batches of ``batch_rows``."""

    batch_rows = 65536

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.exists():
            raise MoesimError(f"{self.path}: no such file")
        if self.path.is_dir():
            raise MoesimError(f"{self.path}: is a directory, not a trace file")
        regular_file(self.path, "trace file")  # a FIFO would block the reader forever
        try:
            self._pf = pq.ParquetFile(self.path, page_checksum_verification=True)
            schema = self._pf.schema_arrow
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise MoesimError(f"{self.path}: not a Parquet file, or truncated ({_short(exc)})") from None
        raw = (schema.metadata or {}).get(METADATA_KEY)
        if raw is None:
            raise MoesimError(f"{self.path}: not a moesim trace "
                              f"(no '{METADATA_KEY.decode()}' metadata in the Parquet file)")
        try:
            self.meta = TraceMeta.from_json(raw)
        except MoesimError as exc:
            raise MoesimError(f"{self.path}: {exc}") from None
        self.schema = schema
        self._check_columns()
        self.num_rows = self._pf.metadata.num_rows
        if self.num_rows == 0:
            raise MoesimError(f"{self.path}: empty trace (no rows)")
        self._check_footer()

    def _check_footer(self) -> None:
        """Row counts in the footer that disagree with each other: a damaged or forged file (the
        counts actually read are checked against them in ``iter_batches``)."""
        md = self._pf.metadata
        groups = [md.row_group(i) for i in range(md.num_row_groups)]
        if sum(g.num_rows for g in groups) != md.num_rows:
            raise MoesimError(f"{self.path}: damaged footer: the file claims {md.num_rows} rows, its row groups "
                              f"{sum(g.num_rows for g in groups)}")
        seq = self.schema.get_field_index("seq")
        for i, g in enumerate(groups):
            if g.num_rows < 0 or g.column(seq).num_values != g.num_rows:
                raise MoesimError(f"{self.path}: damaged footer: row group {i} claims {g.num_rows} rows but "
                                  f"{g.column(seq).num_values} seq values")

    def _check_columns(self) -> None:
        names = set(self.schema.names)
        missing = [c for c in required_columns(self.meta) if c not in names]
        if missing:
            raise MoesimError(f"{self.path}: missing column(s) {', '.join(missing)} for a {self.meta.layout} trace")
        m, k, e = self.meta.n_candidates, self.meta.top_k, self.meta.n_experts
        widths = {"logits": e, "top_ids": m, "top_logits": m, "selected": k, "weights": k, "counts": e,
                  "gate_logits": k, "lookahead": k}
        integral = {"top_ids", "selected", "counts", "lookahead"}
        for name, width in widths.items():
            if name not in names:
                continue
            t = self.schema.field(name).type
            size = t.list_size if pa.types.is_fixed_size_list(t) else None
            ok = size is not None and (pa.types.is_integer(t.value_type) if name in integral
                                       else pa.types.is_integer(t.value_type) or pa.types.is_floating(t.value_type))
            if size != width or not ok:
                kind = "integers" if name in integral else "numbers"
                raise MoesimError(f"{self.path}: column {name} must be a fixed-size list of {width} {kind}, found {t}")
        for name, want in _INT_TYPES.items():
            if name in names and not (pa.types.is_integer(self.schema.field(name).type)
                                      or pa.types.is_floating(self.schema.field(name).type)):
                raise MoesimError(f"{self.path}: column {name} must be numeric ({want}), "
                                  f"found {self.schema.field(name).type}")
        if self.meta.layout == "ranked":
            self._check_ranked(names)
        if self.meta.layout == "counts":
            extra = [c for c in ("selected", "weights", "logits", "top_ids", "top_logits", "lookahead") if c in names]
            if extra:
                raise MoesimError(f"{self.path}: a counts (frequency-only) trace cannot have "
                                  f"column(s) {', '.join(extra)}")
        for name in ("phase", "domain"):
            if name in names:
                t = self.schema.field(name).type
                if not (pa.types.is_dictionary(t) or pa.types.is_string(t) or pa.types.is_large_string(t)):
                    raise MoesimError(f"{self.path}: column {name} must hold strings, found {t}")
        if "weights" in names and "selected" not in names:
            raise MoesimError(f"{self.path}: column weights needs the column selected")

    def _check_ranked(self, names: set) -> None:
        from moesim.traces.ranked import code_width

        meta = self.meta
        m = meta.n_candidates
        want = {"ranked_ids": m * code_width(meta.n_experts)}
        if meta.schema_version == 2:
            if meta.logit_scale is not None:
                want["gate_gaps"] = want["gate_gaps_high"] = meta.top_k - 1
            elif "weights" not in names and "gate_logits" not in names:
                raise MoesimError(f"{self.path}: a ranked trace needs gate_logits, gate_gaps or weights for its "
                                  "gate weights")
        else:
            want["ranked_logits"] = 4 * m
            if meta.gating == "sigmoid" and meta.n_group > 1 and "selected" not in names:
                raise MoesimError(f"{self.path}: a ranked trace of group-limited sigmoid routing needs the "
                                  "selected column (its selection is not the k first-ranked candidates)")
        for name, width in want.items():
            t = self.schema.field(name).type
            if not (pa.types.is_fixed_size_binary(t) and t.byte_width == width):
                raise MoesimError(f"{self.path}: column {name} must be fixed_size_binary({width}), found {t}")

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

    def iter_batches(self, columns: list[str], batch_rows: int | None = None) -> Iterator[pa.RecordBatch]:
        """Stream the given columns in file order, ``batch_rows`` (default ``self.batch_rows``)
        rows at a time; a huge row group written by another tool is not loaded whole."""
        for _, _, batch in self.iter_group_batches(columns, batch_rows):
            yield batch

    @cached_property
    def row_group_offsets(self) -> np.ndarray:
        """File row index of each row group's first row, and the row count at the end."""
        md = self._pf.metadata
        return np.cumsum([0] + [md.row_group(i).num_rows for i in range(md.num_row_groups)])

    def iter_group_batches(self, columns: list[str], batch_rows: int | None = None,
                           row_groups: list[int] | None = None) -> Iterator[tuple[int, bool, pa.RecordBatch]]:
        """Like iter_batches, optionally only the given row groups, yielding (file row index of the
        batch's first row, first batch of its row group?, batch). A row group decodes on its own in
        every layout (version-2 ranked traces restart their move-to-front state at each)."""
        # One row group at a time: iter_batches over the whole file reads ahead across groups.
        for i in range(self._pf.num_row_groups) if row_groups is None else row_groups:
            want, got = self._pf.metadata.row_group(i).num_rows, 0
            try:
                for batch in self._pf.iter_batches(batch_size=batch_rows or self.batch_rows, columns=columns,
                                                   row_groups=[i]):
                    start, first = int(self.row_group_offsets[i]) + got, got == 0
                    got += batch.num_rows
                    if got > want:
                        break
                    yield start, first, batch
            except (pa.ArrowException, OSError, ValueError) as exc:
                raise MoesimError(f"{self.path}: unreadable row data, the file is damaged or truncated "
                                  f"({_short(exc)})") from None
            if got != want:
                raise MoesimError(f"{self.path}: damaged file: row group {i} holds {'more than ' if got > want else ''}"
                                  f"{got} rows of {', '.join(columns)}, its footer says {want}")

    def read_keys(self) -> Keys:
        """The per-row keys of the whole trace, streamed; score columns are not read."""
        cols = ["seq", "pos", "layer"] + [c for c in ("phase", "domain", "token") if c in self.schema.names]
        parts: dict[str, list] = {c: [] for c in cols}
        for batch in self.iter_batches(cols):
            for c in cols:
                parts[c].append(batch.column(c))
        seq = _ints(parts["seq"], np.int64, "seq", self.path)
        pos = _ints(parts["pos"], np.int64, "pos", self.path)
        layer = _ints(parts["layer"], np.int64, "layer", self.path)
        if "phase" in parts:
            phase_codes, phase_names = _strings(parts["phase"])
            if None in phase_names or (phase_codes < 0).any():
                raise MoesimError(f"{self.path}: column phase has missing values")
            bad = sorted(set(phase_names) - set(PHASES))
            if bad:
                raise MoesimError(f"{self.path}: unknown phase {bad[0]!r} (expected prefill or decode)")
            phase_map = np.array([PHASES.index(n) for n in phase_names] or [0], dtype=np.int8)
            phase = phase_map[phase_codes]
        else:
            phase = np.full(len(seq), -1, dtype=np.int8)
        domain, domain_names = None, []
        if "domain" in parts:
            codes, names = _strings(parts["domain"])
            domain_names = sorted(n for n in set(names) if n is not None)
            remap = np.array([domain_names.index(n) if n is not None else -1 for n in names] + [-1], dtype=np.int16)
            domain = remap[codes]
        token = _ints(parts["token"], np.int64, "token", self.path, nulls=-1) if "token" in parts else None
        if (seq < 0).any() or (pos < 0).any() or (seq > _I32).any() or (pos > _I32).any():
            raise MoesimError(f"{self.path}: seq and pos must be non-negative 32-bit integers")
        if self.meta.layout == "counts" and (pos != 0).any():
            raise MoesimError(f"{self.path}: a counts trace has one row per (request, layer): pos must be 0")
        return Keys(seq, pos, layer, phase, domain, domain_names, token)

    def index_keys(self, keys: Keys) -> KeyIndex:
        """Order tokens by (seq, pos) and check the key structure: every layer is one of
        the metadata's MoE layers, every token has each of them exactly once, and the
        rows of one token agree on its phase, domain and token id."""
        meta = self.meta
        what = "request" if meta.layout == "counts" else "token"
        target, inverse, T = slot_index(keys.seq, keys.pos, keys.layer, meta.moe_layers, str(self.path), what)
        tok_rows = np.empty(T, dtype=np.int64)
        tok_rows[inverse] = np.arange(len(inverse))
        for name, values in (("phase", keys.phase), ("domain", keys.domain), ("token", keys.token)):
            if values is not None and (values != values[tok_rows][inverse]).any():
                i = int(np.argmax(values != values[tok_rows][inverse]))
                raise MoesimError(f"{self.path}: the rows of token (seq={int(keys.seq[i])}, pos={int(keys.pos[i])}) "
                                  f"disagree on its {name}")
        return KeyIndex(target, tok_rows, T)


_I32 = 2**31 - 1


def slot_index(seq: np.ndarray, pos: np.ndarray, layer: np.ndarray, moe_layers, where: str,
               what: str = "token") -> tuple[np.ndarray, np.ndarray, int]:
    """Map rows to slots token * L + layer ordinal (tokens ordered by (seq, pos)) and check
    that every layer is one of ``moe_layers`` and every token has each exactly once.
    Returns (slot per row, token per row, number of tokens)."""
    L = len(moe_layers)
    lut_size = max(max(moe_layers), int(layer.max(initial=0))) + 1
    lut = np.full(lut_size, -1, dtype=np.int64)
    lut[list(moe_layers)] = np.arange(L)
    bad = (layer < 0) | (lut[np.clip(layer, 0, lut_size - 1)] < 0)
    if bad.any():
        raise MoesimError(f"{where}: layer {int(layer[bad][0])} is not one of the MoE layers the metadata "
                          f"lists ({_layers(moe_layers)})")
    token_key = (seq.astype(np.int64) << 32) | pos.astype(np.int64)
    uniq, inverse = np.unique(token_key, return_inverse=True)
    T = len(uniq)
    target = inverse * L + lut[layer]
    counts = np.bincount(target, minlength=T * L)
    if (counts > 1).any():
        slot = int(np.argmax(counts > 1))
        s, p = divmod(int(uniq[slot // L]), 1 << 32)
        raise MoesimError(f"{where}: duplicate rows for (seq={s}, pos={p}, layer={moe_layers[slot % L]})")
    if (counts == 0).any():
        slot = int(np.argmax(counts == 0))
        s, p = divmod(int(uniq[slot // L]), 1 << 32)
        missing = int(((counts.reshape(T, L) == 0).sum(axis=1) > 0).sum())
        raise MoesimError(f"{where}: {what} (seq={s}, pos={p}) lacks layer {moe_layers[slot % L]} "
                          f"({missing} {what}(s) miss some MoE layers)")
    return target, inverse, T


def _layers(layers) -> str:
    s = ", ".join(map(str, layers[:8]))
    return s + (", ..." if len(layers) > 8 else "")


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
