"""Import nested per-prompt routing JSON (e.g. an ONNX Runtime GenAI dump):

    {"num_experts": E, "top_k": k, "num_layers": L, "model": "...",
     "prompts": {"<name>": {"prefill": [pos][layer][k], "decode": [step][layer][k]}}}

Each prompt is one sequence, its name the domain; prefill tokens take positions
0..P-1, decode steps P, P+1, ... Ids are listed in the router's order (first
choice first); the file holds no weights, so they are exactly 1/k.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from moesim.errors import MoesimError
from moesim.files import check_output
from moesim.traces.importers.common import (
    ImportResult,
    id_span_note,
    load_json,
    preset_for,
    preset_meta,
    to_int64,
    tracer_info,
    write_topk_trace,
)
from moesim.traces.importers.moe_infinity import parse_layers
from moesim.traces.meta import TraceMeta
from moesim.traces.writer import DEFAULT_ROW_GROUP

_TOP_KEYS = {"num_experts", "top_k", "num_layers", "prompts", "model", "model_id"}


def import_prompts(file: str | os.PathLike, out: str | os.PathLike, *, n_experts: int | None = None,
                   top_k: int | None = None, model_id: str | None = None, layers: str | None = None,
                   row_group_size: int = DEFAULT_ROW_GROUP) -> ImportResult:
    path = Path(file)
    check_output(out, [path])
    doc = load_json(path)
    if not isinstance(doc, dict):
        raise MoesimError(f"{path}: expected a JSON object with a 'prompts' object, got {type(doc).__name__}")
    extra = sorted(set(doc) - _TOP_KEYS)
    if extra:
        raise MoesimError(f"{path}: unexpected top-level key {extra[0]!r} (expected {', '.join(sorted(_TOP_KEYS))})")
    prompts = doc.get("prompts")
    if not isinstance(prompts, dict) or not prompts:
        raise MoesimError(f"{path}: 'prompts' must be a non-empty object of prompt name -> routing")
    E_doc, k_doc, L_doc = (_count(doc, key, path) for key in ("num_experts", "top_k", "num_layers"))
    model = model_id or doc.get("model_id") or doc.get("model") or "unknown"
    if not isinstance(model, str):
        raise MoesimError(f"{path}: 'model' must be a string")
    preset = preset_for(model if model != "unknown" else None)
    E = n_experts or E_doc or (preset.n_experts if preset else None)
    if E is None:
        raise MoesimError(f"{path}: no num_experts key; give --experts E")
    if n_experts and E_doc and n_experts != E_doc:
        raise MoesimError(f"{path}: says num_experts {E_doc}, --experts says {n_experts}")
    if top_k and k_doc and top_k != k_doc:
        raise MoesimError(f"{path}: says top_k {k_doc}, --top-k says {top_k}")
    k = top_k or k_doc
    L = L_doc
    seqs, poss, phases, ids_all, domains = [], [], [], [], []
    for s, (name, entry) in enumerate(prompts.items()):
        where = f"{path}: prompt {name!r}"
        if not isinstance(entry, dict) or "prefill" not in entry or set(entry) - {"prefill", "decode"}:
            raise MoesimError(f"{where}: expected an object with 'prefill' (and 'decode') lists")
        pre = _grid(entry["prefill"], L, k, f"{where} prefill", allow_empty=False)
        L, k = pre.shape[1], pre.shape[2]
        dec = _grid(entry.get("decode") or [], L, k, f"{where} decode", allow_empty=True)
        P, D = len(pre), len(dec)
        ids = np.concatenate([pre, dec]) if D else pre
        seqs.append(np.full(P + D, s))
        poss.append(np.arange(P + D))
        phases.append(np.array(["prefill"] * P + ["decode"] * D, dtype=object))
        ids_all.append(ids)
        domains.append(np.full(P + D, str(name), dtype=object))
    assert L is not None and k is not None  # prompts is not empty: the loop set both
    moe_layers = parse_layers(layers, L)
    source = {"path": str(path.resolve()), "format": "per-prompt routing JSON (prefill/decode [token][layer][k])",
              "weights": "not in the file: exactly 1/k", "domains": "the prompt names"}
    if preset is not None:
        bad = sorted(set(moe_layers) - set(preset.moe_layers))
        if bad:
            raise MoesimError(f"layer {bad[0]} is not an MoE layer of {preset.name}; give the logged layers' "
                              "indices with --layers")
        source["preset"] = preset.name
    known = preset_meta(preset)
    meta = TraceMeta(model_id=model, family=known.pop("family", "unknown"), n_experts=int(E), top_k=k,
                     moe_layers=moe_layers, layout="sparse", n_candidates=k, synthetic=False, tie_order="stored",
                     tracer=tracer_info("prompts"), source=source, **known)
    ids = np.concatenate(ids_all)  # [T, L, k]
    T = len(ids)
    seq, pos = np.concatenate(seqs), np.concatenate(poss)
    flat = ids.reshape(T * L, k)
    dom = np.repeat(np.concatenate(domains), L)
    return write_topk_trace(out, meta, seq=np.repeat(seq, L), pos=np.repeat(pos, L),
                            layer=np.tile(np.asarray(moe_layers), T), phase=np.repeat(np.concatenate(phases), L),
                            ids=flat, domain=dom, domains=sorted(set(dom.tolist())), where=str(path),
                            row_group_size=row_group_size, notes=id_span_note(flat, int(E)), inputs=[path])


def _count(doc: dict, key: str, path: Path) -> int | None:
    v = doc.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise MoesimError(f"{path}: {key} must be a positive integer, got {v!r}")
    return v


def _grid(x, L: int | None, k: int | None, where: str, allow_empty: bool) -> np.ndarray:
    """[tokens][layers][k] integer ids -> int64 array, with a precise message when ragged."""
    if not isinstance(x, list):
        raise MoesimError(f"{where}: expected a list of tokens, each a list of layers of k expert ids")
    if not x:
        if allow_empty:
            return np.empty((0, L or 0, k or 0), dtype=np.int64)
        raise MoesimError(f"{where}: no tokens")
    try:
        a = np.array(x)
    except ValueError:
        a = None
    if a is not None and a.ndim == 3 and a.dtype.kind in "iu" and 0 not in a.shape \
            and (L is None or a.shape[1] == L) and (k is None or a.shape[2] == k):
        return to_int64(a, where, "expert id")
    # the slow walk only runs to say what is wrong
    for t, tok in enumerate(x):
        if not isinstance(tok, list) or not tok:
            raise MoesimError(f"{where}: token {t} is not a list of layers")
        if L is not None and len(tok) != L:
            raise MoesimError(f"{where}: token {t} has {len(tok)} layers, expected num_layers={L}")
        L = len(tok)
        for layer, sel in enumerate(tok):
            if not isinstance(sel, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in sel):
                raise MoesimError(f"{where}: token {t} layer {layer} is not a list of integer expert ids")
            if k is not None and len(sel) != k:
                raise MoesimError(f"{where}: token {t} layer {layer} has {len(sel)} expert ids, expected "
                                  f"top_k={k}")
            k = len(sel)
            if k == 0:
                raise MoesimError(f"{where}: token {t} layer {layer} selects no experts")
    raise MoesimError(f"{where}: expected [tokens][layers][k] integer expert ids")
