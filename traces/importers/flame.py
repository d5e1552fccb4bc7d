"""Import FLAME-MoE routing in the DynaNDE CSV layout.

Two layouts (see docs/importers.md):

- prefill: ``Encoder_Batch_<a>-<b>/Layer_<N>/*_<S>seqs_<T>tokens.csv``: one row per
  token of S sequences flattened, ``token_id = seq * (T / S) + pos``;
- decode: ``Decoder_Batch_<a>-<b>/<1st|2nd|...>/Layer_<N>/*.csv``: one folder per
  position, ``token_id`` = the sequence index.

Each CSV: header ``layer_id,token_id,expert_0..expert_<E-1>``, one row per token,
the k selected experts carry their softmax probability (over all E, not
renormalized), the others 0. The layer index comes from the ``Layer_N`` folder.
Sequences of a batch folder ``..._<a>-<b>`` are numbered from a.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moesim.errors import MoesimError
from moesim.files import check_output, check_utf8
from moesim.traces.importers.common import ImportResult, tracer_info, write_topk_trace
from moesim.traces.meta import TraceMeta
from moesim.traces.writer import DEFAULT_ROW_GROUP

LAYOUT_DIRS = {"prefill": "Encoder_Batch", "decode": "Decoder_Batch"}
_BATCH = re.compile(r"^(Encoder|Decoder)_Batch(?:_(\d+)-(\d+))?$")
_LAYER = re.compile(r"^Layer_(\d+)$")
_ORDINAL = re.compile(r"^(\d+)(st|nd|rd|th)$")
_SHAPE = re.compile(r"(\d+)seqs_(\d+)tokens")
_RUN = re.compile(r"runid(\d+)_epoch(\d+)")
UPSTREAM = "FLAME-MoE-Traces (CMU FLAME-MoE), in the DynaNDE simulator's CSV layout"


@dataclass
class _Part:
    """One CSV: the routing of one layer for a set of tokens."""

    file: Path
    layer: int
    seq: np.ndarray
    pos: np.ndarray
    ids: np.ndarray  # [n, k], ascending ids
    probs: np.ndarray  # [n, k]



def _batch_name(folder: Path) -> re.Match:
    """The parts of a batch folder's name (the folders were found by matching it)."""
    m = _BATCH.match(folder.name)
    assert m is not None
    return m

def find_layouts(path: str | os.PathLike) -> dict[str, list[Path]]:
    """The batch folders under PATH (or PATH itself), by layout."""
    root = Path(path)
    if not root.exists():
        raise MoesimError(f"{root}: no such file or directory")
    if not root.is_dir():
        raise MoesimError(f"{root}: expected a FLAME folder (holding Encoder_Batch_* / Decoder_Batch_*), got a file")
    found: dict[str, list[Path]] = {"prefill": [], "decode": []}
    candidates = [root] if _BATCH.match(root.name) else sorted(p for p in root.iterdir() if p.is_dir())
    for p in candidates:
        m = _BATCH.match(p.name)
        if m:
            found["prefill" if m.group(1) == "Encoder" else "decode"].append(p)
    if not found["prefill"] and not found["decode"]:
        raise MoesimError(f"{root}: no Encoder_Batch_* (prefill) or Decoder_Batch_* (decode) folder; "
                          "is this a FLAME-MoE / DynaNDE trace folder?")
    return {k: v for k, v in found.items() if v}


def import_flame(path: str | os.PathLike, out: str | os.PathLike, *, layout: str | None = None,
                 seq_len: int | None = None, top_k: int | None = None, model_id: str = "FLAME-MoE-290M",
                 n_shared_experts: int = 2, row_group_size: int = DEFAULT_ROW_GROUP) -> ImportResult:
    """Convert one layout of a FLAME CSV tree into a sparse trace at ``out``.

    ``layout`` is required when PATH holds both layouts (they cover different
    sequences and layers, so they make two traces). ``seq_len`` (prefill only)
    defaults to T/S from the file names (``..._32seqs_2048tokens.csv``). ``top_k``
    defaults to the number of nonzero experts per row, which must be the same in
    every row.
    """
    check_output(out, [path])
    layouts = find_layouts(path)
    if layout is None:
        if len(layouts) > 1:
            raise MoesimError(f"{path} holds both the prefill (Encoder_Batch_*) and the decode (Decoder_Batch_*) "
                              "layout; they cover different sequences and layers: choose one with --layout")
        layout = next(iter(layouts))
    if layout not in LAYOUT_DIRS:
        raise MoesimError(f"unknown FLAME layout {layout!r} (expected prefill or decode)")
    if layout not in layouts:
        raise MoesimError(f"{path}: no {LAYOUT_DIRS[layout]}_* folder for the {layout} layout")
    batches = layouts[layout]
    if len(batches) > 1 and any(_batch_name(b).group(2) is None for b in batches):
        raise MoesimError(f"{path}: several {LAYOUT_DIRS[layout]} folders without a sequence range "
                          "(_<first>-<end>) in their names; cannot number their sequences apart")

    parts: list[_Part] = []
    E = None
    for batch in batches:
        m = _batch_name(batch)
        first, end = (int(m.group(2)), int(m.group(3))) if m.group(2) else (0, None)
        if end is not None and end <= first:
            raise MoesimError(f"{batch}: empty sequence range {first}-{end} in the folder name")
        if layout == "prefill":
            new = _prefill_batch(batch, first, end, seq_len)
        else:
            new = _decode_batch(batch, first, end)
        for part, e in new:
            if E is None:
                E = e
            elif e != E:
                raise MoesimError(f"{part.file}: {e} expert columns, other files have {E}")
            parts.append(part)

    k = top_k if top_k is not None else parts[0].ids.shape[1]
    for part in parts:
        if part.ids.shape[1] != k:
            raise MoesimError(f"{part.file}: rows have {part.ids.shape[1]} nonzero experts, expected top-k={k}")
    layers = sorted({p.layer for p in parts})
    notes = _duplicate_layers(parts)
    run = _RUN.search(parts[0].file.name)
    source = {
        "path": str(Path(path).resolve()),
        "layout": layout,
        "folders": [b.name for b in batches],
        "files": len(parts),
        "upstream": UPSTREAM,
        "format": "DynaNDE CSV: layer_id,token_id,expert_0..expert_{E-1}; selected experts carry their "
                  "softmax probability over all E; layer from the Layer_N folder",
        "scores": "top_logits = log(probability), lse = 0 (probabilities are a softmax over all E)",
    }
    if run:
        source["run"] = f"run {run.group(1)}, step {run.group(2)}"
    if layout == "prefill":
        source["seq_len"] = int(_prefill_seq_len(parts[0].file, seq_len))
    meta = TraceMeta(
        model_id=model_id, family="flame_moe", n_experts=int(E or 0), top_k=k, moe_layers=tuple(layers),
        gating="softmax", norm_topk_prob=False, layout="sparse", n_candidates=k,
        n_shared_experts=n_shared_experts, synthetic=False, tracer=tracer_info("flame"), source=source,
    )
    seq = np.concatenate([p.seq for p in parts])
    pos = np.concatenate([p.pos for p in parts])
    layer = np.concatenate([np.full(len(p.seq), p.layer) for p in parts])
    ids = np.concatenate([p.ids for p in parts])
    probs = np.concatenate([p.probs for p in parts])
    return write_topk_trace(out, meta, seq=seq, pos=pos, layer=layer, phase=layout, ids=ids, weights=probs,
                            logits=np.log(probs), lse=0.0, where=str(path), row_group_size=row_group_size,
                            notes=notes, inputs=[path])


def _layer_dirs(folder: Path) -> list[tuple[int, Path]]:
    out = []
    for p in sorted(folder.iterdir()):
        m = _LAYER.match(p.name)
        if m and p.is_dir():
            out.append((int(m.group(1)), p))
    if not out:
        raise MoesimError(f"{folder}: no Layer_N folders")
    return sorted(out)


def _one_csv(layer_dir: Path) -> Path:
    files = sorted(p for p in layer_dir.iterdir() if p.suffix == ".csv")
    if len(files) != 1:
        raise MoesimError(f"{layer_dir}: expected exactly one .csv file, found {len(files)}")
    return files[0]


def _prefill_seq_len(file: Path, seq_len: int | None) -> int:
    if seq_len is not None:
        if seq_len < 1:
            raise MoesimError(f"--seq-len must be >= 1, got {seq_len}")
        return seq_len
    m = _SHAPE.search(file.name)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) % int(m.group(1)):
        raise MoesimError(f"{file}: cannot tell the sequence length from the file name "
                          "(expected '..._<S>seqs_<T>tokens.csv'); give --seq-len")
    return int(m.group(2)) // int(m.group(1))


def _prefill_batch(batch: Path, first: int, end: int | None, seq_len: int | None):
    out = []
    token_sets = None
    for layer, d in _layer_dirs(batch):
        file = _one_csv(d)
        sl = _prefill_seq_len(file, seq_len)
        token_id, ids, probs, e = read_csv(file)
        seq, pos = token_id // sl + first, token_id % sl
        if end is not None and (seq >= end).any():
            raise MoesimError(f"{file}: token_id {int(token_id.max())} makes sequence {int(seq.max())}, beyond the "
                              f"folder's range {first}-{end} at {sl} tokens per sequence")
        token_sets = _same_tokens(token_sets, token_id, file)
        out.append((_Part(file, layer, seq, pos, ids, probs), e))
    return out


def _decode_batch(batch: Path, first: int, end: int | None):
    positions = []
    for p in sorted(batch.iterdir()):
        if not p.is_dir():
            continue
        m = _ORDINAL.match(p.name)
        if not m or int(m.group(1)) < 1:
            raise MoesimError(f"{p}: a decode position folder must be named 1st, 2nd, 3rd, 4th, ...")
        positions.append((int(m.group(1)) - 1, p))
    if not positions:
        raise MoesimError(f"{batch}: no position folders (1st, 2nd, ...)")
    out = []
    layer_sets = None
    token_sets = None
    for position, folder in sorted(positions):
        dirs = _layer_dirs(folder)
        layers = [layer for layer, _ in dirs]
        if layer_sets is None:
            layer_sets = (layers, folder)
        elif layers != layer_sets[0]:
            missing = sorted(set(layer_sets[0]) ^ set(layers))
            raise MoesimError(f"{folder}: has layers {_list(layers)} but {layer_sets[1].name} has "
                              f"{_list(layer_sets[0])} (layer {missing[0]} is missing from one of them)")
        for layer, d in dirs:
            file = _one_csv(d)
            token_id, ids, probs, e = read_csv(file)
            seq = token_id + first
            if end is not None and (seq >= end).any():
                raise MoesimError(f"{file}: token_id {int(token_id.max())} is beyond the folder's sequence range "
                                  f"{first}-{end}")
            token_sets = _same_tokens(token_sets, token_id, file)
            out.append((_Part(file, layer, seq, np.full(len(seq), position, dtype=np.int64), ids, probs), e))
    return out


def _same_tokens(ref, token_id: np.ndarray, file: Path):
    ids = np.sort(token_id)
    if ref is None:
        return ids, file
    if len(ids) != len(ref[0]) or (ids != ref[0]).any():
        diff = np.setxor1d(ids, ref[0])
        raise MoesimError(f"{file}: its token_ids differ from {ref[1]} (e.g. token_id {int(diff[0])} is in only one "
                          "of them); every layer must cover the same tokens")
    return ref


def read_csv(file: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(token_id [n], nonzero expert ids [n, k] ascending, their probabilities [n, k], E) of one CSV."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    check_utf8(file, "CSV file")
    with open(file, "rb") as f:
        header = f.readline().decode("utf-8", "replace").strip().split(",")
    if len(header) < 3 or header[:2] != ["layer_id", "token_id"]:
        raise MoesimError(f"{file}: header must start with layer_id,token_id,expert_0,... (got "
                          f"{','.join(header[:3])[:60]!r})")
    E = len(header) - 2
    want = [f"expert_{i}" for i in range(E)]
    if header[2:] != want:
        bad = next(i for i, (a, b) in enumerate(zip(header[2:], want)) if a != b)
        raise MoesimError(f"{file}: header column {bad + 3} is {header[bad + 2]!r}, expected {want[bad]!r} "
                          "(experts must be expert_0..expert_<E-1> in order)")
    types = {"layer_id": pa.int64(), "token_id": pa.int64(), **{c: pa.float64() for c in want}}
    try:
        # only an empty cell is missing: a 'nan' probability is a number, refused below as not finite
        table = pacsv.read_csv(file, convert_options=pacsv.ConvertOptions(column_types=types, include_columns=header,
                                                                          null_values=[""]))
    except (pa.ArrowException, OSError) as exc:
        raise MoesimError(f"{file}: not a valid FLAME CSV ({' '.join(str(exc).split())[:160]})") from None
    if table.num_rows == 0:
        raise MoesimError(f"{file}: no rows")
    if any(table.column(c).null_count for c in header):
        raise MoesimError(f"{file}: has empty cells")
    token_id = table.column("token_id").to_numpy()
    p = np.column_stack([table.column(c).to_numpy() for c in want])
    if (token_id < 0).any():
        raise MoesimError(f"{file}: negative token_id {int(token_id.min())}")
    u, c = np.unique(token_id, return_counts=True)
    if (c > 1).any():
        raise MoesimError(f"{file}: token_id {int(u[c > 1][0])} appears {int(c.max())} times")
    if not np.isfinite(p).all() or (p < 0).any() or (p > 1).any():
        raise MoesimError(f"{file}: probabilities must be finite and within 0..1")
    if (p.sum(axis=1) > 1 + 1e-3).any():
        row = int(np.argmax(p.sum(axis=1)))
        raise MoesimError(f"{file}: probabilities of token_id {int(token_id[row])} sum to {p[row].sum():.4f} > 1")
    nz = p > 0
    per_row = nz.sum(axis=1)
    k = int(per_row[0])
    if k == 0 or (per_row != k).any():
        row = int(np.argmax(per_row != k)) if k else 0
        raise MoesimError(f"{file}: token_id {int(token_id[row])} has {int(per_row[row])} nonzero experts, "
                          f"the first row has {k}; every row must carry the same top-k")
    ids = np.nonzero(nz)[1].reshape(-1, k)
    probs = p[nz].reshape(-1, k)
    return token_id, ids, probs, E


def _duplicate_layers(parts: list[_Part]) -> list[str]:
    """Layers whose routing is byte-for-byte the same as another layer's, which real
    routers do not produce: flag it so a user can check the source."""
    groups: dict[tuple, list[_Part]] = {}
    for p in parts:
        key = (p.file.parent.parent, )
        groups.setdefault(key, []).append(p)
    notes = []
    for members in groups.values():
        seen: dict[str, int] = {}
        for p in sorted(members, key=lambda x: x.layer):
            order = np.lexsort((p.pos, p.seq))
            h = hashlib.blake2b(p.ids[order].tobytes() + p.probs[order].tobytes(), digest_size=16).hexdigest()
            if h in seen:
                notes.append(f"layer {p.layer} holds exactly the same routing as layer {seen[h]} "
                             f"({p.file.parent.parent.name}); the source may hold duplicated files")
            else:
                seen[h] = p.layer
    return notes


def _list(xs) -> str:
    return ", ".join(map(str, xs))
