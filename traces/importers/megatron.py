"""Import Megatron-LM MoE routing traces: ``router_trace_rank{N}.jsonl`` and its ``logits_rank{N}.bin`` sidecar.

Megatron-LM's ``megatron/core/transformer/moe/router_trace.py`` (``RouterTracer``, enabled with
``--moe-routing-trace-path``; core 0.20.0) writes one JSON record per (step, block, layer)::

    {"step": 0, "stage": "pre_dispatch", "block": "decoder", "layer": 3, "rank": 0,
     "num_tokens": 128, "topk": 22, "top_indices": [[12, 45, ...], ...]}

plus, with logit capture, ``logit_offset`` / ``logit_bytes`` / ``logit_shape``: where the
pre-top-k router logits ``[num_tokens, num_experts]`` of that record sit in ``logits_rank{rank}.bin``
(bfloat16). ``layer`` is the decoder layer's index in ``decoder.layers``; MTP records (``block``
"mtp", with ``mtp_idx``) are not decoder layers and are skipped.

A step is one forward pass: each step is a sequence here, its tokens in record order. With logits
the trace keeps every candidate's score (dense, or the M best with ``candidates``) and stores the
router's own selection (``top_indices``) as the selected experts; without, the selection with
weights of exactly 1/k. The file is read line by line, one step at a time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import BinaryIO

import numpy as np

from moesim.errors import MoesimError
from moesim.files import check_output, regular_file
from moesim.traces.importers.common import ImportResult, tracer_info
from moesim.traces.importers.geometry import check_gating, geometry
from moesim.traces.importers.tokens import TokenWriter, score_meta
from moesim.traces.meta import PHASES
from moesim.traces.writer import DEFAULT_ROW_GROUP


def bf16_to_float32(raw: bytes) -> np.ndarray:
    """bfloat16 bytes (little-endian) -> float32, exactly (bf16 is the top half of a float32)."""
    return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)


def import_megatron(file: str | os.PathLike, out: str | os.PathLike, *, n_experts: int | None = None,
                    model_id: str | None = None, candidates: int | None = None, gating: str | None = None,
                    phase: str = "decode", no_logits: bool = False,
                    row_group_size: int = DEFAULT_ROW_GROUP) -> ImportResult:
    """Convert one rank's router trace (its logits sidecar is read when the records point to it,
    unless ``no_logits``)."""
    path = regular_file(file, "Megatron router trace")
    check_output(out, [path])
    if phase not in PHASES:
        raise MoesimError(f"unknown phase {phase!r} (expected prefill or decode)")
    check_gating(gating)
    where = str(path)
    rd = _Reader(path, no_logits)
    w: TokenWriter | None = None
    try:
        last_step = None
        for step, recs in rd.steps():
            if last_step is not None and step <= last_step:
                raise MoesimError(f"{path}: line {recs[0][0]}: step {step} after step {last_step} (steps must "
                                  "increase)")
            last_step = step
            ids, scores = rd.assemble(step, recs)
            if w is None:
                E = scores.shape[2] if scores is not None else None
                g = geometry(model_id, n_experts=n_experts, file_experts=E, file_top_k=ids.shape[2], where=where)
                g.check_layers(rd.layers, where, "is --model right?")
                source = {"path": str(path.resolve()), "format": "Megatron-LM router_trace_rank{N}.jsonl "
                          "(megatron/core/transformer/moe/router_trace.py, core 0.20.0)",
                          "logits": str(rd.sidecar) if scores is not None else None,
                          "sequences": "one per step (forward pass), tokens in record order",
                          "weights": "from the logits" if scores is not None else "not in the trace: exactly 1/k"}
                meta = g.meta(rd.layers, tracer=tracer_info("megatron"), source=source, gating=gating)
                if scores is not None:
                    meta = score_meta(meta, candidates)
                elif candidates is not None:
                    raise MoesimError(f"{path}: --candidates needs the logits sidecar; the records carry none")
                w = TokenWriter(out, meta, scores=scores is not None, selected=True, where=where,
                                inputs=[path] + ([rd.sidecar] if rd.sidecar else []), row_group_size=row_group_size)
            elif (scores is not None) != w.scores:
                raise MoesimError(f"{path}: step {step}: some records carry logits and others not")
            n = ids.shape[0]
            w.add(np.full(n, step), np.arange(n), phase, ids=ids, scores=scores)
        if w is None:
            raise MoesimError(f"{path}: no decoder routing records")
        if rd.skipped_mtp:
            w.notes.append(f"skipped {rd.skipped_mtp} MTP record(s) (not decoder layers)")
        return w.close()
    except BaseException:
        if w is not None:
            w.abort()
        raise
    finally:
        rd.close()


class _Reader:
    def __init__(self, path: Path, no_logits: bool):
        self.path, self.no_logits = path, no_logits
        self.layers: list[int] = []
        self.sidecar: Path | None = None
        self._fh: BinaryIO | None = None
        self._size = 0
        self.skipped_mtp = 0

    def steps(self):
        """(step, [(lineno, record), ...]) in file order, one step at a time."""
        cur, recs = None, []
        try:
            with open(self.path, "rb") as fh:
                for lineno, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    rec = _loads(line, self.path, lineno)
                    if rec.get("block", "decoder") != "decoder" or "mtp_idx" in rec:
                        self.skipped_mtp += 1
                        continue
                    step = _int(rec, "step", self.path, lineno)
                    if cur is not None and step != cur:
                        yield cur, recs
                        recs = []
                    cur = step
                    recs.append((lineno, rec))
        except OSError as exc:
            raise MoesimError(f"{self.path}: cannot read it ({exc.strerror or exc})") from None
        if recs:
            yield cur, recs

    def assemble(self, step: int, recs) -> tuple[np.ndarray, np.ndarray | None]:
        by_layer: dict[int, tuple[int, dict]] = {}
        for lineno, rec in recs:
            layer = _int(rec, "layer", self.path, lineno)
            if layer in by_layer:
                raise MoesimError(f"{self.path}: line {lineno}: step {step} has layer {layer} twice")
            by_layer[layer] = (lineno, rec)
        layers = sorted(by_layer)
        if not self.layers:
            self.layers = layers
        elif layers != self.layers:
            missing = sorted(set(self.layers) ^ set(layers))
            raise MoesimError(f"{self.path}: line {recs[0][0]}: step {step} has layers {_span(layers)}, the first "
                              f"step {_span(self.layers)} (layer {missing[0]} differs)")
        ids, scores = [], []
        n = k = None
        for layer in layers:
            lineno, rec = by_layer[layer]
            top = rec.get("top_indices")
            nt, tk = _int(rec, "num_tokens", self.path, lineno), _int(rec, "topk", self.path, lineno)
            try:
                a = np.asarray(top, dtype=np.int64)
            except (ValueError, TypeError, OverflowError):
                raise MoesimError(f"{self.path}: line {lineno}: top_indices is not a [num_tokens][topk] list of "
                                  "integers") from None
            if a.shape != (nt, tk) or nt == 0:
                raise MoesimError(f"{self.path}: line {lineno}: top_indices has shape {a.shape}, the record says "
                                  f"num_tokens {nt}, topk {tk}")
            if n is not None and (nt, tk) != (n, k):
                raise MoesimError(f"{self.path}: line {lineno}: step {step} layer {layer} has {nt} tokens x top-{tk}, "
                                  f"its other layers {n} x top-{k}")
            n, k = nt, tk
            ids.append(a)
            if "logit_offset" in rec and not self.no_logits:
                scores.append(self._logits(rec, lineno, nt))
        if scores and len(scores) != len(layers):
            raise MoesimError(f"{self.path}: step {step}: only some layers' records carry logits")
        ids_arr = np.stack(ids, axis=1)
        return ids_arr, (np.stack(scores, axis=1) if scores else None)

    def _logits(self, rec: dict, lineno: int, n: int) -> np.ndarray:
        if self._fh is None:
            rank = _int(rec, "rank", self.path, lineno)
            self.sidecar = self.path.with_name(f"logits_rank{rank}.bin")
            try:
                side: BinaryIO = open(regular_file(self.sidecar, "Megatron logits sidecar"), "rb")
                self._size = os.fstat(side.fileno()).st_size
            except OSError as exc:
                raise MoesimError(f"{self.sidecar}: cannot read it ({exc.strerror or exc})") from None
            self._fh = side
        off, nbytes = _int(rec, "logit_offset", self.path, lineno), _int(rec, "logit_bytes", self.path, lineno)
        shape = rec.get("logit_shape")
        if not (isinstance(shape, list) and len(shape) == 2 and all(isinstance(x, int) for x in shape)
                and shape[0] == n and shape[1] > 0 and nbytes == 2 * shape[0] * shape[1]):
            raise MoesimError(f"{self.path}: line {lineno}: logit_shape {shape!r} / logit_bytes {nbytes} do not "
                              f"describe [num_tokens={n}, num_experts] bfloat16 logits")
        if off + nbytes > self._size:
            raise MoesimError(f"{self.sidecar}: truncated: line {lineno}'s logits end at byte {off + nbytes}, the "
                              f"file has {self._size}")
        assert self._fh is not None  # opened above
        self._fh.seek(off)
        return bf16_to_float32(self._fh.read(nbytes)).reshape(shape).astype(np.float64)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _loads(line: bytes, path: Path, lineno: int) -> dict:
    try:
        rec = json.loads(line)
    except RecursionError:
        raise MoesimError(f"{path}: line {lineno}: JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise MoesimError(f"{path}: line {lineno}: not valid JSON ({' '.join(str(exc).split())[:100]})") from None
    if not isinstance(rec, dict):
        raise MoesimError(f"{path}: line {lineno}: expected one JSON object per line")
    return rec


def _int(rec: dict, key: str, path: Path, lineno: int) -> int:
    v = rec.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise MoesimError(f"{path}: line {lineno}: {key} must be a non-negative integer, got {v!r}")
    return v


def _span(xs) -> str:
    xs = list(xs)
    return f"{xs[0]}..{xs[-1]}" if len(xs) > 2 and xs == list(range(xs[0], xs[-1] + 1)) else ", ".join(map(str, xs))
