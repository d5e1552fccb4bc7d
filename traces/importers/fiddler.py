"""Import Fiddler expert-selection JSON (default geometry: Qwen1.5-MoE-A2.7B, top-4 of 60).

One file is one request, in one of two layouts (docs/importers.md):

- pass-major, what Fiddler's recorder writes: ``{"<forward pass>": {"<layer>":
  [flat list of expert ids]}}``. Pass 0 is the prompt: the top-k ids of every
  prompt token concatenated, k per token, in token order; passes 1, 2, ... are
  single decode steps of k ids.
- layer-major: per MoE layer a prefill entry (one list of k ids per prompt
  token) and one list of k ids per decode step, as
  ``[[[p0 ids], [p1 ids], ...], [step 1 ids], ...]`` or
  ``{"prefill": [[p0 ids], ...], "decode": [[step 1 ids], ...]}``.

Layers (and passes) are keyed by their index ("0", "layer_0", "model.layers.0",
...) or listed in order, optionally under a top-level "expert_usage" / "layers" /
"experts" key. The files record which experts ran, not their gate weights: the
trace gets weights exactly 1/k, the file's order kept as the rank order.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from moesim.errors import MoesimError
from moesim.files import check_output
from moesim.traces.importers.common import ImportResult, id_span_note, load_json, tracer_info, write_topk_trace
from moesim.traces.meta import TraceMeta
from moesim.traces.writer import DEFAULT_ROW_GROUP

MODEL = "Qwen/Qwen1.5-MoE-A2.7B"
_WRAPPERS = ("expert_usage", "layers", "experts")
_LAYER_KEY = re.compile(r"^(?:.*?[._ -]?)(\d+)$")


def import_fiddler(files, out: str | os.PathLike, *, n_experts: int = 60, top_k: int | None = None,
                   model_id: str = MODEL,
                   family: str = "qwen2_moe", norm_topk_prob: bool = False, n_shared_experts: int = 4,
                   row_group_size: int = DEFAULT_ROW_GROUP) -> ImportResult:
    """Convert one or more Fiddler JSON files (one request each: sequence i = the
    i-th file) into a sparse trace with the selected experts. ``top_k`` defaults
    to the ids per decode step (or per prompt token in the layer-major layout)."""
    files = [Path(f) for f in ([files] if isinstance(files, (str, os.PathLike)) else files)]
    if not files:
        raise MoesimError("no Fiddler JSON file given")
    check_output(out, files)
    rows: dict[str, list[np.ndarray]] = {"seq": [], "pos": [], "layer": [], "phase": [], "ids": []}
    layer_sets: tuple[list[int], Path] | None = None
    layouts = set()
    for s, f in enumerate(files):
        layers, layout, k = parse_file(f, top_k)
        layouts.add(layout)
        if top_k is None:
            top_k = k
        if layer_sets is None:
            layer_sets = (sorted(layers), f)
        elif sorted(layers) != layer_sets[0]:
            diff = sorted(set(layers) ^ set(layer_sets[0]))
            raise MoesimError(f"{f}: its layers differ from {layer_sets[1]} (layer {diff[0]} is in only one)")
        for layer, (prefill, decode) in layers.items():
            ids = np.concatenate([prefill, decode]) if len(decode) else prefill
            n, P = len(ids), len(prefill)
            rows["seq"].append(np.full(n, s))
            rows["pos"].append(np.arange(n))
            rows["layer"].append(np.full(n, layer))
            rows["phase"].append(np.array(["prefill"] * P + ["decode"] * (n - P), dtype=object))
            rows["ids"].append(ids)
    assert layer_sets is not None and top_k is not None  # files is not empty: the loop set both
    meta = TraceMeta(
        model_id=model_id, family=family, n_experts=n_experts, top_k=top_k, moe_layers=tuple(layer_sets[0]),
        gating="softmax", norm_topk_prob=norm_topk_prob, layout="sparse", n_candidates=top_k,
        n_shared_experts=n_shared_experts, synthetic=False, tracer=tracer_info("fiddler"),
        tie_order="stored",
        source={"paths": [str(f.resolve()) for f in files],
                "format": f"Fiddler expert-selection JSON ({', '.join(sorted(layouts))})",
                "weights": "not in the source: exactly 1/k, ranked in the file's order"},
    )
    cat = {k: np.concatenate(v) for k, v in rows.items()}
    return write_topk_trace(out, meta, seq=cat["seq"], pos=cat["pos"], layer=cat["layer"], phase=cat["phase"],
                            ids=cat["ids"], where=", ".join(map(str, files)), row_group_size=row_group_size,
                            notes=id_span_note(cat["ids"], n_experts), inputs=files)



def parse_file(path: Path, k: int | None) -> tuple[dict[int, tuple[np.ndarray, np.ndarray]], str, int]:
    """({layer: (prefill ids [P, k], decode ids [D, k])}, layout, k); every layer has the same P and D."""
    doc = load_json(path)
    if isinstance(doc, dict):
        wrapped = [w for w in _WRAPPERS if w in doc]
        if len(wrapped) == 1 and isinstance(doc[wrapped[0]], (list, dict)):
            doc = doc[wrapped[0]]
    if not isinstance(doc, (list, dict)):
        raise MoesimError(f"{path}: expected a JSON list or object of layers or forward passes, "
                          f"got {type(doc).__name__}")
    entries = _indexed(doc, path, "layer")
    if not entries:
        raise MoesimError(f"{path}: no layers")
    if all(isinstance(v, dict) and not ({"prefill", "decode"} & set(v)) for v in entries.values()):
        return _pass_major(entries, path, k)
    if k is None:
        k = _first_width(entries)
    return _layer_major(entries, path, k), "layer-major", k


def _indexed(doc, path: Path, what: str) -> dict:
    """A JSON list (index = position) or an object keyed by '0', 'layer_0', ... -> {index: value}."""
    if isinstance(doc, list):
        return dict(enumerate(doc))
    out = {}
    for key, value in doc.items():
        m = _LAYER_KEY.match(str(key))
        if not m:
            raise MoesimError(f"{path}: key {key!r} is not a {what} index (expected '0', '{what}_0', ...)")
        if int(m.group(1)) in out:
            raise MoesimError(f"{path}: {what} {int(m.group(1))} appears twice")
        out[int(m.group(1))] = value
    return out


def _first_width(entries: dict) -> int:
    """k of the layer-major layout: the length of the first per-token id list."""
    for entry in entries.values():
        first = entry.get("prefill") if isinstance(entry, dict) else (entry[0] if isinstance(entry, list) and entry
                                                                       else None)
        if isinstance(first, list) and first and isinstance(first[0], list) and first[0]:
            return len(first[0])
    return 4


def _pass_major(passes: dict, path: Path, k: int | None):
    """Fiddler's recorder: {pass: {layer: flat ids}}; pass 0 = the prompt, k ids per token."""
    numbers = sorted(passes)
    if numbers != list(range(len(numbers))):
        gap = next(i for i, n in enumerate(numbers) if n != i)
        raise MoesimError(f"{path}: forward pass {gap} is missing (passes must be numbered 0, 1, 2, ...; "
                          "pass 0 is the prompt)")
    by_pass = {n: _indexed(passes[n], path, "layer") for n in numbers}
    layers = sorted(by_pass[0])
    if not layers:
        raise MoesimError(f"{path}: forward pass 0 holds no layers")
    for n in numbers[1:]:
        if sorted(by_pass[n]) != layers:
            diff = min(set(by_pass[n]) ^ set(layers))
            raise MoesimError(f"{path}: forward pass {n} has different layers from pass 0 (layer {diff} is in only "
                              "one of them); every pass runs every MoE layer")
    if k is None:
        if len(numbers) < 2:
            raise MoesimError(f"{path}: only the prompt pass is recorded, so top-k cannot be told from a decode "
                              "step; give --top-k")
        first = by_pass[1][layers[0]]
        k = len(_flat(first, f"{path}: pass 1 layer {layers[0]}"))
        if k < 1:
            raise MoesimError(f"{path}: pass 1 layer {layers[0]} selects no experts")
    out = {}
    P = None
    for layer in layers:
        where = f"{path}: pass 0 layer {layer}"
        flat = _flat(by_pass[0][layer], where)
        if not flat or len(flat) % k:
            raise MoesimError(f"{where}: the prompt pass holds {len(flat)} ids, not a positive multiple of "
                              f"top-k={k} (is --top-k right?)")
        if P is None:
            P = (len(flat) // k, layer)
        elif len(flat) // k != P[0]:
            raise MoesimError(f"{where}: {len(flat) // k} prompt tokens, but layer {P[1]} has {P[0]}; every layer "
                              "sees the same tokens")
        prefill = _ids([flat[i:i + k] for i in range(0, len(flat), k)], k, where)
        steps = []
        for n in numbers[1:]:
            step = _flat(by_pass[n][layer], f"{path}: pass {n} layer {layer}")
            steps.append(step)
        decode = _ids(steps, k, f"{path}: layer {layer} decode (pass 1 onwards)") if steps else \
            np.empty((0, k), dtype=np.int64)
        out[layer] = (prefill, decode)
    return out, "pass-major", k


def _flat(entry, where: str) -> list:
    """A pass's ids of one layer: a flat list, or per-token lists concatenated."""
    if not isinstance(entry, list):
        raise MoesimError(f"{where}: expected a list of expert ids, got {type(entry).__name__}")
    if entry and all(isinstance(x, list) for x in entry):
        entry = [i for x in entry for i in x]
    for x in entry:
        if not isinstance(x, int) or isinstance(x, bool):
            raise MoesimError(f"{where}: {x!r} is not an integer expert id")
    return entry


def _layer_major(entries: dict, path: Path, k: int) -> dict:
    out = {}
    shape = None
    for layer, entry in sorted(entries.items()):
        where = f"{path}: layer {layer}"
        if isinstance(entry, dict):
            extra = sorted(set(entry) - {"prefill", "decode"})
            if "prefill" not in entry or extra:
                raise MoesimError(f"{where}: expected keys 'prefill' and 'decode'"
                                  + (f", found {', '.join(map(repr, extra))}" if extra else ""))
            prefill, decode = entry["prefill"], entry.get("decode") or []
        elif isinstance(entry, list) and entry:
            prefill, decode = entry[0], entry[1:]
        else:
            raise MoesimError(f"{where}: expected [prefill entry, decode step ids...] or "
                              "{'prefill': ..., 'decode': [...]}")
        p = _prefill(prefill, k, where)
        d = _steps(decode, k, where)
        if shape is None:
            shape = (len(p), len(d), layer)
        elif (len(p), len(d)) != shape[:2]:
            raise MoesimError(f"{where}: {len(p)} prompt tokens and {len(d)} decode steps, but layer {shape[2]} "
                              f"has {shape[0]} and {shape[1]}; every layer sees the same tokens")
        out[layer] = (p, d)
    return out


def _prefill(entry, k: int, where: str) -> np.ndarray:
    if not isinstance(entry, list) or not entry:
        raise MoesimError(f"{where}: the prefill entry must be a non-empty list of per-token id lists")
    if all(isinstance(x, int) for x in entry):
        if len(entry) == k:
            return _ids([entry], k, where + " prefill")
        raise MoesimError(f"{where}: the prefill entry is a flat list of {len(entry)} ids; expected one list of "
                          f"k={k} ids per prompt token")
    return _ids(entry, k, where + " prefill")


def _steps(entry, k: int, where: str) -> np.ndarray:
    if not isinstance(entry, list):
        raise MoesimError(f"{where}: decode steps must be a list of id lists")
    # a step may be written as [ids] or [[ids]] (a batch of one token)
    steps = [s[0] if isinstance(s, list) and len(s) == 1 and isinstance(s[0], list) else s for s in entry]
    if not steps:
        return np.empty((0, k), dtype=np.int64)
    return _ids(steps, k, where + " decode")


def _ids(rows, k: int, where: str) -> np.ndarray:
    for i, r in enumerate(rows):
        if not isinstance(r, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in r):
            raise MoesimError(f"{where}: entry {i} is not a list of integer expert ids")
        if len(r) != k:
            raise MoesimError(f"{where}: entry {i} has {len(r)} expert ids, expected top-k={k}")
    return np.asarray(rows, dtype=np.int64).reshape(-1, k)
