"""Fuzzing the trace reader: byte-mutated trace files and randomly mutated metadata documents must give a
valid trace or one MoesimError line, never another exception type. Deterministic (seeds from zlib.crc32,
a fixed number of cases) and a few seconds long; a failure names the seed that reproduces it."""

from __future__ import annotations

import copy
import json
import re
import time
import zlib

import numpy as np
import pyarrow.parquet as pq
import pytest
from test_hostile_input import varint

from moesim.errors import MoesimError
from moesim.jsonable import plain
from moesim.traces import TraceMeta, TraceWriter
from moesim.traces.info import trace_info
from moesim.traces.reader import TraceFile
from moesim.traces.routing import validate_trace

_DEEP = re.compile(r'"@@deep(\d+)@@"')
BYTE_CASES = 2000
META_CASES = 3000
E, K, M = 8, 2, 4


def _seed(name: str) -> int:
    return zlib.crc32(name.encode())


def small_trace(path, row_group_size: int = 6):
    """Sparse scores, selected ids, weights, domains and tokens: every column kind; two row groups of 6
    rows (or one of 12)."""
    rng = np.random.default_rng(_seed("fuzz-base"))
    meta = TraceMeta(model_id="fuzz", family="f", n_experts=E, top_k=K, moe_layers=(0, 2), layout="sparse",
                     n_candidates=M, source={"note": "fuzz base"})
    T = 6
    with TraceWriter(path, meta, selected=True, weights=True, token=True, domains=["a", "b"],
                     row_group_size=row_group_size) as w:
        for layer in (0, 2):
            lg = rng.normal(size=(T, E))
            ids = np.argsort(-lg, axis=1)[:, :M]
            w.write(seq=np.repeat([0, 1], 3), pos=np.tile([0, 1, 2], 2), layer=layer, token=np.arange(T),
                    domain=["a", "a", "b", "b", "a", "b"], top_ids=ids, top_logits=np.take_along_axis(lg, ids, 1),
                    lse=np.log(np.exp(lg).sum(1)), selected=ids[:, :K], weights=np.full((T, K), 0.5))
    return path


def _check(fn, what: str, seed: int):
    """fn() succeeds or raises a one-line MoesimError; anything else fails with the seed."""
    try:
        fn()
    except MoesimError as exc:
        assert "\n" not in str(exc), f"{what} (seed {seed}): multi-line error {exc!r}"
    except Exception as exc:  # noqa: BLE001 - the point of the test
        pytest.fail(f"{what} (seed {seed}): {type(exc).__name__}: {exc}")


def _forge_footer_number(data: bytes, rng: np.random.Generator) -> bytes:
    """Replace one i32/i64 field of the Thrift footer (row counts, offsets, sizes, value counts) by 0, a
    small number or a huge one, and fix the footer length: the file still parses, its numbers lie."""
    n = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - n
    footer = bytearray(data[start:-8])
    heads = [i for i in range(len(footer) - 1) if footer[i] & 0x0F in (5, 6) and footer[i] >> 4]
    if not heads:
        return data
    i = heads[int(rng.integers(0, len(heads)))] + 1
    j = i
    while j < len(footer) and footer[j] & 0x80:
        j += 1
    value = [0, 1, int(rng.integers(2, 100)), 10**12, 2**62, -1][int(rng.integers(0, 6))]
    footer[i:j + 1] = varint((value << 1) ^ (value >> 63))  # zigzag
    return data[:start] + bytes(footer) + len(footer).to_bytes(4, "little") + b"PAR1"


def _mutate_bytes(data: bytes, rng: np.random.Generator) -> bytes:
    if rng.random() < 0.4:
        return _forge_footer_number(data, rng)
    footer = int.from_bytes(data[-8:-4], "little") + 8
    return edit_bytes(data, rng, lambda n: (max(0, n - footer), n))  # half the edits in the footer


def edit_bytes(data: bytes, rng: np.random.Generator, region=None) -> bytes:
    """1-3 edits (flip a bit, set a byte, overwrite a run, delete, insert, truncate), each at a random place,
    half of them within ``region(len) -> (lo, hi)`` when given (a footer, a header)."""
    b = bytearray(data)
    for _ in range(int(rng.integers(1, 4))):
        kind = rng.integers(0, 6)
        lo, hi = region(len(b)) if region is not None and rng.random() < 0.5 else (0, len(b))
        i = int(rng.integers(lo, max(hi, lo + 1)))
        if kind == 0:
            b[i] ^= 1 << int(rng.integers(0, 8))
        elif kind == 1:
            b[i] = int(rng.integers(0, 256))
        elif kind == 2:
            n = int(rng.integers(1, 16))
            b[i:i + n] = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        elif kind == 3:
            del b[i:i + int(rng.integers(1, 8))]
        elif kind == 4:
            b[i:i] = rng.integers(0, 256, int(rng.integers(1, 8)), dtype=np.uint8).tobytes()
        else:
            b = b[:i]
        if not b:
            break
    return bytes(b)


def test_byte_mutated_traces_give_one_line_errors(tmp_path):
    bases = [small_trace(tmp_path / f"base{n}.parquet", n).read_bytes() for n in (6, 12)]
    for n in (6, 12):
        validate_trace(tmp_path / f"base{n}.parquet")
    path = tmp_path / "m.parquet"
    root = _seed("fuzz-trace-bytes")
    t0 = time.perf_counter()
    for i in range(BYTE_CASES):
        seed = root + i
        path.write_bytes(_mutate_bytes(bases[i % 2], np.random.default_rng(seed)))
        _check(lambda: validate_trace(TraceFile(path)), "byte-mutated trace, validate", seed)
        _check(lambda: trace_info(path), "byte-mutated trace, info", seed)
    assert time.perf_counter() - t0 < 120


# ---------------------------------------------------------------------------------------------- metadata


def _junk(rng: np.random.Generator, depth: int = 0):
    """A random JSON value: wrong types, extreme numbers, long or control-character strings, nesting."""
    pick = int(rng.integers(0, 14 if depth < 3 else 10))
    return [None, True, False, 0, -1, 2**31, 2**63 + 5, 10**30, 1.5, -0.0, "", "x\x1b]0;t\x07",
            "8", "\u202e"][pick] if pick < 10 else (
        [_junk(rng, depth + 1) for _ in range(int(rng.integers(0, 4)))] if pick == 10 else
        {f"k{j}": _junk(rng, depth + 1) for j in range(int(rng.integers(0, 4)))} if pick == 11 else
        float(["nan", "inf", "-inf"][int(rng.integers(0, 3))]) if pick == 12 else "y" * int(rng.integers(0, 5000)))


def _deep_text(n: int) -> str:
    """JSON nested n levels (lists and objects alternating), as text: json.dumps itself recurses."""
    return "".join('{"a":' if i % 2 else "[" for i in range(n)) + "1" + "".join(
        "}" if i % 2 else "]" for i in reversed(range(n)))


def _dumps(doc) -> str:
    text = json.dumps(doc, allow_nan=True)
    return _DEEP.sub(lambda m: _deep_text(int(m.group(1))), text)


def _mutate_meta(doc: dict, rng: np.random.Generator) -> dict:
    doc = copy.deepcopy(doc)
    keys = sorted(doc)
    for _ in range(int(rng.integers(1, 4))):
        kind = int(rng.integers(0, 7))
        key = keys[int(rng.integers(0, len(keys)))]
        if kind == 0:
            doc.pop(key, None)
        elif kind == 1:
            doc[key] = _junk(rng)
        elif kind == 2:  # an unknown key, beside a source of any type
            doc[f"unknown{int(rng.integers(0, 3))}"] = _junk(rng)
            if rng.random() < 0.5:
                doc["source"] = _junk(rng)
        elif kind == 3:
            doc[key] = f"@@deep{int(rng.integers(50, 3000))}@@"
        elif kind == 4 and isinstance(doc.get(key), (int, float)) and not isinstance(doc.get(key), bool):
            doc[key] = doc[key] + int(rng.integers(-3, 4))
        elif kind == 5 and isinstance(doc.get(key), list) and doc[key]:
            doc[key] = doc[key] + [doc[key][-1]] if rng.random() < 0.5 else doc[key][:-1]
        else:
            doc["layout"] = ["dense", "sparse", "counts"][int(rng.integers(0, 3))]
    return doc


def _use(text: str):
    meta = TraceMeta.from_json(text)
    meta.to_json()  # written back by importers and tools
    json.dumps(plain(meta.__dict__))  # printed by info --format json


def test_mutated_metadata_gives_one_line_errors():
    base = json.loads(TraceMeta(model_id="fuzz", family="f", n_experts=E, top_k=K, moe_layers=(0, 2),
                                layout="sparse", n_candidates=M, dense_layers=(1,),
                                bytes_per_expert={"bf16": 10}, source={"note": "x"},
                                tracer={"name": "t"}).to_json())
    root = _seed("fuzz-trace-metadata")
    t0 = time.perf_counter()
    for i in range(META_CASES):
        seed = root + i
        doc = _mutate_meta(base, np.random.default_rng(seed))
        text = _dumps(doc)
        _check(lambda: _use(text), "mutated metadata", seed)  # noqa: B023 - called at once
    assert time.perf_counter() - t0 < 120


def test_mutated_metadata_in_a_file(tmp_path):
    """The same mutations through a whole file (TraceFile checks the columns against the metadata)."""
    base_path = small_trace(tmp_path / "base.parquet")
    table = pq.read_table(base_path)
    base = json.loads(table.schema.metadata[b"moesim"])
    root = _seed("fuzz-trace-metadata-file")
    path = tmp_path / "m.parquet"
    for i in range(200):
        seed = root + i
        doc = _mutate_meta(base, np.random.default_rng(seed))
        raw = _dumps(doc).encode()
        pq.write_table(table.replace_schema_metadata({b"moesim": raw}), path)
        _check(lambda: validate_trace(TraceFile(path)), "mutated metadata file", seed)


def test_deep_metadata_is_one_line():
    for n in (70, 900, 100_000):
        with pytest.raises(MoesimError, match="nested"):
            TraceMeta.from_json('{"schema_version": 1, "source": ' + _deep_text(n) + "}")
