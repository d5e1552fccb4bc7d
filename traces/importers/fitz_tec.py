"""Import fitz-tec router traces: the binary RTRACE01 files of its patched llama.cpp's ``llama-router-trace``.

Layout (fitz-tec 0.1.1, ``fitz_tec/tools/_trace_format.py``, little-endian)::

    8 bytes  magic "RTRACE01"
    int32    n_experts E
    int32    header version (0)
    records, one per (token, layer): int32 token_idx, int32 layer_idx, float32 softmax[E]

Each record holds the softmax over all E experts, so the trace keeps every candidate's score
(log p: dense with all E, or the M best with ``candidates``). The file does not say k; the model's
top-k comes from ``--top-k`` or a model preset. The records are memory-mapped: only their
(token, layer) keys and their sort order (~24 bytes a record) are held while tokens are written in order.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from moesim.errors import MoesimError
from moesim.files import check_output, regular_file
from moesim.traces.importers.common import ImportResult, tracer_info
from moesim.traces.importers.geometry import geometry
from moesim.traces.importers.tokens import LOG_ZERO, TokenWriter, score_meta
from moesim.traces.meta import PHASES
from moesim.traces.writer import DEFAULT_ROW_GROUP

MAGIC = b"RTRACE01"
HEADER_BYTES = 16
VERSION = 0
# |sum of a record's softmax - 1| above this is not a softmax over all E (float32 sums of E <= 32767 terms
# are exact to ~1e-4)
SUM_TOLERANCE = 1e-3
CHUNK_ROWS = 1 << 16


def record_dtype(n_experts: int) -> np.dtype:
    return np.dtype([("token", "<i4"), ("layer", "<i4"), ("probs", "<f4", (n_experts,))])


def write_rtrace(path: str | os.PathLike, tokens, layers, probs) -> None:
    """Write an RTRACE01 file (test fixtures; the same bytes the published layout describes)."""
    probs = np.asarray(probs, dtype="<f4")
    rec = np.zeros(len(tokens), dtype=record_dtype(probs.shape[1]))
    rec["token"], rec["layer"], rec["probs"] = tokens, layers, probs
    with open(path, "wb") as fh:
        fh.write(MAGIC + np.array([probs.shape[1], VERSION], dtype="<i4").tobytes() + rec.tobytes())


def import_fitz_tec(file: str | os.PathLike, out: str | os.PathLike, *, top_k: int | None = None,
                    model_id: str | None = None, candidates: int | None = None, prompt_tokens: int = 0,
                    norm_topk_prob: bool | None = None, row_group_size: int = DEFAULT_ROW_GROUP) -> ImportResult:
    """Convert an RTRACE01 trace. One run is one sequence: ``token_idx`` is the position; the first
    ``prompt_tokens`` tokens are the prompt (phase prefill), the rest decode."""
    path = regular_file(file, "RTRACE01 file")
    check_output(out, [path])
    if prompt_tokens < 0:
        raise MoesimError(f"--prompt-tokens must be >= 0, got {prompt_tokens}")
    size = os.path.getsize(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(HEADER_BYTES)
    except OSError as exc:
        raise MoesimError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if len(head) < 8 or head[:8] != MAGIC:
        raise MoesimError(f"{path}: not a fitz-tec router trace (magic {head[:8]!r}, expected {MAGIC!r})")
    if len(head) < HEADER_BYTES:
        raise MoesimError(f"{path}: truncated header ({len(head)} of {HEADER_BYTES} bytes)")
    E, version = (int(x) for x in np.frombuffer(head[8:16], dtype="<i4"))
    if version != VERSION:
        raise MoesimError(f"{path}: header version {version}; this reader knows version {VERSION} (fitz-tec 0.1.1)")
    if not 1 <= E <= 32767:
        raise MoesimError(f"{path}: header says {E} experts (expected 1..32767)")
    dt = record_dtype(E)
    body = size - HEADER_BYTES
    n, rest = divmod(body, dt.itemsize)
    if rest:
        raise MoesimError(f"{path}: truncated: the last record has {rest} of its {dt.itemsize} bytes (record "
                          f"{n + 1}: int32 token, int32 layer, {E} float32 probabilities)")
    if n == 0:
        raise MoesimError(f"{path}: no records after the header")
    rec = np.memmap(path, dtype=dt, mode="r", offset=HEADER_BYTES, shape=(n,))
    token = np.asarray(rec["token"], dtype=np.int64)
    layer = np.asarray(rec["layer"], dtype=np.int64)
    if (token < 0).any() or (layer < 0).any() or (layer > 32767).any():
        i = int(np.argmax((token < 0) | (layer < 0) | (layer > 32767)))
        raise MoesimError(f"{path}: record {i + 1}: token {int(token[i])}, layer {int(layer[i])} is not a token "
                          "index and layer index")
    layers = np.unique(layer)
    L = len(layers)
    order = np.lexsort((layer, token))
    t_sorted, l_sorted = token[order], layer[order]
    dup = (t_sorted[1:] == t_sorted[:-1]) & (l_sorted[1:] == l_sorted[:-1])
    if dup.any():
        i = int(np.argmax(dup))
        raise MoesimError(f"{path}: token {int(t_sorted[i])} has layer {int(l_sorted[i])} twice (records "
                          f"{int(order[i]) + 1} and {int(order[i + 1]) + 1})")
    uniq, counts = np.unique(t_sorted, return_counts=True)
    if (counts != L).any():
        t = int(uniq[np.argmax(counts != L)])
        have = set(l_sorted[t_sorted == t].tolist())
        missing = sorted(set(layers.tolist()) - have)
        raise MoesimError(f"{path}: token {t} has no record for layer {missing[0]}; "
                          f"{int((counts != L).sum())} of {len(uniq)} tokens lack some of the {L} layers")
    del token, layer, t_sorted, l_sorted
    g = geometry(model_id, top_k=top_k, file_experts=E, where=str(path))
    g.check_layers(layers.tolist(), str(path), "is --model right?")
    gating = "softmax"
    notes = []
    if g.preset is not None and g.preset.gating != "softmax":
        notes.append(f"{g.preset.name} gates with {g.preset.gating}; the file holds a softmax over all E, which "
                     "the trace keeps (gating softmax)")
    source = {"path": str(path.resolve()), "format": "fitz-tec RTRACE01 (fitz_tec/tools/_trace_format.py, 0.1.1)",
              "header_version": version, "records": int(n), "scores": "log of the recorded softmax over all E",
              "sequences": "one run: token_idx is the position",
              "phases": f"first {prompt_tokens} tokens prefill, the rest decode" if prompt_tokens else "all decode"}
    meta = score_meta(g.meta(layers.tolist(), tracer=tracer_info("fitz-tec"), source=source, gating=gating,
                             norm_topk_prob=norm_topk_prob), candidates)
    per = max(1, CHUNK_ROWS // L)
    with TokenWriter(out, meta, scores=True, selected=False, where=str(path), inputs=[path], notes=notes,
                     row_group_size=row_group_size) as w:
        for a in range(0, len(uniq), per):
            rows = order[a * L:min(a + per, len(uniq)) * L]  # every token has exactly L records
            block = rec[np.sort(rows)]  # ascending file offsets: a sequential read of the map
            block = block[np.lexsort((block["layer"], block["token"]))]
            p = np.asarray(block["probs"], dtype=np.float64).reshape(-1, L, E)
            toks = block["token"][::L].astype(np.int64)
            _check_probs(p, toks, layers, path)
            scores = np.log(np.maximum(p, 1e-300))
            scores[p <= 0] = LOG_ZERO
            phase = np.where(toks < prompt_tokens, PHASES[0], PHASES[1])
            w.add(np.zeros(len(toks), np.int64), toks, phase, scores=scores)
        return w.close()


def _check_probs(p: np.ndarray, toks: np.ndarray, layers: np.ndarray, path: Path) -> None:
    bad = ~np.isfinite(p).all(axis=2) | (p < 0).any(axis=2) | (p > 1 + SUM_TOLERANCE).any(axis=2)
    sums = p.sum(axis=2)
    off = np.abs(sums - 1.0) > SUM_TOLERANCE
    if bad.any() or off.any():
        t, l = np.argwhere(bad | off)[0]
        what = (f"probabilities that sum to {sums[t, l]:.6g}, not 1 (a softmax over all E)" if not bad[t, l]
                else "values that are not probabilities (NaN, negative or above 1)")
        raise MoesimError(f"{path}: token {int(toks[t])} layer {int(layers[l])}: record holds {what}")
