"""Import Fiddler-style expert-usage JSON (Qwen1.5-MoE-A2.7B: top-4 of 60 routed experts).

One file is one request. Per MoE layer, a prefill entry (one list of k expert ids
per prompt token) and one list of k ids per decode step, in either form:

    [[[p0 ids], [p1 ids], ...], [step 1 ids], [step 2 ids], ...]      # list: prefill first
    {"prefill": [[p0 ids], [p1 ids], ...], "decode": [[step 1 ids], ...]}

The layers are a JSON list (index = layer) or an object keyed by the layer index
("0", "layer_0", "model.layers.0", ...), optionally under a top-level
"expert_usage" / "layers" / "experts" key. The files record which experts ran,
not their gate weights: the trace gets weights 1/k, ranked in the file's order.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np

from moesim.errors import MoesimError
from moesim.traces.importers.common import ImportResult, tracer_info, write_topk_trace
from moesim.traces.meta import TraceMeta
from moesim.traces.writer import DEFAULT_ROW_GROUP

MODEL = "Qwen/Qwen1.5-MoE-A2.7B"
_WRAPPERS = ("expert_usage", "layers", "experts")
_LAYER_KEY = re.compile(r"^(?:.*?[._ -]?)(\d+)$")


def import_fiddler(files, out: str | os.PathLike, *, n_experts: int = 60, top_k: int = 4, model_id: str = MODEL,
                   family: str = "qwen2_moe", norm_topk_prob: bool = False, n_shared_experts: int = 4,
                   row_group_size: int = DEFAULT_ROW_GROUP) -> ImportResult:
    """Convert one or more Fiddler JSON files (one request each: sequence i = the
    i-th file) into a sparse trace with the selected experts."""
    files = [Path(f) for f in ([files] if isinstance(files, (str, os.PathLike)) else files)]
    if not files:
        raise MoesimError("no Fiddler JSON file given")
    rows = {"seq": [], "pos": [], "layer": [], "phase": [], "ids": []}
    layer_sets = None
    for s, f in enumerate(files):
        layers = parse_file(f, top_k)
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
    meta = TraceMeta(
        model_id=model_id, family=family, n_experts=n_experts, top_k=top_k, moe_layers=tuple(layer_sets[0]),
        gating="softmax", norm_topk_prob=norm_topk_prob, layout="sparse", n_candidates=top_k,
        n_shared_experts=n_shared_experts, synthetic=False, tracer=tracer_info("fiddler"),
        source={"paths": [str(f.resolve()) for f in files], "format": "Fiddler expert-usage JSON",
                "weights": "not in the source: uniform 1/k, ranked in the file's order"},
    )
    cat = {k: np.concatenate(v) for k, v in rows.items()}
    return write_topk_trace(out, meta, seq=cat["seq"], pos=cat["pos"], layer=cat["layer"], phase=cat["phase"],
                            ids=cat["ids"], where=", ".join(map(str, files)), row_group_size=row_group_size)


def parse_file(path: Path, k: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """{layer: (prefill ids [P, k], decode ids [D, k])}; every layer has the same P and D."""
    if not path.exists():
        raise MoesimError(f"{path}: no such file")
    try:
        doc = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise MoesimError(f"{path}: not valid JSON ({' '.join(str(exc).split())[:120]})") from None
    if isinstance(doc, dict):
        wrapped = [w for w in _WRAPPERS if w in doc]
        if len(wrapped) == 1 and isinstance(doc[wrapped[0]], (list, dict)):
            doc = doc[wrapped[0]]
    if isinstance(doc, list):
        entries = dict(enumerate(doc))
    elif isinstance(doc, dict):
        entries = {}
        for key, value in doc.items():
            m = _LAYER_KEY.match(str(key))
            if not m:
                raise MoesimError(f"{path}: key {key!r} is not a layer index (expected '0', 'layer_0', ...)")
            if int(m.group(1)) in entries:
                raise MoesimError(f"{path}: layer {int(m.group(1))} appears twice")
            entries[int(m.group(1))] = value
    else:
        raise MoesimError(f"{path}: expected a JSON list or object of layers, got {type(doc).__name__}")
    if not entries:
        raise MoesimError(f"{path}: no layers")
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
