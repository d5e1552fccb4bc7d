"""Import JSON Lines routing logs: one JSON object per line (vLLM router loggers and the like).

A routing record names a layer, a token and the k experts it selected (docs/importers.md):

    {"problem_id": 3, "token_idx": 17, "layer": 5, "topk_ids": [12, 40, 7, 1], "topk_weights": [...]}

``--map FIELD=NAME`` says which field holds what (fields: seq, pos, layer, experts,
weights, domain, phase); common names are found without it. Lines without the
experts field are not routing records: they are skipped, and a model id, top-k or
number of experts they carry is used. The files are streamed in blocks with
pyarrow's JSON reader into compact column buffers (ids int16, weights float32),
so a log of millions of records never becomes millions of Python dicts.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from moesim.errors import MoesimError
from moesim.files import check_output, regular_file
from moesim.traces.importers.common import (
    ImportResult,
    complete_tokens,
    id_span_note,
    preset_for,
    preset_meta,
    tracer_info,
    write_topk_trace,
)
from moesim.traces.meta import PHASES, TraceMeta
from moesim.traces.writer import DEFAULT_ROW_GROUP

FIELDS = ("seq", "pos", "layer", "experts", "weights", "domain", "phase")
# Names found without --map, first match wins per field; two present at once is an error.
DEFAULT_NAMES = {
    "seq": ("seq", "seq_id", "sequence", "sequence_id", "request", "request_id", "req_id", "prompt_id",
            "problem_id", "sample_id"),
    "pos": ("pos", "position", "token_idx", "token_index", "token_pos", "token_position"),
    "layer": ("layer", "layer_id", "layer_idx", "layer_index"),
    "experts": ("experts", "expert_ids", "topk_ids", "topk_indices", "topk_idx", "selected_experts", "selected"),
    "weights": ("weights", "topk_weights", "gate_weights", "routing_weights", "expert_weights", "topk_probs"),
    "domain": ("domain", "dataset"),
    "phase": ("phase", "stage"),
}
META_NAMES = {
    "model_id": ("model_id", "model", "model_name"),
    "top_k": ("top_k", "topk", "num_experts_per_tok", "moe_top_k"),
    "n_experts": ("n_experts", "num_experts", "n_routed_experts", "num_local_experts"),
}
PHASE_NAMES = {"prefill": "prefill", "prompt": "prefill", "context": "prefill",
               "decode": "decode", "generate": "decode", "generation": "decode"}
PEEK_LINES = 100
PASS_RULES = {"restart": "a new pass wherever pos restarts at 0", "drop": "a new pass wherever pos does not increase",
              "off": "no passes within an id"}
BLOCK_BYTES = 32 << 20
_LAST_INT = re.compile(r"(\d+)(?!.*\d)")


@dataclass
class _Kind:
    """How a file spells the fields: the name of each, and the JSON shape of its values."""

    names: dict[str, str]
    nested: bool  # experts is a list of per-token id lists (several tokens per record)
    types: dict[str, str] = field(default_factory=dict)  # field -> "int" | "str" | "list" | "nested"


@dataclass
class _Buffers:
    """Compact columns of every routing row read so far (one row per token and layer)."""

    seq: list = field(default_factory=list)
    pos: list = field(default_factory=list)
    layer: list = field(default_factory=list)
    ids: list = field(default_factory=list)
    weights: list = field(default_factory=list)
    domain: list = field(default_factory=list)
    phase: list = field(default_factory=list)
    codes: dict = field(default_factory=lambda: {"seq": {}, "domain": {}, "phase": {}})


def parse_map(spec: str | None) -> dict[str, str]:
    """'seq=problem_id,pos=token_idx' -> {'seq': 'problem_id', 'pos': 'token_idx'}."""
    out: dict[str, str] = {}
    for part in (spec or "").split(","):
        part = part.strip()
        if not part:
            continue
        name, eq, value = part.partition("=")
        name, value = name.strip(), value.strip()
        if not eq or not value:
            raise MoesimError(f"--map {part!r}: expected FIELD=NAME (e.g. seq=problem_id)")
        if name not in FIELDS:
            raise MoesimError(f"--map {part!r}: unknown field {name!r} (fields: {', '.join(FIELDS)})")
        if name in out:
            raise MoesimError(f"--map names {name} twice")
        out[name] = value
    return out


def import_jsonl(files, out: str | os.PathLike, *, n_experts: int | None = None, top_k: int | None = None,
                 model_id: str | None = None, mapping: dict[str, str] | str | None = None, skip_passes: int = 0,
                 drop_incomplete: bool = False, phase: str = "decode", passes: str = "restart",
                 row_group_size: int = DEFAULT_ROW_GROUP) -> ImportResult:
    """Convert JSON Lines routing logs (several files, e.g. one per layer, make one trace).

    Records are grouped into forward passes, each pass a sequence: within one sequence id (or the
    whole log without a ``seq`` field), per layer in file order, ``passes="restart"`` starts a new
    pass wherever ``pos`` restarts at 0, ``"drop"`` wherever ``pos`` does not increase, ``"off"``
    never (an id is one sequence). ``skip_passes`` drops the first N passes in order of appearance.
    ``drop_incomplete`` keeps only tokens that have every layer instead of refusing a ragged log."""
    files = [Path(f) for f in ([files] if isinstance(files, (str, os.PathLike)) else files)]
    if not files:
        raise MoesimError("no JSON Lines file given")
    check_output(out, files)
    mapping = parse_map(mapping) if isinstance(mapping, str) or mapping is None else dict(mapping)
    if skip_passes < 0:
        raise MoesimError(f"--skip-passes must be >= 0, got {skip_passes}")
    if passes not in PASS_RULES:
        raise MoesimError(f"--passes {passes!r}: expected one of {', '.join(PASS_RULES)}")
    if phase not in PHASES:
        raise MoesimError(f"unknown phase {phase!r} (expected prefill or decode)")
    where = ", ".join(map(str, files))
    buf = _Buffers()
    found_meta: dict[str, Any] = {}
    kinds: list[tuple[_Kind, Path]] = []
    skipped = meta_lines = 0
    for f in files:
        kind, meta_here, n_meta = _peek(f, mapping)
        meta_lines += n_meta
        for key, value in meta_here.items():
            if key in found_meta and found_meta[key] != value:
                raise MoesimError(f"{f}: its meta line says {key} {value!r}, another file says {found_meta[key]!r}")
            found_meta[key] = value
        if kinds and (set(kind.names) != set(kinds[0][0].names) or kind.nested != kinds[0][0].nested):
            raise MoesimError(f"{f}: its records have fields {_fields(kind)}, but {kinds[0][1]} has "
                              f"{_fields(kinds[0][0])}; the files must describe the same routing")
        kinds.append((kind, f))
        skipped += _stream(f, kind, buf)
    kind = kinds[0][0]
    if not buf.ids:
        raise MoesimError(f"{where}: no routing records (no line has the experts field)")

    seq = np.concatenate(buf.seq)
    pos = np.concatenate(buf.pos)
    layer = np.concatenate(buf.layer)
    ids = np.concatenate(buf.ids)
    weights = np.concatenate(buf.weights) if buf.weights else None
    domain_codes = np.concatenate(buf.domain) if buf.domain else None
    phase_codes = np.concatenate(buf.phase) if buf.phase else None
    del buf.seq, buf.pos, buf.layer, buf.ids, buf.weights

    notes = []
    source: dict[str, object] = {"paths": [str(f.resolve()) for f in files], "format": "JSON Lines routing records",
                                 "fields": dict(kind.names)}
    if (seq < 0).any() or (pos < 0).any():
        raise MoesimError(f"{where}: seq and pos must be non-negative 32-bit integers")
    if "seq" not in kind.names and "pos" not in kind.names:
        seq = np.zeros(len(ids), dtype=np.int64)
        source["sequences"] = "no seq or pos field: one sequence"
    elif "pos" in kind.names:
        seq, found = _split_passes(seq, pos, layer, where, passes, has_seq="seq" in kind.names)
        source["sequences"] = ("forward passes: " if "seq" not in kind.names else "sequence ids, split into forward "
                               "passes: ") + PASS_RULES[passes]
        source["passes"] = found
        if found["ids_with_several"] and "seq" in kind.names:
            notes.append(f"{found['ids_with_several']} sequence id(s) hold several forward passes "
                         f"({PASS_RULES[passes]}): {found['found']} passes in all, each a sequence")
    if "pos" not in kind.names:
        pos = _cumcount(seq, layer)
        source["positions"] = "no pos field: order of appearance within each sequence and layer"
    if skip_passes:
        first = _first_seen(seq)
        if skip_passes >= len(first):
            raise MoesimError(f"{where}: --skip-passes {skip_passes} drops every one of the {len(first)} "
                              "sequences (passes)")
        keep = ~np.isin(seq, first[:skip_passes])
        source["skipped_sequences"] = int(skip_passes)
        seq, pos, layer, ids = seq[keep], pos[keep], layer[keep], ids[keep]
        weights = weights[keep] if weights is not None else None
        domain_codes = domain_codes[keep] if domain_codes is not None else None
        phase_codes = phase_codes[keep] if phase_codes is not None else None
    if (seq >= 2**31).any() or (pos >= 2**31).any() or (seq < 0).any() or (pos < 0).any():
        raise MoesimError(f"{where}: seq and pos must be non-negative 32-bit integers")

    layers = tuple(int(x) for x in np.unique(layer))
    complete = complete_tokens(seq, pos, layer, layers, where)
    if not complete.all():
        n_bad = len(np.unique(((seq << 32) | pos)[~complete]))
        n_tok = len(np.unique((seq << 32) | pos))
        if not drop_incomplete:
            i = int(np.argmax(~complete))
            have = set(layer[(seq == seq[i]) & (pos == pos[i])].tolist())
            missing = min(set(layers) - have)
            raise MoesimError(f"{where}: token (seq={int(seq[i])}, pos={int(pos[i])}) has no record for layer "
                              f"{missing}; {n_bad} of {n_tok} tokens lack some layer (--drop-incomplete keeps "
                              "only the tokens that have every layer)")
        if n_bad == n_tok:
            raise MoesimError(f"{where}: no token has a record for every one of the {len(layers)} layers")
        notes.append(f"dropped {n_bad} of {n_tok} tokens ({int((~complete).sum())} records) that lack some of "
                     f"the {len(layers)} layers")
        source["dropped_incomplete_tokens"] = int(n_bad)
        seq, pos, layer, ids = seq[complete], pos[complete], layer[complete], ids[complete]
        weights = weights[complete] if weights is not None else None
        domain_codes = domain_codes[complete] if domain_codes is not None else None
        phase_codes = phase_codes[complete] if phase_codes is not None else None

    model = model_id or found_meta.get("model_id") or "unknown"
    preset = preset_for(model if model != "unknown" else None)
    E = n_experts or found_meta.get("n_experts") or (preset.n_experts if preset else None)
    if E is None:
        raise MoesimError("give the number of routed experts per layer with --experts E (no meta line says it and "
                          f"no model preset matches {model!r})")
    k = ids.shape[1]
    want_k = top_k or found_meta.get("top_k")
    if want_k is not None and want_k != k:
        raise MoesimError(f"{where}: records hold {k} experts, but top-k is {want_k}")
    if preset is not None:
        unknown = sorted(set(layers) - set(preset.moe_layers))
        if unknown:
            raise MoesimError(f"{where}: layer {unknown[0]} is not an MoE layer of {preset.name} (MoE layers "
                              f"{preset.moe_layers[0]}..{preset.moe_layers[-1]}); is the layer field 1-based?")
        source["preset"] = preset.name
        if len(layers) < preset.n_moe_layers:
            source["partial_layers"] = f"{len(layers)} of the model's {preset.n_moe_layers} MoE layers logged"
    if skipped > meta_lines:
        notes.append(f"skipped {skipped} line(s) without the experts field {kind.names['experts']!r}")
    source["weights"] = "from the records" if weights is not None else "not in the records: exactly 1/k"
    domains = phases = None
    if domain_codes is not None:
        names = list(_codes_table(buf, "domain"))
        domains = sorted(set(names))
        domain_arr = np.asarray(names, dtype=object)[domain_codes]
        _same_per_token(seq, pos, domain_codes, "domain", where)
    if phase_codes is not None:
        names = list(_codes_table(buf, "phase"))
        phases = np.asarray(names, dtype=object)[phase_codes]
        _same_per_token(seq, pos, phase_codes, "phase", where)
    known = preset_meta(preset)
    meta = TraceMeta(
        model_id=model, family=known.pop("family", "unknown"), n_experts=int(E), top_k=k, moe_layers=layers,
        layout="sparse", n_candidates=k, synthetic=False, tie_order="stored", tracer=tracer_info("jsonl"),
        source=source, **known,
    )
    return write_topk_trace(out, meta, seq=seq, pos=pos, layer=layer, phase=phases if phases is not None else phase,
                            ids=ids, weights=weights, domain=None if domains is None else domain_arr,
                            domains=domains, where=where, row_group_size=row_group_size,
                            notes=notes + id_span_note(ids, int(E)), inputs=files)


# ---- reading --------------------------------------------------------------------------------------------------

def _peek(path: Path, mapping: dict[str, str]) -> tuple[_Kind, dict, int]:
    """Read the first lines with Python's parser: the field names and value shapes of the
    first routing record, and what the meta lines before it say."""
    regular_file(path, "JSON Lines file")
    meta: dict[str, object] = {}
    n_meta = 0
    first = None
    try:
        with open(path, "rb") as fh:
            for lineno, line in enumerate(fh, 1):
                if lineno > PEEK_LINES and first is not None:
                    break
                if not line.strip():
                    continue
                rec = _loads(line, path, lineno)
                name = mapping.get("experts") or next((n for n in DEFAULT_NAMES["experts"] if n in rec), None)
                if name is not None and name in rec:
                    if first is None:
                        first = (rec, lineno)
                    continue
                n_meta += 1
                if first is None:
                    for key, value in _meta_of(rec).items():
                        meta.setdefault(key, value)
                if lineno > PEEK_LINES:
                    break
    except OSError as exc:
        raise MoesimError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if first is None:
        want = mapping.get("experts") or " / ".join(DEFAULT_NAMES["experts"])
        raise MoesimError(f"{path}: no routing record in its first {PEEK_LINES} lines (none has the experts field "
                          f"{want}; name it with --map experts=NAME)")
    return _kind(first[0], first[1], path, mapping), meta, n_meta


def _loads(line: bytes, path: Path, lineno: int) -> dict:
    try:
        rec = json.loads(line)
    except RecursionError:
        raise MoesimError(f"{path}: line {lineno}: JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise MoesimError(f"{path}: line {lineno}: not valid JSON ({' '.join(str(exc).split())[:100]})") from None
    if not isinstance(rec, dict):
        raise MoesimError(f"{path}: line {lineno}: expected one JSON object per line, got {type(rec).__name__}")
    return rec


def _meta_of(rec: dict) -> dict:
    out: dict[str, Any] = {}
    for key, names in META_NAMES.items():
        for n in names:
            v = rec.get(n)
            if key == "model_id" and isinstance(v, str) and v:
                out[key] = v
                break
            if key != "model_id" and isinstance(v, int) and not isinstance(v, bool) and v > 0:
                out[key] = v
                break
    return out


def _kind(rec: dict, lineno: int, path: Path, mapping: dict[str, str]) -> _Kind:
    at = f"{path}: line {lineno}"
    names = {}
    for f in FIELDS:
        if f in mapping:
            if mapping[f] not in rec:
                raise MoesimError(f"{at}: the first routing record has no field {mapping[f]!r} (--map {f}="
                                  f"{mapping[f]}); its fields are {', '.join(rec)}")
            names[f] = mapping[f]
            continue
        hits = [n for n in DEFAULT_NAMES[f] if n in rec and n not in mapping.values()]
        if len(hits) > 1:
            raise MoesimError(f"{at}: fields {', '.join(hits)} could all be {f}; choose one with --map {f}=NAME")
        if hits:
            names[f] = hits[0]
    ids = rec[names["experts"]]
    if not isinstance(ids, list) or not ids:
        raise MoesimError(f"{at}: {names['experts']} must be a non-empty list of expert ids")
    nested = all(isinstance(x, list) for x in ids)
    types = {}
    for f, n in names.items():
        v = rec[n]
        if f in ("experts", "weights"):
            types[f] = "nested" if nested else "list"
            if f == "weights" and not isinstance(v, list):
                raise MoesimError(f"{at}: {n} must be a list of gate weights")
        elif f in ("domain", "phase"):
            if not isinstance(v, str):
                raise MoesimError(f"{at}: {n} must be a string, got {v!r}")
            types[f] = "str"
        elif f == "pos" and nested and isinstance(v, list):
            types[f] = "list"
        elif isinstance(v, int) and not isinstance(v, bool):
            types[f] = "int"
        elif isinstance(v, str) and f != "pos":
            types[f] = "str"
        else:
            raise MoesimError(f"{at}: {n} ({f}) must be an integer" + (" or a string" if f != "pos" else "")
                              + f", got {v!r}")
    return _Kind(names, nested, types)


def _schema(kind: _Kind):
    import pyarrow as pa

    scalar = {"int": pa.int64(), "str": pa.string()}
    fields = []
    for f, n in kind.names.items():
        t = kind.types[f]
        if f == "experts":
            typ = pa.list_(pa.list_(pa.int64())) if t == "nested" else pa.list_(pa.int64())
        elif f == "weights":
            typ = pa.list_(pa.list_(pa.float64())) if t == "nested" else pa.list_(pa.float64())
        elif t == "list":
            typ = pa.list_(pa.int64())
        else:
            typ = scalar[t]
        fields.append(pa.field(n, typ))
    return pa.schema(fields)


def _stream(path: Path, kind: _Kind, buf: _Buffers) -> int:
    """Read every record of one file into the buffers; returns the lines that were not routing records."""
    import pyarrow as pa
    import pyarrow.json as pj

    opts = pj.ParseOptions(explicit_schema=_schema(kind), unexpected_field_behavior="ignore")
    file_layer = None
    if "layer" not in kind.names:
        m = _LAST_INT.search(path.stem)
        if not m:
            raise MoesimError(f"{path}: its records have no layer field and its name holds no layer number "
                              "(name the field with --map layer=NAME, or name the file e.g. layer_3.jsonl)")
        file_layer = int(m.group(1))
    skipped = 0
    record = 0
    try:
        reader = pj.open_json(path, read_options=pj.ReadOptions(block_size=BLOCK_BYTES), parse_options=opts)
        for batch in reader:
            skipped += _take(batch, kind, buf, path, record, file_layer)
            record += batch.num_rows
    except pa.ArrowException as exc:
        raise MoesimError(_locate(path, kind) or f"{path}: cannot read it as JSON Lines "
                          f"({' '.join(str(exc).split())[:160]})") from None
    except OSError as exc:
        raise MoesimError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    return skipped


def _take(batch, kind: _Kind, buf: _Buffers, path: Path, offset: int, file_layer: int | None) -> int:
    import pyarrow.compute as pc

    col = {f: batch.column(n) for f, n in kind.names.items()}
    routing = col["experts"].is_valid()
    n_rec = int(pc.sum(routing).as_py() or 0)
    skipped = batch.num_rows - n_rec
    if n_rec == 0:
        return skipped
    rows = np.flatnonzero(routing.to_numpy(zero_copy_only=False))
    if n_rec < batch.num_rows:
        col = {f: c.filter(routing) for f, c in col.items()}

    def at(i: int) -> str:
        return f"{path}: record {offset + int(rows[i]) + 1}"

    for f, c in col.items():
        if c.null_count:
            i = int(np.argmax(~c.is_valid().to_numpy(zero_copy_only=False)))
            raise MoesimError(f"{at(i)}: no {kind.names[f]!r} ({f}) although it is a routing record")
    ids, per_rec = _lists(col["experts"], kind.nested, at, kind.names["experts"], integral=True)
    k = ids.shape[1]
    if buf.ids and buf.ids[0].shape[1] != k:
        raise MoesimError(f"{at(0)}: {k} experts per token, earlier records have {buf.ids[0].shape[1]}")
    if ids.size and (ids.min() < 0 or ids.max() > 32767):
        bad = np.flatnonzero(((ids < 0) | (ids > 32767)).any(axis=1))[0]
        raise MoesimError(f"{at(int(np.searchsorted(np.cumsum(per_rec), bad, side='right')))}: expert id "
                          f"{int(ids[bad][(ids[bad] < 0) | (ids[bad] > 32767)][0])} is out of range")
    n = len(ids)
    rec_of_row = np.repeat(np.arange(n_rec), per_rec)
    buf.ids.append(ids.astype(np.int16))
    if "weights" in col:
        w, per_w = _lists(col["weights"], kind.nested, at, kind.names["weights"], integral=False)
        if w.shape != ids.shape or (per_w != per_rec).any():
            i = int(np.argmax(per_w != per_rec)) if (per_w != per_rec).any() else 0
            raise MoesimError(f"{at(i)}: {kind.names['weights']} does not hold one weight per expert id")
        buf.weights.append(w.astype(np.float32))
    if "layer" in col:
        buf.layer.append(_layer_numbers(col["layer"], at)[rec_of_row])
    else:
        buf.layer.append(np.full(n, file_layer, dtype=np.int64))
    lay = buf.layer[-1]
    if (lay < 0).any() or (lay > 32767).any():
        i = int(rec_of_row[np.argmax((lay < 0) | (lay > 32767))])
        raise MoesimError(f"{at(i)}: layer {int(lay[(lay < 0) | (lay > 32767)][0])} is not a layer index (0..32767)")
    if "seq" in col:
        buf.seq.append(_seq_numbers(col["seq"], buf, at)[rec_of_row])
    if "pos" in col:
        buf.pos.append(_positions(col["pos"], kind, per_rec, rec_of_row, at))
    else:
        buf.pos.append(np.zeros(n, dtype=np.int64))
    if "seq" not in col:
        buf.seq.append(np.zeros(n, dtype=np.int64))
    for f in ("domain", "phase"):
        if f in col:
            codes = _string_codes(col[f], buf.codes[f], f, at)
            getattr(buf, f).append(codes[rec_of_row])
    return skipped


def _lists(arr, nested: bool, at, name: str, integral: bool) -> tuple[np.ndarray, np.ndarray]:
    """(values [tokens, k], tokens per record) of a list or list-of-lists column."""
    import pyarrow as pa

    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    if nested:
        per_rec = np.asarray(arr.value_lengths())
        inner = arr.flatten()
        if inner.null_count:
            raise MoesimError(f"{at(0)}: {name} holds an empty (null) token entry")
    else:
        per_rec = np.ones(len(arr), dtype=np.int64)
        inner = arr
    lengths = np.asarray(inner.value_lengths())
    values = inner.flatten()
    if values.null_count:
        raise MoesimError(f"{at(0)}: {name} holds null values")
    if len(lengths) == 0:
        raise MoesimError(f"{at(0)}: {name} is empty")
    k = int(lengths[0])
    if k == 0 or (lengths != k).any():
        row = int(np.argmax(lengths != k)) if k else 0
        rec = int(np.searchsorted(np.cumsum(per_rec), row, side="right"))
        raise MoesimError(f"{at(rec)}: {name} has {int(lengths[row])} values per token, the first record has {k}; "
                          "every token selects the same k experts")
    v = values.to_numpy(zero_copy_only=False)
    if not integral and not np.isfinite(v).all():
        row = int(np.argmax(~np.isfinite(v))) // k
        raise MoesimError(f"{at(int(np.searchsorted(np.cumsum(per_rec), row, side='right')))}: {name} holds NaN "
                          "or infinite values")
    return v.reshape(-1, k), per_rec


def _layer_numbers(arr, at) -> np.ndarray:
    import pyarrow as pa

    if pa.types.is_integer(arr.type):
        return arr.to_numpy(zero_copy_only=False).astype(np.int64)
    out = np.empty(len(arr), dtype=np.int64)
    cache: dict[str, int] = {}
    for i, s in enumerate(arr.to_pylist()):
        if s not in cache:
            m = _LAST_INT.search(s)
            if not m:
                raise MoesimError(f"{at(i)}: layer {s!r} holds no layer number")
            cache[s] = int(m.group(1))
        out[i] = cache[s]
    return out


def _seq_numbers(arr, buf: _Buffers, at) -> np.ndarray:
    """Integer sequence ids as given; string ids numbered 0, 1, ... in order of first appearance."""
    import pyarrow as pa

    if pa.types.is_integer(arr.type):
        return arr.to_numpy(zero_copy_only=False).astype(np.int64)
    return _string_codes(arr, buf.codes["seq"], "seq", at)


def _string_codes(arr, table: dict, what: str, at) -> np.ndarray:
    import pyarrow.compute as pc

    enc = pc.dictionary_encode(arr).combine_chunks() if hasattr(arr, "combine_chunks") else pc.dictionary_encode(arr)
    local = enc.dictionary.to_pylist()
    if what == "phase":
        for i, name in enumerate(local):
            if name.lower() not in PHASE_NAMES:
                row = int(np.argmax(enc.indices.to_numpy(zero_copy_only=False) == i))
                raise MoesimError(f"{at(row)}: unknown phase {name!r} (expected prefill or decode)")
        local = [PHASE_NAMES[name.lower()] for name in local]
    lut = np.array([table.setdefault(name, len(table)) for name in local], dtype=np.int64)
    return lut[enc.indices.to_numpy(zero_copy_only=False)]


def _codes_table(buf: _Buffers, what: str) -> list[str]:
    names = [""] * len(buf.codes[what])
    for name, code in buf.codes[what].items():
        names[code] = name
    return names


def _positions(arr, kind: _Kind, per_rec: np.ndarray, rec_of_row: np.ndarray, at) -> np.ndarray:
    """One position per token: a record's pos, or for a multi-token record its start
    (tokens at pos, pos+1, ...) or its list of positions."""
    if kind.types["pos"] == "list":
        lengths = np.asarray(arr.value_lengths())
        if (lengths != per_rec).any():
            i = int(np.argmax(lengths != per_rec))
            raise MoesimError(f"{at(i)}: {kind.names['pos']} lists {int(lengths[i])} positions for "
                              f"{int(per_rec[i])} tokens")
        flat = arr.flatten()
        if flat.null_count:
            raise MoesimError(f"{at(0)}: {kind.names['pos']} holds null positions")
        return flat.to_numpy(zero_copy_only=False).astype(np.int64)
    start = arr.to_numpy(zero_copy_only=False).astype(np.int64)
    if not kind.nested:
        return start
    first_row = np.cumsum(per_rec) - per_rec
    return start[rec_of_row] + (np.arange(len(rec_of_row)) - first_row[rec_of_row])


def _locate(path: Path, kind: _Kind) -> str | None:
    """After the fast reader failed: find the first offending line with Python's parser,
    to name it (the fast reader counts rows per block)."""
    try:
        with open(path, "rb") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                rec = _loads(line, path, lineno)
                if kind.names["experts"] not in rec:
                    continue
                for f, n in kind.names.items():
                    if n in rec and not _shape_ok(rec[n], kind.types[f]):
                        return (f"{path}: line {lineno}: {n} ({f}) holds {json.dumps(rec[n])[:60]}, expected "
                                f"{_SHAPE_WORDS[kind.types[f]]} as in the first routing record")
    except MoesimError as exc:
        return str(exc)
    except OSError:
        return None
    return None


_SHAPE_WORDS = {"int": "an integer", "str": "a string", "list": "a list of finite numbers",
                "nested": "a list of per-token lists of finite numbers"}


def _shape_ok(v, t: str) -> bool:
    def num(x):
        return isinstance(x, int) and not isinstance(x, bool) or isinstance(x, float) and math.isfinite(x)

    if t == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if t == "str":
        return isinstance(v, str)
    if t == "list":
        return isinstance(v, list) and all(num(x) for x in v)
    return isinstance(v, list) and all(isinstance(r, list) and all(num(x) for x in r) for r in v)


# ---- grouping -------------------------------------------------------------------------------------------------

def _split_passes(seq: np.ndarray, pos: np.ndarray, layer: np.ndarray, where: str, rule: str, *,
                  has_seq: bool) -> tuple[np.ndarray, dict]:
    """Sequence of each row, one per forward pass, and what was found. Per (sequence id, layer), in file
    order, a pass starts at the group's first record and wherever the rule says (restart: pos is 0;
    drop: pos does not increase). Under ``restart`` a position that goes back without reaching 0 is
    ambiguous (a new pass, or a record logged twice?): an error that names ``--passes drop``."""
    n = len(pos)
    key = (seq << 16) | layer
    order = np.argsort(key, kind="stable")
    k, p = key[order], pos[order]
    first = np.r_[True, k[1:] != k[:-1]]
    back = np.r_[False, p[1:] <= p[:-1]] & ~first
    if rule == "restart":
        start = first | (p == 0)
        odd = back & (p != 0)
        if odd.any():
            i = int(np.argmax(odd))
            r = order[i]
            what = f"seq {int(seq[r])}" if has_seq else "the log"
            raise MoesimError(f"{where}: pos goes back from {int(p[i - 1])} to {int(p[i])} without restarting at 0 "
                              f"within {what}, layer {int(layer[r])}: a new forward pass or a record logged twice? "
                              "(--passes drop starts a pass wherever pos goes back; --passes off refuses repeats)")
        if not has_seq and (p[first] != 0).any():
            i = int(np.argmax(first & (p != 0)))
            raise MoesimError(f"{where}: layer {int(layer[order[i]])}'s first record has pos {int(p[i])}; without a "
                              "seq field, sequences are told apart by pos restarting at 0 (name the sequence field "
                              "with --map seq=NAME)")
    elif rule == "drop":
        start = first | back
    else:
        start = first
    c = np.cumsum(start)
    pass_no = c - np.repeat(c[first], np.diff(np.r_[np.flatnonzero(first), n]))
    passes = np.empty(n, dtype=np.int64)
    passes[order] = pass_no
    several = np.unique(seq[passes > 0])
    combined = (seq << 32) | passes
    uniq, first_at, inverse = np.unique(combined, return_index=True, return_inverse=True)
    found = {"rule": PASS_RULES[rule], "found": int(len(uniq)), "ids_with_several": int(len(several))}
    if has_seq and not len(several):
        return seq, found  # every id is one pass: the ids stay as they are
    rank = np.empty(len(uniq), dtype=np.int64)
    rank[np.argsort(first_at, kind="stable")] = np.arange(len(uniq))
    return rank[inverse.reshape(-1)], found


def _cumcount(seq: np.ndarray, layer: np.ndarray) -> np.ndarray:
    """0, 1, 2, ... within each (seq, layer), in order of appearance."""
    key = seq * 65536 + layer
    order = np.argsort(key, kind="stable")
    k = key[order]
    start = np.r_[0, np.flatnonzero(k[1:] != k[:-1]) + 1]
    idx = np.arange(len(k)) - np.repeat(start, np.diff(np.r_[start, len(k)]))
    out = np.empty(len(k), dtype=np.int64)
    out[order] = idx
    return out


def _first_seen(seq: np.ndarray) -> np.ndarray:
    """Distinct sequence ids in order of first appearance."""
    uniq, first = np.unique(seq, return_index=True)
    return uniq[np.argsort(first)]


def _same_per_token(seq, pos, codes, what: str, where: str) -> None:
    tok = (seq << 32) | pos
    order = np.lexsort((codes, tok))
    t, c = tok[order], codes[order]
    bad = (t[1:] == t[:-1]) & (c[1:] != c[:-1])
    if bad.any():
        i = order[int(np.argmax(bad))]
        raise MoesimError(f"{where}: the records of token (seq={int(seq[i])}, pos={int(pos[i])}) disagree on "
                          f"{what}")


def _fields(kind: _Kind) -> str:
    return ", ".join(f"{f}={n}" for f, n in kind.names.items())
