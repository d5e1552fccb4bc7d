"""Import a generic routing table (CSV or Parquet) from any engine.

Two accepted layouts (docs/importers.md):

- wide: one row per (seq, pos, layer) with an ``experts`` cell holding the k
  selected ids (a list column in Parquet; ``"3;17;42;5"``, ``"3 17 42 5"`` or
  ``"[3, 17, 42, 5]"`` in CSV), optional ``weights`` and ``logits`` cells of k
  numbers in the same order;
- long: one row per (seq, pos, layer, selected expert) with ``expert``,
  optional ``rank`` (orders the experts of a step; file order otherwise),
  ``weight`` and ``logit``.

Both may carry per-step ``lse`` (log-sum-exp of all E logits), ``phase``
(prefill/decode), ``domain`` and ``token`` columns.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from moesim.errors import MoesimError
from moesim.files import check_output, check_utf8, regular_file
from moesim.traces.importers.common import ImportResult, to_int64, tracer_info, write_topk_trace
from moesim.traces.meta import GATINGS, PHASES, TraceMeta
from moesim.traces.writer import DEFAULT_ROW_GROUP

# Accepted spellings of each column (case-insensitive), first the canonical one.
ALIASES = {
    "seq": ("seq", "sequence", "seq_id", "request", "request_id"),
    "pos": ("pos", "position", "token_idx", "token_index"),
    "layer": ("layer", "layer_id", "layer_idx"),
    "experts": ("experts", "expert_ids", "topk_ids", "selected"),
    "weights": ("weights", "topk_weights", "gate_weights"),
    "logits": ("logits", "router_logits", "topk_logits"),
    "expert": ("expert", "expert_id"),
    "rank": ("rank",),
    "weight": ("weight", "gate_weight"),
    "logit": ("logit", "router_logit"),
    "lse": ("lse",),
    "phase": ("phase",),
    "domain": ("domain",),
    "token": ("token", "token_id"),
}
_SPLIT = re.compile(r"[;,\s|]+")


def import_table(file: str | os.PathLike, out: str | os.PathLike, *, n_experts: int | None = None,
                 top_k: int | None = None, preset: str | None = None, model_id: str | None = None,
                 family: str | None = None, gating: str | None = None, norm_topk_prob: bool | None = None,
                 phase: str = "decode", synthetic: bool = False,
                 row_group_size: int = DEFAULT_ROW_GROUP) -> ImportResult:
    """Convert a routing table into a sparse trace that stores the selected experts
    (and the weights/logits when the table has them). Geometry comes from
    ``preset`` (a moesim model preset) and/or the explicit arguments, which win."""
    path = Path(file)
    check_output(out, [path])
    table = _read(path)
    cols = _resolve(table.column_names, path)
    where = str(path)

    p = None
    if preset:
        from moesim.costmodel.models import load_model

        p = load_model(preset)
    E = n_experts if n_experts is not None else (p.n_experts if p else None)
    if E is None:
        raise MoesimError("give the number of routed experts per layer with --experts E (or a model --preset)")
    gating = gating or (p.gating if p else "softmax")
    if gating not in GATINGS:
        raise MoesimError(f"unknown gating {gating!r} (expected one of {', '.join(GATINGS)})")
    if phase not in PHASES:
        raise MoesimError(f"unknown phase {phase!r} (expected prefill or decode)")

    if "experts" in cols and "expert" in cols:
        raise MoesimError(f"{where}: has both an experts (one row per step) and an expert (one row per expert) "
                          "column; keep one layout")
    if "experts" in cols:
        steps = _wide(table, cols, where)
    elif "expert" in cols:
        steps = _long(table, cols, where)
    else:
        raise MoesimError(f"{where}: no expert column: need 'experts' (k ids per row) or 'expert' (one id per row)"
                          f"; columns are {', '.join(table.column_names)}")
    ids = steps["ids"]
    k = ids.shape[1]
    want_k = top_k if top_k is not None else (p.top_k if p else None)
    if want_k is not None and want_k != k:
        raise MoesimError(f"{where}: steps hold {k} experts, but top-k is {want_k}")
    if k > E:
        raise MoesimError(f"{where}: steps hold {k} experts, more than E={E}")
    layers = sorted(int(v) for v in np.unique(steps["layer"]))
    if p is not None:
        unknown = sorted(set(layers) - set(p.moe_layers))
        if unknown:
            raise MoesimError(f"{where}: layer {unknown[0]} is not an MoE layer of {p.name}")

    phases = steps.get("phase")
    if phases is None:
        phases = np.full(len(ids), phase, dtype=object)
    source = {"path": str(path.resolve()), "format": steps["layout"] + " table",
              "weights": ("from the table" if steps.get("weights") is not None else
                          "from the logits" if steps.get("logits") is not None else
                          "not in the table: uniform 1/k, ranked in the table's order")}
    if p is not None:
        source["preset"] = p.name
    meta = TraceMeta(
        model_id=model_id or (p.hf_id or p.name if p else "unknown"),
        family=family or (p.family if p else "unknown"),
        n_experts=E, top_k=k, moe_layers=tuple(layers), gating=gating,
        norm_topk_prob=norm_topk_prob if norm_topk_prob is not None else (p.norm_topk_prob if p else True),
        layout="sparse", n_candidates=k,
        routed_scaling_factor=p.routed_scaling_factor if p else 1.0,
        n_shared_experts=p.n_shared_experts if p else 0,
        dense_layers=p.dense_layers if p else (),
        bytes_per_expert=p.bytes_per_expert_table() if p else {},
        synthetic=bool(synthetic), tracer=tracer_info("table"), source=source,
    )
    domain = steps.get("domain")
    domains = sorted(set(domain.tolist())) if domain is not None else None
    return write_topk_trace(out, meta, seq=steps["seq"], pos=steps["pos"], layer=steps["layer"], phase=phases,
                            ids=ids, weights=steps.get("weights"), logits=steps.get("logits"),
                            lse=steps.get("lse"), domain=domain, domains=domains, token=steps.get("token"),
                            where=where, row_group_size=row_group_size, inputs=[path])


def _read(path: Path):
    import pyarrow as pa

    regular_file(path, "CSV or Parquet file")
    suffix = path.suffix.lower()
    try:
        if suffix in (".parquet", ".pq"):
            import pyarrow.parquet as pq

            return pq.read_table(path)
        if suffix in (".csv", ".tsv", ".txt"):
            import pyarrow.csv as pacsv

            delim = "\t" if suffix == ".tsv" else ","
            check_utf8(path, "CSV file")
            # only an empty cell is missing: 'nan' stays a number, refused where a number must be finite
            return pacsv.read_csv(path, parse_options=pacsv.ParseOptions(delimiter=delim),
                                  convert_options=pacsv.ConvertOptions(null_values=[""]))
    except (pa.ArrowException, OSError) as exc:
        raise MoesimError(f"{path}: cannot read it as {suffix[1:]} ({' '.join(str(exc).split())[:160]})") from None
    raise MoesimError(f"{path}: unknown table format {suffix!r} (expected .csv, .tsv or .parquet)")


def _resolve(names: list[str], path: Path) -> dict[str, str]:
    lower = {n.lower().strip(): n for n in names}
    out = {}
    for canon, spellings in ALIASES.items():
        hits = [lower[s] for s in spellings if s in lower]
        if len(hits) > 1:
            raise MoesimError(f"{path}: columns {', '.join(hits)} all mean {canon}; keep one")
        if hits:
            out[canon] = hits[0]
    missing = [c for c in ("seq", "pos", "layer") if c not in out]
    if missing:
        raise MoesimError(f"{path}: missing column(s) {', '.join(missing)} (columns are {', '.join(names)})")
    return out


def _ints(table, col: str, where: str) -> np.ndarray:
    import pyarrow as pa

    arr = table.column(col)
    if arr.null_count:
        raise MoesimError(f"{where}: column {col} has empty cells")
    if not (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type)):
        raise MoesimError(f"{where}: column {col} must hold integers, found {arr.type}")
    a = arr.to_numpy()
    if a.dtype.kind == "f" and (not np.isfinite(a).all() or (a != np.round(a)).any()):
        raise MoesimError(f"{where}: column {col} must hold whole numbers")
    return to_int64(a, where, f"column {col} value")


def _floats(table, col: str, where: str) -> np.ndarray:
    import pyarrow as pa

    arr = table.column(col)
    if arr.null_count:
        raise MoesimError(f"{where}: column {col} has empty cells")
    if not (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type)):
        raise MoesimError(f"{where}: column {col} must hold numbers, found {arr.type}")
    a = arr.to_numpy().astype(np.float64)
    if not np.isfinite(a).all():
        raise MoesimError(f"{where}: column {col} holds NaN or infinite values")
    return a


def _strings(table, col: str, where: str) -> np.ndarray:
    arr = table.column(col)
    if arr.null_count:
        raise MoesimError(f"{where}: column {col} has empty cells")
    return np.array([str(v) for v in arr.to_pylist()], dtype=object)


def _lists(table, col: str, where: str, integral: bool) -> np.ndarray:
    """A column of k values per row -> [n, k]. Accepts list columns, numbers (k = 1)
    and strings such as '3;17;42', '3 17 42' or '[3, 17, 42]'."""
    import pyarrow as pa

    arr = table.column(col).combine_chunks()
    n = len(arr)
    if arr.null_count:
        raise MoesimError(f"{where}: column {col} has empty cells")
    t = arr.type
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        lengths = np.asarray(arr.value_lengths()) if not pa.types.is_fixed_size_list(t) \
            else np.full(n, t.list_size)
        flat = arr.flatten()
        if flat.null_count:
            raise MoesimError(f"{where}: column {col} has empty list entries")
        values = flat.to_numpy(zero_copy_only=False)
    elif pa.types.is_integer(t) or pa.types.is_floating(t):
        lengths, values = np.ones(n, dtype=np.int64), arr.to_numpy()
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        parts = []
        lengths = np.empty(n, dtype=np.int64)
        for i, cell in enumerate(arr.to_pylist()):
            tokens = [x for x in _SPLIT.split(cell.strip().strip("[]()")) if x]
            lengths[i] = len(tokens)
            parts.extend(tokens)
        try:
            values = np.array(parts, dtype=np.float64)
        except ValueError:
            bad = next(x for x in parts if not _is_number(x))
            raise MoesimError(f"{where}: column {col} holds {bad!r}, not a number") from None
    else:
        raise MoesimError(f"{where}: column {col} must hold lists of numbers, found {t}")
    if n and (lengths != lengths[0]).any():
        row = int(np.argmax(lengths != lengths[0]))
        raise MoesimError(f"{where}: column {col} has {int(lengths[row])} values in row {row + 1} but "
                          f"{int(lengths[0])} in row 1; every step needs the same k")
    k = int(lengths[0]) if n else 0
    if k == 0:
        raise MoesimError(f"{where}: column {col} is empty")
    values = np.asarray(values, dtype=np.float64)
    if not np.isfinite(values).all():
        raise MoesimError(f"{where}: column {col} holds NaN or infinite values")
    if integral:
        if (values != np.round(values)).any():
            raise MoesimError(f"{where}: column {col} must hold integer expert ids")
        return values.astype(np.int64).reshape(n, k)
    return values.reshape(n, k)


def _is_number(x: str) -> bool:
    try:
        float(x)
        return True
    except ValueError:
        return False


def _wide(table, cols: dict, where: str) -> dict:
    for c in ("expert", "rank", "weight", "logit"):
        if c in cols:
            raise MoesimError(f"{where}: column {cols[c]} belongs to the long layout, but the table has a "
                              f"per-step {cols['experts']} column")
    steps: dict[str, Any] = {"layout": "wide",
             "seq": _ints(table, cols["seq"], where), "pos": _ints(table, cols["pos"], where),
             "layer": _ints(table, cols["layer"], where), "ids": _lists(table, cols["experts"], where, True)}
    k = steps["ids"].shape[1]
    for name in ("weights", "logits"):
        if name in cols:
            v = _lists(table, cols[name], where, False)
            if v.shape[1] != k:
                raise MoesimError(f"{where}: column {cols[name]} has {v.shape[1]} values per row, "
                                  f"{cols['experts']} has {k}")
            steps[name] = v
    _optional(table, cols, where, steps, np.arange(table.num_rows))
    return steps


def _long(table, cols: dict, where: str) -> dict:
    for c in ("weights", "logits"):
        if c in cols:
            raise MoesimError(f"{where}: column {cols[c]} belongs to the wide layout, but the table has one "
                              f"row per expert ({cols['expert']})")
    seq, pos, layer = (_ints(table, cols[c], where) for c in ("seq", "pos", "layer"))
    expert = _ints(table, cols["expert"], where)
    rank = _ints(table, cols["rank"], where) if "rank" in cols else np.arange(len(seq))
    order = np.lexsort((rank, layer, pos, seq))
    seq, pos, layer, expert, rank = seq[order], pos[order], layer[order], expert[order], rank[order]
    new = np.ones(len(seq), dtype=bool)
    new[1:] = (seq[1:] != seq[:-1]) | (pos[1:] != pos[:-1]) | (layer[1:] != layer[:-1])
    starts = np.flatnonzero(new)
    sizes = np.diff(np.append(starts, len(seq)))
    if len(sizes) == 0:
        raise MoesimError(f"{where}: no rows")
    if (sizes != sizes[0]).any():
        g = int(np.argmax(sizes != sizes[0]))
        i = starts[g]
        raise MoesimError(f"{where}: step (seq={seq[i]}, pos={pos[i]}, layer={layer[i]}) has {int(sizes[g])} "
                          f"experts, the first step has {int(sizes[0])}; every step needs the same k")
    k = int(sizes[0])
    if "rank" in cols:
        rk = rank.reshape(-1, k)
        if (np.diff(rk, axis=1) == 0).any():
            g = int(np.argmax((np.diff(rk, axis=1) == 0).any(axis=1)))
            i = starts[g]
            raise MoesimError(f"{where}: step (seq={seq[i]}, pos={pos[i]}, layer={layer[i]}) repeats a rank")
    steps = {"layout": "long", "seq": seq[starts], "pos": pos[starts], "layer": layer[starts],
             "ids": expert.reshape(-1, k)}
    if "weight" in cols:
        steps["weights"] = _floats(table, cols["weight"], where)[order].reshape(-1, k)
    if "logit" in cols:
        steps["logits"] = _floats(table, cols["logit"], where)[order].reshape(-1, k)
    _optional(table, cols, where, steps, order, starts, k)
    return steps


def _optional(table, cols: dict, where: str, steps: dict, order: np.ndarray, starts=None, k: int = 1) -> None:
    """Per-step columns; in the long layout they must agree across the rows of a step."""
    readers = {"lse": _floats, "phase": _strings, "domain": _strings, "token": _ints}
    for name, read in readers.items():
        if name not in cols:
            continue
        v = read(table, cols[name], where)[order]
        if starts is not None:
            grouped = v.reshape(-1, k)
            if (grouped != grouped[:, :1]).any():
                g = int(np.argmax((grouped != grouped[:, :1]).any(axis=1)))
                raise MoesimError(f"{where}: the rows of step (seq={steps['seq'][g]}, pos={steps['pos'][g]}, "
                                  f"layer={steps['layer'][g]}) disagree on {cols[name]}")
            v = grouped[:, 0]
        if name == "phase":
            bad = sorted(set(v.tolist()) - set(PHASES))
            if bad:
                raise MoesimError(f"{where}: unknown phase {bad[0]!r} (expected prefill or decode)")
        steps[name] = v
