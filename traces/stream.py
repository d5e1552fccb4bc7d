"""A trace too large to decode in memory: decoded once, a chunk of whole tokens at a time, into flat
binary files on disk, then read back a chunk at a time by every replay (each replay process reads
the files itself; nothing large is shared or held).

``DecodedStore.from_file(path, directory)`` streams a Parquet trace (its rows must be in token order:
(seq, pos) ascending, a token's L layer rows together, as every moesim writer writes them);
``DecodedStore.from_routing(routing, directory)`` writes an in-memory Routing the same way (tests, and
streaming a routing on purpose). Per-token keys (sequence, phase: 5 bytes a token) and the router
requests per expert stay in memory; the [tokens, layers, k] arrays live in the files:

- ``sel.bin`` int16, ``w.bin`` float32 [T, L, k]; ``cand.bin`` int16 [T, L, M] (substitution candidates);
- ``logits.bin`` float32 [T, L, M], the candidates' router logits (Routing.logits), when asked for and the
  trace has them (``from_file(..., logits=True)``; a Routing's whenever it carries them);
- ``next.bin`` uint32 [T, L, k], written on demand by a reverse pass over the chunks (Belady): the
  distance to the same expert's next request, (tokens ahead) * k + its rank, 2^32 - 1 for never.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np

from moesim.errors import MoesimError
from moesim.traces.meta import PHASES, TraceMeta
from moesim.traces.reader import TraceFile
from moesim.traces.routing import Routing, _decoded_batches, placeholder_scores

CHUNK_BYTES = 32 << 20  # decoded bytes per chunk a replay reads (about; whole tokens)
NO_NEXT = np.uint32(0xFFFFFFFF)
_FILES = {"sel": np.int16, "w": np.float32, "cand": np.int16, "logits": np.float32, "next": np.uint32}


@dataclass
class Chunk:
    """Tokens t0 .. t0 + n - 1 of a stored trace (views of reusable buffers)."""

    t0: int
    sel: np.ndarray
    w: np.ndarray
    cand: np.ndarray
    next_req: np.ndarray  # int64 ticks (traces/derived.py); empty when not asked for
    seq: np.ndarray
    logits: np.ndarray  # float32 [n, L, M], the candidates' logits; [n, L, 0] when not asked for


class DecodedStore:
    """A decoded trace in a directory of flat files (see the module's docstring). Deleting the
    directory (``close()``, or leaving a ``with`` block) is the owner's job; it is never reused
    across runs."""

    def __init__(self, directory: Path, meta: TraceMeta, seq: np.ndarray, phase: np.ndarray, counts: np.ndarray,
                 digest: str, path: Path | None, n_candidates: int, owned: bool, has_scores: bool = False):
        self.dir = Path(directory)
        self.meta = meta
        self.seq = seq
        self.phase = phase
        self._counts = counts
        self.digest = digest
        self.path = path
        self.n_candidates = n_candidates
        self.has_scores = has_scores  # logits.bin holds the candidates' logits (Routing.has_scores)
        self._owned = owned
        self._first: np.ndarray | None = None
        self._memo: dict = {}

    # ------------------------------------------------------------------------------------------ shape
    @property
    def n_tokens(self) -> int:
        return len(self.seq)

    @property
    def n_layers(self) -> int:
        return self.meta.n_layers

    @property
    def n_experts(self) -> int:
        return self.meta.n_experts

    @property
    def top_k(self) -> int:
        return self.meta.top_k

    @property
    def synthetic(self) -> bool:
        return bool(self.meta.synthetic)

    @property
    def n_sequences(self) -> int:
        return int(len(np.unique(self.seq)))

    def chunk_tokens(self, chunk_tokens: int | None = None) -> int:
        """Tokens per chunk: ``chunk_tokens``, else MOESIM_STREAM_TOKENS, else about CHUNK_BYTES."""
        n = chunk_tokens or stream_tokens_env()
        if not n:
            per_token = self.n_layers * (self.top_k * (2 + 4 + 8) + (2 + 4 * self.has_scores) * self.n_candidates)
            n = max(1, CHUNK_BYTES // per_token)
        return int(min(n, self.n_tokens))

    # ------------------------------------------------------------------------------------------ build
    @classmethod
    def from_file(cls, source, directory: str | os.PathLike | None = None, *, candidates: bool = True,
                  logits: bool = False, chunk_tokens: int | None = None) -> DecodedStore:
        """Decode a trace file into a new store (in ``directory``, default a new temporary one).
        ``candidates=False`` leaves the substitution candidates out (replays that never substitute);
        ``logits=True`` also stores their logits, when the trace has them (``has_scores`` says; step
        policies need them)."""
        tf = source if isinstance(source, TraceFile) else TraceFile(source)
        meta = tf.meta
        if meta.frequency_only:
            raise MoesimError(f"{tf.path}: a frequency-only trace (expert counts without time order) cannot be "
                              "replayed")
        d, owned = _directory(directory)
        try:
            L, E = meta.n_layers, meta.n_experts
            M = meta.n_candidates if candidates else 0
            scored = bool(M) and logits and meta.has_scores
            counts = np.zeros(L * E, np.int64)
            seqs, phases = [], []
            placeholder = scored  # until a row's scores differ (routing.placeholder_scores)
            with _Writers(d, ("sel", "w", "cand") + ("logits",) * scored) as out:
                for seq, phase, sel, w, cand, lg in token_chunks(tf, chunk_tokens or 1024):
                    seqs.append(seq)
                    phases.append(phase)
                    out.write("sel", sel)
                    out.write("w", w)
                    if M:
                        out.write("cand", cand)
                    if scored:
                        assert lg is not None  # the trace has scores
                        out.write("logits", lg)
                        placeholder = placeholder and placeholder_scores(meta, lg)
                    counts += np.bincount((sel.astype(np.int64) + (np.arange(L) * E)[None, :, None]).reshape(-1),
                                          minlength=L * E)
            if placeholder:
                (d / "logits.bin").unlink()
            store = cls(d, meta, np.concatenate(seqs), np.concatenate(phases), counts.reshape(L, E), tf.digest,
                        tf.path, M, owned, scored and not placeholder)
            store._write_header()
            return store
        except BaseException:
            if owned:
                shutil.rmtree(d, ignore_errors=True)
            raise

    @classmethod
    def from_routing(cls, routing: Routing, directory: str | os.PathLike | None = None) -> DecodedStore:
        """Write a decoded Routing into a new store (to replay it streamed)."""
        d, owned = _directory(directory)
        try:
            with _Writers(d, ("sel", "w", "cand") + ("logits",) * (routing.logits is not None)) as out:
                out.write("sel", routing.sel)
                out.write("w", routing.w)
                out.write("cand", routing.cand)
                if routing.logits is not None:
                    out.write("logits", routing.logits)
            store = cls(d, routing.meta, np.asarray(routing.seq, np.int32), np.asarray(routing.phase, np.int8),
                        routing.request_counts(), routing.digest, routing.path, routing.n_candidates, owned,
                        routing.logits is not None)
            store._write_header()
            return store
        except BaseException:
            if owned:
                shutil.rmtree(d, ignore_errors=True)
            raise

    def _write_header(self) -> None:
        (self.dir / "store.json").write_text(json.dumps({"tokens": self.n_tokens, "digest": self.digest,
                                                         "candidates": self.n_candidates,
                                                         "logits": self.has_scores}))

    def close(self) -> None:
        if self._owned:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> DecodedStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ derived
    def request_counts(self, n_tokens: int | None = None) -> np.ndarray:
        """Router requests per (layer, expert) over the first ``n_tokens`` tokens (default all)."""
        T = self.n_tokens if n_tokens is None else min(int(n_tokens), self.n_tokens)
        if T == self.n_tokens:
            return self._counts
        key = ("request_counts", T)
        if key not in self._memo:
            L, E = self.n_layers, self.n_experts
            counts = np.zeros(L * E, np.int64)
            offsets = (np.arange(L) * E)[None, :, None]
            for c in self.chunks(self.chunk_tokens(), stop=T, what=("sel",)):
                counts += np.bincount((c.sel.astype(np.int64) + offsets).reshape(-1), minlength=L * E)
            self._memo[key] = counts.reshape(L, E)
        return self._memo[key]

    def first_requests(self) -> np.ndarray:
        """Each object's first request tick, writing next.bin (a reverse pass over the chunks) the
        first time it is asked for."""
        if self._first is None:
            from moesim.traces import stream_jit
            T, L, E, k = self.n_tokens, self.n_layers, self.n_experts, self.top_k
            if T * k >= int(NO_NEXT):
                raise MoesimError(f"a streamed replay that needs next requests (belady) handles at most "
                                  f"{(int(NO_NEXT) - 1) // k:,} tokens of top-{k} routing; this trace has {T:,}")
            last_t = np.full(L * E, -1, np.int64)
            last_r = np.zeros(L * E, np.int64)
            n = self.chunk_tokens()
            starts = list(range(0, T, n))
            path = self.dir / "next.bin"
            tmp = path.with_name(".next.bin.partial")
            with open(tmp, "wb") as f:
                f.truncate(T * L * k * 4)
                sel = np.empty((n, L, k), np.int16)
                nxt = np.empty((n, L, k), np.uint32)
                for t0 in reversed(starts):
                    m = min(n, T - t0)
                    self._read("sel", t0, m, sel[:m])
                    stream_jit.next_distances(sel[:m], E, t0, last_t, last_r, nxt[:m])
                    f.seek(t0 * L * k * 4)
                    f.write(nxt[:m].data.cast("B"))
            os.replace(tmp, path)
            self._first = stream_jit.first_ticks(last_t, last_r, L, E, k)
        return self._first

    # ------------------------------------------------------------------------------------------ read
    def _read(self, name: str, t0: int, n: int, out: np.ndarray) -> None:
        row = out.nbytes // max(1, n)
        with open(self.dir / f"{name}.bin", "rb") as f:
            f.seek(t0 * row)
            got = f.readinto(out.data.cast("B"))
        if got != out.nbytes:
            raise MoesimError(f"{self.dir / (name + '.bin')}: decoded trace file is truncated (disk full?)")

    def chunks(self, chunk_tokens: int, *, stop: int | None = None, what=("sel", "w", "cand"),
               next_req: bool = False) -> Iterator[Chunk]:
        """Read the trace ``chunk_tokens`` tokens at a time into reused buffers (each chunk's arrays are
        overwritten by the next). ``what``: the arrays to read, of sel, w, cand and logits (the others stay
        zeros, logits and cand empty); ``next_req``: also each request's next request tick."""
        T = self.n_tokens if stop is None else stop
        L, k, M, E = self.n_layers, self.top_k, self.n_candidates, self.n_experts
        unknown = set(what) - {"sel", "w", "cand", "logits"}
        if unknown:
            raise MoesimError(f"a stored trace has no array {sorted(unknown)[0]!r} (sel, w, cand, logits)")
        if "logits" in what and not self.has_scores:
            raise MoesimError("this stored trace keeps no candidate scores (logits): the trace has none, or it "
                              "was stored without them (DecodedStore.from_file(..., logits=True))")
        n = max(1, min(chunk_tokens, T))
        bufs: dict[str, np.ndarray] = {"sel": np.zeros((n, L, k), np.int16), "w": np.zeros((n, L, k), np.float32),
                "cand": np.zeros((n, L, M if "cand" in what else 0), np.int16),
                "logits": np.zeros((n, L, M if "logits" in what else 0), np.float32)}
        nxt = np.zeros((n if next_req else 0, L, k), np.int64)
        dist = np.zeros((n, L, k), np.uint32) if next_req else None
        if next_req:
            from moesim.traces import stream_jit
            self.first_requests()
        for t0 in range(0, T, n):
            m = min(n, T - t0)
            views = {name: b[:m] for name, b in bufs.items()}
            for name in what:
                if name not in ("cand", "logits") or M:
                    self._read(name, t0, m, views[name])
            if dist is not None:
                self._read("next", t0, m, dist[:m])
                stream_jit.ticks_from_distances(dist[:m], t0, E, nxt[:m])
            yield Chunk(t0=t0, sel=views["sel"], w=views["w"], cand=views["cand"],
                        next_req=nxt[:m] if next_req else nxt, seq=self.seq[t0:t0 + m], logits=views["logits"])


def stream_tokens_env() -> int | None:
    """MOESIM_STREAM_TOKENS: tokens per chunk of a streamed replay (unset: automatic)."""
    raw = os.environ.get("MOESIM_STREAM_TOKENS", "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        raise MoesimError(f"MOESIM_STREAM_TOKENS must be a positive whole number, got {raw!r}") from None
    if n < 1:
        raise MoesimError(f"MOESIM_STREAM_TOKENS must be a positive whole number, got {raw!r}")
    return n


def decoded_bytes(meta: TraceMeta, n_rows: int) -> int:
    """What decoding a trace of ``n_rows`` rows into memory takes, with next requests and the candidates'
    logits when it has them (bytes)."""
    return n_rows * (meta.top_k * (2 + 4 + 8) + (2 + 4 * meta.has_scores) * meta.n_candidates)


def _directory(directory) -> tuple[Path, bool]:
    if directory is not None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        return d, False
    base = os.environ.get("MOESIM_STREAM_DIR") or None
    try:
        return Path(tempfile.mkdtemp(prefix="moesim-stream-", dir=base)), True
    except OSError as exc:
        raise MoesimError(f"cannot create a folder for the streamed trace ({exc}); set MOESIM_STREAM_DIR "
                          "to a writable folder with room for it") from None


class _Writers:
    """Append arrays to the store's flat files."""

    def __init__(self, d: Path, names):
        self.d = d
        self.files = {n: open(d / f"{n}.bin", "wb") for n in names}

    def write(self, name: str, arr: np.ndarray) -> None:
        a = np.ascontiguousarray(arr, dtype=_FILES[name])
        try:
            self.files[name].write(a.data.cast("B"))
        except OSError as exc:
            raise MoesimError(f"cannot write the decoded trace to {self.d} ({exc}); set MOESIM_STREAM_DIR to a "
                              "folder with room for it") from None

    def __enter__(self) -> _Writers:
        return self

    def __exit__(self, *exc) -> None:
        for f in self.files.values():
            f.close()


# ----------------------------------------------------------------------------------- token-order decoding


def token_chunks(tf: TraceFile, chunk_tokens: int):
    """Decode a trace file in token order, at least ``chunk_tokens`` whole tokens at a time (one row
    group in memory at a time, in every layout). Yields (seq [n] int32, phase [n] int8, sel [n, L, k]
    int16, w [n, L, k] float32, cand [n, L, M] int16, logits [n, L, M] float32 or None when the trace has
    no candidate scores). The rows must come in token order; the checks of
    ``TraceFile.index_keys`` (each token has every MoE layer once, its rows agree on the phase) are
    made chunk by chunk."""
    meta = tf.meta
    L = meta.n_layers
    lut_size = max(meta.moe_layers) + 1
    lut = np.full(lut_size, -1, np.int64)
    lut[list(meta.moe_layers)] = np.arange(L)
    has_phase = "phase" in tf.columns
    keys = ["seq", "pos", "layer"] + ["phase"] * has_phase
    pending: list[tuple] = []  # decoded rows not yet emitted (the last token may go on in the next group)
    last_key = -1
    for g in range(tf.num_row_groups):
        parts = [(start, batch) for start, _, batch in tf.iter_group_batches(keys, row_groups=[g])]
        if not parts:
            continue
        g0 = parts[0][0]
        seq = np.concatenate([_col(b, "seq", tf.path) for _, b in parts])
        pos = np.concatenate([_col(b, "pos", tf.path) for _, b in parts])
        if (seq < 0).any() or (pos < 0).any() or (seq >= 2**31).any() or (pos >= 2**31).any():
            raise MoesimError(f"{tf.path}: seq and pos must be non-negative 32-bit integers")
        key = (seq << 32) | pos
        if key[0] < last_key or (np.diff(key) < 0).any():
            raise MoesimError(f"{tf.path}: rows are not in token order ((seq, pos) ascending, the rows of a "
                              "token together), which a streamed replay needs; replay it in memory (--no-stream)")
        last_key = int(key[-1])
        lord = np.concatenate([_layer_ords(b, lut, lut_size, tf.path) for _, b in parts])
        phase = np.concatenate([_phases(b, tf.path) for _, b in parts]) if has_phase \
            else np.full(len(seq), -1, np.int8)
        # _decoded_batches only slices layer_ord by the file rows of the groups it reads
        group_ord = cast(np.ndarray, _GroupRows(lord, g0))
        for rows, ranked, s_ord, w_ord, x in _decoded_batches(tf, group_ord, row_groups=[g]):
            r = slice(rows.start - g0, rows.stop - g0)
            lg = x if x is not None else np.zeros((len(ranked), 0), np.float32)
            pending.append((key[r], seq[r].astype(np.int32), phase[r], lord[r].astype(np.int16),
                            s_ord.astype(np.int16), w_ord.astype(np.float32), ranked.astype(np.int16), lg))
        if sum(len(p[0]) for p in pending) >= chunk_tokens * L:
            cat = [np.concatenate([p[i] for p in pending]) for i in range(8)]
            cut = int(np.searchsorted(cat[0], cat[0][-1], side="left"))
            if cut > 0:
                yield _assemble(tf, meta, [p[:cut] for p in cat])
            pending = [tuple(p[cut:] for p in cat)]
    if pending:
        cat = [np.concatenate([p[i] for p in pending]) for i in range(8)]
        if len(cat[0]):
            yield _assemble(tf, meta, cat)


class _GroupRows:
    """One row group's layer ordinals, indexed by file rows (what _decoded_batches slices)."""

    def __init__(self, values: np.ndarray, first_row: int):
        self.values, self.first_row = values, first_row

    def __getitem__(self, rows: slice) -> np.ndarray:
        return self.values[rows.start - self.first_row:rows.stop - self.first_row]


def _assemble(tf, meta, parts):
    key, seq, phase, lord, s_ord, w_ord, cand, lg = parts
    L = meta.n_layers
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    n = len(starts)
    tok = np.cumsum(np.r_[True, key[1:] != key[:-1]]) - 1
    slot = tok * L + lord
    counts = np.bincount(slot, minlength=n * L)
    if len(key) != n * L or (counts != 1).any():
        bad = int(np.argmax(counts != 1)) if (counts != 1).any() else int(np.argmax(np.bincount(tok) != L))
        t = bad // L if (counts != 1).any() else bad
        s, p = divmod(int(key[starts[t]]), 1 << 32)
        raise MoesimError(f"{tf.path}: token (seq={s}, pos={p}) does not have each of the "
                          f"{L} MoE layers exactly once")
    if (phase != phase[starts][tok]).any():
        i = int(np.argmax(phase != phase[starts][tok]))
        raise MoesimError(f"{tf.path}: the rows of token (seq={int(seq[i])}, pos={int(key[i] & 0xFFFFFFFF)}) "
                          "disagree on its phase")
    k, M = s_ord.shape[1], cand.shape[1]
    sel = np.empty((n * L, k), np.int16)
    w = np.empty((n * L, k), np.float32)
    cnd = np.empty((n * L, M), np.int16)
    sel[slot] = s_ord
    w[slot] = w_ord
    cnd[slot] = cand
    logits = None
    if lg.shape[1]:
        logits = np.empty((n * L, M), np.float32)
        logits[slot] = lg
        logits = logits.reshape(n, L, M)
    return (seq[starts].astype(np.int32), phase[starts].astype(np.int8), sel.reshape(n, L, k),
            w.reshape(n, L, k), cnd.reshape(n, L, M), logits)


def _col(batch, name: str, path) -> np.ndarray:
    col = batch.column(name)
    if col.null_count:
        raise MoesimError(f"{path}: column {name} has missing values")
    out = col.to_numpy(zero_copy_only=False)
    if out.dtype.kind == "f" and (not np.isfinite(out).all() or (out != np.round(out)).any()):
        raise MoesimError(f"{path}: column {name} must hold whole numbers")
    return out.astype(np.int64)


def _layer_ords(batch, lut, lut_size, path) -> np.ndarray:
    layer = _col(batch, "layer", path)
    ords = lut[np.clip(layer, 0, lut_size - 1)]
    bad = (layer < 0) | (layer >= lut_size) | (ords < 0)
    if bad.any():
        raise MoesimError(f"{path}: layer {int(layer[bad][0])} is not one of the MoE layers the metadata lists")
    return ords


def _phases(batch, path) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    col = batch.column("phase")
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    if col.null_count:
        raise MoesimError(f"{path}: column phase has missing values")
    idx = pc.index_in(col, value_set=pa.array(PHASES))
    if idx.null_count:
        bad = col.filter(pc.is_null(idx))[0].as_py()
        raise MoesimError(f"{path}: unknown phase {bad!r} (expected prefill or decode)")
    return idx.to_numpy(zero_copy_only=False).astype(np.int8)
