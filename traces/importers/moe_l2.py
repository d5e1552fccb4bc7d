"""Import moe-l2 routing logs: the ``EXPERT|L<l>|T<t>: [ids] [ids] ...`` lines its patched llama-server prints
with ``LLAMA_EXPERT_LOG=1``.

moe-l2 0.14.1 reads these lines in ``moe_l2/collect.py`` (``parse_expert_lines``), ``moe_l2/gate.py``
(``_EXPERT_LINE_RE``) and ``moe_l2/data/generate_expert_map.py`` (``parse_expert_line``): layer ``l``,
then a number ``t``, then bracketed lists of comma-separated expert ids, each list as long as the
model's top-k. Its examples (``EXPERT|L0|T2: [..] [..]``, ``EXPERT|L3|T4: [12,45] [3,77] ...``)
pair ``T<t>`` with t lists, so this reader takes ``t`` as the number of tokens in the batch the line
logs and each list as one token's k experts, first choice first, and checks that they agree. One
batch is one line per MoE layer; the i-th line of every layer belongs to batch i.

Sequences: llama-server's log does not name requests. A batch of several tokens (a prompt) after
single-token batches (decode steps) starts a new sequence; ``one_sequence`` keeps the whole log as
one. Tokens of multi-token batches are phase prefill, single-token ones decode. Lines without
``EXPERT|`` (the server's other output) are skipped; a line with it that does not parse is an error.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from moesim.errors import MoesimError
from moesim.files import check_output, regular_file
from moesim.traces.importers.common import ImportResult, tracer_info
from moesim.traces.importers.geometry import geometry
from moesim.traces.importers.tokens import TokenWriter
from moesim.traces.writer import DEFAULT_ROW_GROUP

MARK = "EXPERT|"
LINE = re.compile(r"EXPERT\|L(\d+)\|T(\d+):(.*)$")
BODY = re.compile(r"(\s*\[[0-9,\s]*\])*\s*")
LIST = re.compile(r"\[([^\]]*)\]")
CHUNK_TOKENS = 4096


def parse_line(line: str, lineno: int, path: Path) -> tuple[int, list[list[int]]] | None:
    """(layer, the token lists) of one log line; None for a line that is not a routing record."""
    at = line.find(MARK)
    if at < 0:
        return None
    m = LINE.match(line.rstrip("\r\n"), at)
    if m is None or BODY.fullmatch(m.group(3)) is None:
        raise MoesimError(f"{path}: line {lineno}: not a complete EXPERT|L<layer>|T<tokens>: [ids] ... record "
                          f"({line.strip()[:80]!r})")
    layer, t = int(m.group(1)), int(m.group(2))
    lists = []
    for body in LIST.findall(m.group(3)):
        parts = [p.strip() for p in body.split(",")]
        if not parts or any(not p.isdigit() for p in parts):
            raise MoesimError(f"{path}: line {lineno}: id list [{body.strip()[:40]}] is not comma-separated expert ids")
        lists.append([int(p) for p in parts])
    if not lists:
        raise MoesimError(f"{path}: line {lineno}: no expert ids")
    if t != len(lists):
        raise MoesimError(f"{path}: line {lineno}: T{t} announces {t} token(s) but the line lists {len(lists)} id "
                          "list(s) (truncated?)")
    return layer, lists


def import_moe_l2(file: str | os.PathLike, out: str | os.PathLike, *, n_experts: int | None = None,
                  top_k: int | None = None, model_id: str | None = None, one_sequence: bool = False,
                  drop_incomplete: bool = False, row_group_size: int = DEFAULT_ROW_GROUP) -> ImportResult:
    """Convert a moe-l2 / ``LLAMA_EXPERT_LOG`` log (streamed line by line)."""
    path = regular_file(file, "log file")
    check_output(out, [path])
    st = _State(path, one_sequence)
    w: TokenWriter | None = None
    g = None
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for lineno, line in enumerate(fh, 1):
                rec = parse_line(line, lineno, path)
                if rec is None:
                    st.skipped += 1
                    continue
                for batch in st.take(rec[0], rec[1], lineno):
                    if w is None:
                        g = geometry(model_id, n_experts=n_experts, top_k=top_k, file_top_k=batch.shape[2],
                                     where=str(path))
                        g.check_layers(st.layers, str(path), "is --model right?")
                        w = _writer(out, g, st, path, row_group_size)
                    st.emit(batch, w, lineno)
        for batch in st.finish(drop_incomplete):
            if w is None:
                g = geometry(model_id, n_experts=n_experts, top_k=top_k, file_top_k=batch.shape[2], where=str(path))
                g.check_layers(st.layers, str(path), "is --model right?")
                w = _writer(out, g, st, path, row_group_size)
            st.emit(batch, w, 0)
        if w is None:
            raise MoesimError(f"{path}: no EXPERT|L<layer>|T<tokens>: lines (run llama-server with LLAMA_EXPERT_LOG=1)")
        st.flush(w)
        assert g is not None
        w.notes.extend(st.notes)
        if st.n_ids >= 4 * g.n_experts and st.max_id + 1 <= g.n_experts // 2:
            w.notes.append(f"expert ids only span 0..{st.max_id} of E={g.n_experts}: is the number of experts "
                           "(--experts) right?")
        return w.close()
    except OSError as exc:
        if w is not None:
            w.abort()
        raise MoesimError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except BaseException:
        if w is not None:
            w.abort()
        raise


def _writer(out, g, st: _State, path: Path, row_group_size: int) -> TokenWriter:
    source = {"path": str(path.resolve()), "format": "moe-l2 LLAMA_EXPERT_LOG lines EXPERT|L<l>|T<t>: [ids] ... "
              "(moe_l2/collect.py, gate.py, 0.14.1)", "tokens": "T<t> = tokens of the batch, one id list each",
              "sequences": "one sequence" if st.one_sequence else
              "a multi-token batch (prompt) after single-token batches starts a new sequence",
              "weights": "not in the log: exactly 1/k"}
    meta = g.meta(st.layers, tracer=tracer_info("moe-l2"), source=source)
    return TokenWriter(out, meta, scores=False, selected=True, where=str(path), inputs=[path],
                       row_group_size=row_group_size)


class _State:
    """Lines waiting for the other layers of their batch, and the sequence/position counters."""

    def __init__(self, path: Path, one_sequence: bool):
        self.path, self.one_sequence = path, one_sequence
        self.layers: list[int] = []
        self.frozen = False
        self.pending: dict[int, list[tuple[int, list[list[int]]]]] = {}
        self.order: list[int] = []  # layers in order of first appearance, while the first batch is read
        self.skipped = 0
        self.seq, self.pos, self.last_t = -1, 0, 0
        self.buf: list = []
        self.max_id, self.n_ids = -1, 0
        self.notes: list[str] = []

    def take(self, layer: int, lists, lineno: int):
        if not self.frozen:
            if layer in self.pending:
                self._freeze()
            else:
                self.order.append(layer)
                self.pending[layer] = []
        if self.frozen and layer not in self.pending:
            raise MoesimError(f"{self.path}: line {lineno}: layer {layer} is not one of the layers of the first batch "
                              f"({', '.join(map(str, self.layers))})")
        self.pending[layer].append((lineno, lists))
        if self.frozen:
            lens = [len(v) for v in self.pending.values()]
            if max(lens) - min(lens) > 1:
                lag = min(self.pending, key=lambda x: len(self.pending[x]))
                raise MoesimError(f"{self.path}: line {lineno}: layer {layer} logs another batch while layer {lag} "
                                  "has not logged the previous one (a layer's line is missing)")
            yield from self._ready()

    def _freeze(self) -> None:
        self.frozen = True
        self.layers = sorted(self.order)

    def _ready(self):
        while all(self.pending[x] for x in self.layers):
            yield self._batch([self.pending[x].pop(0) for x in self.layers])

    def _batch(self, lines):
        ts = {len(lists) for _, lists in lines}
        if len(ts) > 1:
            raise MoesimError(f"{self.path}: line {lines[-1][0]}: the layers' lines of one batch log different "
                              f"numbers of tokens ({', '.join(str(len(x)) for _, x in lines)})")
        ks = {len(ids) for _, lists in lines for ids in lists}
        if len(ks) > 1:
            raise MoesimError(f"{self.path}: line {lines[-1][0]}: id lists of {min(ks)} and {max(ks)} experts; every "
                              "token selects the same k")
        ids = np.array([lists for _, lists in lines], dtype=np.int64)  # [L, T, k]
        if ids.size and ids.max() > 32767:
            raise MoesimError(f"{self.path}: line {lines[-1][0]}: expert id {int(ids.max())} is out of range")
        return ids.transpose(1, 0, 2)

    def finish(self, drop_incomplete: bool):
        if not self.frozen and self.pending:
            self._freeze()
            yield from self._ready()
        left = {x: len(v) for x, v in self.pending.items() if v}
        if left:
            lacking = [x for x in self.layers if not self.pending[x]]
            if not drop_incomplete:
                raise MoesimError(f"{self.path}: the last batch has no line for layer {lacking[0]} (the log ends "
                                  "mid-batch: --drop-incomplete drops that batch)")
            self.notes.append(f"dropped the last batch: the log ends before layer {lacking[0]}'s line")

    def emit(self, batch: np.ndarray, w: TokenWriter, lineno: int) -> None:
        T = batch.shape[0]
        if batch.shape[2] != w.meta.top_k:
            raise MoesimError(f"{self.path}: line {lineno or 'at the end'}: id lists of {batch.shape[2]} experts, "
                              f"earlier ones of {w.meta.top_k}; every token selects the same k")
        if self.seq < 0 or (not self.one_sequence and T > 1 and self.last_t == 1):
            self.seq, self.pos = self.seq + 1, 0
        self.last_t = T
        phase = "prefill" if T > 1 else "decode"
        if batch.max() >= w.meta.n_experts:
            bad = int(batch[batch >= w.meta.n_experts][0])
            raise MoesimError(f"{self.path}: line {lineno or 'at the end'}: expert id {bad} is outside "
                              f"0..{w.meta.n_experts - 1}")
        srt = np.sort(batch, axis=2)
        if (srt[:, :, 1:] == srt[:, :, :-1]).any():
            raise MoesimError(f"{self.path}: line {lineno or 'at the end'}: a token lists one expert twice; a router "
                              "selects k distinct experts")
        self.max_id = max(self.max_id, int(batch.max()))
        self.n_ids += batch.size
        self.buf.append((np.full(T, self.seq), np.arange(self.pos, self.pos + T), np.full(T, phase, object), batch))
        self.pos += T
        if sum(len(b[0]) for b in self.buf) >= CHUNK_TOKENS:
            self.flush(w)

    def flush(self, w: TokenWriter) -> None:
        if self.buf:
            seq, pos, phase, ids = (np.concatenate(x) for x in zip(*self.buf))
            self.buf = []
            w.add(seq, pos, phase, ids=ids)
