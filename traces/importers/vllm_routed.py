"""Import the routed experts vLLM returns with ``--enable-return-routed-experts``.

vLLM (``vllm/model_executor/layers/fused_moe/routed_experts_capturer.py``, ``vllm/outputs.py``) hands
each request's ``CompletionOutput.routed_experts``: an int32 array ``[seq_len, num_hidden_layers,
num_experts_per_tok]``: for every token fed to the model (prompt and generated, the last generated
token excepted), the top-k expert ids of each decoder layer, indexed by the model's layer number.
The capturer's buffer is zero-filled, so layers without a router (dense layers) stay all zeros.
vLLM returns the array in Python; saved as ``np.save(f, out.routed_experts)`` (one request) or
``np.savez(f, **{request_id: out.routed_experts, ...})`` (one member per request) it is read here,
memory-mapped, one sequence per request in archive order.

Which layers route: a model preset's MoE layers, ``--layers``, or (without either, for k > 1)
the layers whose ids are not all zero (a router never selects expert 0 k times).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from moesim.errors import MoesimError
from moesim.files import check_output
from moesim.traces.importers.common import ImportResult, tracer_info
from moesim.traces.importers.geometry import geometry
from moesim.traces.importers.moe_infinity import parse_layers
from moesim.traces.importers.npyfile import mapped_arrays
from moesim.traces.importers.tokens import TokenWriter
from moesim.traces.meta import PHASES
from moesim.traces.writer import DEFAULT_ROW_GROUP

CHUNK_ROWS = 1 << 16


def import_vllm_routed(file: str | os.PathLike, out: str | os.PathLike, *, n_experts: int | None = None,
                       model_id: str | None = None, layers: str | None = None, phase: str = "decode",
                       row_group_size: int = DEFAULT_ROW_GROUP) -> ImportResult:
    """Convert saved ``routed_experts`` arrays. ``layers``: which of the array's layer indices are MoE
    layers ('3-47', '1,3,5'); default: the preset's, else the layers that are not all zero."""
    path = Path(file)
    check_output(out, [path])
    if phase not in PHASES:
        raise MoesimError(f"unknown phase {phase!r} (expected prefill or decode)")
    where = str(path)
    with mapped_arrays(path, scratch=Path(out).resolve().parent) as arrays:
        if not arrays:
            raise MoesimError(f"{path}: the archive holds no arrays")
        names = list(arrays)
        shapes = {n: a.shape for n, a in arrays.items()}
        for n, a in arrays.items():
            label = "the array" if n == "" else f"array {n!r}"
            if a.ndim != 3 or a.shape[0] == 0:
                raise MoesimError(f"{path}: {label} must be routed_experts [tokens, layers, k], got shape {a.shape}")
            if a.dtype.kind not in "iu":
                raise MoesimError(f"{path}: {label} must hold integer expert ids, got {a.dtype}")
        if len({s[1:] for s in shapes.values()}) > 1:
            raise MoesimError(f"{path}: the requests' arrays disagree on [layers, k]: "
                              f"{', '.join(f'{n}: {s}' for n, s in list(shapes.items())[:3])}")
        _, L, k = next(iter(shapes.values()))
        g = geometry(model_id, n_experts=n_experts, file_top_k=k, where=where)
        notes: list[str] = []
        if layers is not None:
            picked = _pick(parse_layers(layers, len(_indices(layers))), L, where)
        elif g.preset is not None:
            if g.preset.n_layers != L:
                raise MoesimError(f"{path}: {L} layers, but {g.preset.name} has {g.preset.n_layers} "
                                  "(num_hidden_layers); is --model right?")
            picked = list(g.preset.moe_layers)
        else:
            if k == 1:
                raise MoesimError(f"{path}: with top-1 routing an all-zero layer may be real: name the MoE layers "
                                  "with --layers (or a --model preset)")
            live = np.zeros(L, bool)
            for a in arrays.values():
                for s in range(0, a.shape[0], CHUNK_ROWS):
                    live |= np.asarray(a[s:s + CHUNK_ROWS]).any(axis=(0, 2))
            picked = [int(x) for x in np.flatnonzero(live)]
            if not picked:
                raise MoesimError(f"{path}: every layer's ids are all zero (nothing was captured)")
            if len(picked) < L:
                notes.append(f"layer(s) {_span([x for x in range(L) if x not in picked])} all zero (no router): "
                             f"dropped")
        cols = picked = sorted(set(picked))
        g.check_layers(picked, where)
        source = {"path": str(path.resolve()), "format": "vLLM routed_experts [seq_len, num_hidden_layers, top_k] "
                  "(vllm/outputs.py CompletionOutput, routed_experts_capturer.py)",
                  "requests": [n for n in names if n] or None, "weights": "not returned by vLLM: exactly 1/k",
                  "layers": "--layers" if layers else ("preset" if g.preset is not None else "the layers not all zero")}
        meta = g.meta(picked, tracer=tracer_info("vllm-routed"), source=source)
        per = max(1, CHUNK_ROWS // len(cols))
        with TokenWriter(out, meta, scores=False, selected=True, where=where, inputs=[path], notes=notes,
                         row_group_size=row_group_size) as w:
            for seq, n in enumerate(names):
                a = arrays[n]
                for s in range(0, a.shape[0], per):
                    block = np.asarray(a[s:s + per][:, cols, :])
                    zero = ~block.any(axis=2)
                    if k > 1 and zero.any():
                        t, l = np.argwhere(zero)[0]
                        raise MoesimError(f"{path}: {'the array' if n == '' else f'request {n!r}'} token {s + t} "
                                          f"layer {cols[l]}: all ids 0 (not captured; is the layer dense? give the "
                                          "MoE layers with --layers)")
                    pos = np.arange(s, s + len(block))
                    w.add(np.full(len(block), seq), pos, phase, ids=block)
            return w.close()


def _indices(spec: str) -> list[int]:
    """'3-47' / '1,3,5' -> indices (parse_layers then checks the syntax and says what is wrong)."""
    out: list[int] = []
    for part in spec.split(","):
        a, dash, b = part.strip().partition("-")
        if dash and a.strip().isdigit() and b.strip().isdigit():
            out.extend(range(int(a), int(b) + 1))
        elif part.strip():
            out.append(0)
    return out


def _pick(picked, L: int, where: str) -> list[int]:
    bad = [x for x in picked if not 0 <= x < L]
    if bad:
        raise MoesimError(f"{where}: --layers names layer {bad[0]}; the arrays hold layers 0..{L - 1}")
    return list(picked)


def _span(xs) -> str:
    xs = list(xs)
    return f"{xs[0]}..{xs[-1]}" if len(xs) > 2 and xs == list(range(xs[0], xs[-1] + 1)) else ", ".join(map(str, xs))
