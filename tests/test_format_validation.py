"""Malformed traces: one error line on stderr, exit code 2, never a traceback.

`moesim info` reads the metadata and the key columns only (fast on a multi-GB
trace), so it catches everything except problems inside the score columns;
`moesim validate` reads every row and catches those too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from moesim.cli import cli
from moesim.traces import TraceMeta, TraceWriter

E, K, M = 16, 2, 4
LAYERS = (0, 3)


def write_good(path: Path, layout: str = "sparse") -> Path:
    rng = np.random.default_rng(0)
    meta = TraceMeta(model_id="m", family="f", n_experts=E, top_k=K, moe_layers=LAYERS, layout=layout,
                     n_candidates=E if layout == "dense" else M)
    T = 6
    with TraceWriter(path, meta, selected=True, weights=True, token=True) as w:
        for layer in LAYERS:
            lg = rng.normal(size=(T, E))
            ids = np.argsort(-lg, axis=1)[:, :M]
            kw = dict(logits=lg) if layout == "dense" else dict(
                top_ids=ids, top_logits=np.take_along_axis(lg, ids, 1), lse=np.log(np.exp(lg).sum(1)))
            w.write(seq=np.repeat([0, 1], 3), pos=np.tile([0, 1, 2], 2), layer=layer, token=np.arange(T),
                    selected=ids[:, :K], weights=np.full((T, K), 0.5), **kw)
    return path


def _meta(table: pa.Table) -> dict:
    return json.loads(table.schema.metadata[b"moesim"])


def rewrite(src: Path, dst: Path, *, meta=None, table=None) -> Path:
    """Copy a trace, editing its metadata dict and/or its Arrow table."""
    t = pq.read_table(src)
    doc = _meta(t)
    if meta:
        meta(doc)
    if table:
        t = table(t)
    t = t.replace_schema_metadata({b"moesim": json.dumps(doc).encode()})
    pq.write_table(t, dst)
    return dst


def set_list(t: pa.Table, name: str, fn) -> pa.Table:
    """Replace a fixed-size-list column by fn(values [n, width]) keeping its type."""
    col = t.column(name).combine_chunks()
    width = col.type.list_size
    vals = col.flatten().to_numpy().reshape(-1, width).copy()
    vals = fn(vals)
    arr = pa.FixedSizeListArray.from_arrays(pa.array(vals.reshape(-1), type=col.type.value_type), width)
    return t.set_column(t.schema.get_field_index(name), t.schema.field(name), arr)


def set_flat(t: pa.Table, name: str, fn) -> pa.Table:
    col = t.column(name).combine_chunks()
    arr = pa.array(fn(col.to_numpy(zero_copy_only=False).copy()), type=col.type)
    return t.set_column(t.schema.get_field_index(name), t.schema.field(name), arr)


def _first(a, value):
    a[0, 0] = value
    return a


def _repeat(a):
    a[0, 1] = a[0, 0]
    return a


# name -> (builder(tmp_path, good_sparse, good_dense) -> path, message regex, does `info` catch it?)
CASES = {
    "not parquet": (lambda d, s, g: _text(d / "x.parquet", "seq,pos,layer\n0,0,0\n"), "not a Parquet file", True),
    "truncated": (lambda d, s, g: _truncate(s, d / "x.parquet"), "not a Parquet file, or truncated", True),
    "no moesim metadata": (lambda d, s, g: _plain(d / "x.parquet"), "not a moesim trace", True),
    "missing column": (lambda d, s, g: rewrite(s, d / "x.parquet", table=lambda t: t.drop_columns(["lse"])),
                       "missing column.*lse", True),
    "missing metadata field": (lambda d, s, g: rewrite(s, d / "x.parquet", meta=lambda m: m.pop("top_k")),
                               "metadata lacks top_k", True),
    "metadata not json": (lambda d, s, g: _bad_meta(s, d / "x.parquet"), "not valid JSON", True),
    "unsupported schema version": (lambda d, s, g: rewrite(s, d / "x.parquet",
                                                           meta=lambda m: m.update(schema_version=4)),
                                   "unsupported trace schema version 4", True),
    "version 2 with a v1 layout": (lambda d, s, g: rewrite(s, d / "x.parquet",
                                                           meta=lambda m: m.update(schema_version=2)),
                                   "schema version 2 does not go with the sparse layout", True),
    "k < 1": (lambda d, s, g: rewrite(s, d / "x.parquet", meta=lambda m: m.update(top_k=0)), "top-k must be", True),
    "k > E": (lambda d, s, g: rewrite(s, d / "x.parquet", meta=lambda m: m.update(top_k=E + 1)),
              "top-k must be", True),
    "empty trace": (lambda d, s, g: rewrite(s, d / "x.parquet", table=lambda t: t.slice(0, 0)), "empty trace", True),
    "duplicate rows": (lambda d, s, g: rewrite(s, d / "x.parquet",
                                               table=lambda t: pa.concat_tables([t, t.slice(3, 1)])),
                       "duplicate rows for \\(seq=1, pos=0, layer=0\\)", True),
    "token missing a layer": (lambda d, s, g: rewrite(s, d / "x.parquet", table=lambda t: t.slice(1)),
                              "token \\(seq=0, pos=0\\) lacks layer 0", True),
    "layer not in metadata": (lambda d, s, g: rewrite(s, d / "x.parquet",
                                                      table=lambda t: set_flat(t, "layer", lambda a: _at0(a, 7))),
                              "layer 7 is not one of the MoE layers", True),
    "rows of a token disagree": (lambda d, s, g: rewrite(s, d / "x.parquet",
                                                         table=lambda t: set_flat(t, "token", lambda a: _at0(a, 99))),
                                 "disagree on its token", True),
    # score-level problems: only `validate` reads the score columns
    "NaN dense logits": (lambda d, s, g: rewrite(g, d / "x.parquet",
                                                 table=lambda t: set_list(t, "logits", lambda a: _first(a, np.nan))),
                         "logits holds NaN", False),
    "inf sparse top_logits": (lambda d, s, g: rewrite(s, d / "x.parquet", table=lambda t: set_list(
        t, "top_logits", lambda a: _first(a, np.inf))), "top_logits holds NaN or infinite", False),
    "NaN lse": (lambda d, s, g: rewrite(s, d / "x.parquet",
                                        table=lambda t: set_flat(t, "lse", lambda a: _at0(a, np.nan))),
                "lse holds NaN", False),
    "lse below a logit": (lambda d, s, g: rewrite(s, d / "x.parquet",
                                                  table=lambda t: set_flat(t, "lse", lambda a: _at0(a, -50.0))),
                          "lse .* is below the row's largest logit", False),
    "NaN weights": (lambda d, s, g: rewrite(s, d / "x.parquet",
                                            table=lambda t: set_list(t, "weights", lambda a: _first(a, np.nan))),
                    "weights holds NaN", False),
    "negative weights": (lambda d, s, g: rewrite(s, d / "x.parquet",
                                                 table=lambda t: set_list(t, "weights", lambda a: _first(a, -1.0))),
                         "gate weights must be non-negative", False),
    "top_ids out of range": (lambda d, s, g: rewrite(s, d / "x.parquet",
                                                     table=lambda t: set_list(t, "top_ids", lambda a: _first(a, E))),
                             f"top_ids holds expert id {E}, outside 0..{E - 1}", False),
    "selected out of range": (lambda d, s, g: rewrite(s, d / "x.parquet",
                                                      table=lambda t: set_list(t, "selected", lambda a: _first(a, -1))),
                              "selected holds expert id -1", False),
    "repeated expert in top_ids": (lambda d, s, g: rewrite(s, d / "x.parquet",
                                                           table=lambda t: set_list(t, "top_ids", _repeat)),
                                   "top_ids repeats an expert", False),
    "selected not scored, no weights": (lambda d, s, g: rewrite(s, d / "x.parquet", table=_unscored_selected),
                                        "selected expert is not among the row's scored candidates", False),
    "repeated expert in selected": (lambda d, s, g: rewrite(s, d / "x.parquet",
                                                            table=lambda t: set_list(t, "selected", _repeat)),
                                    "selected repeats an expert", False),
}


def _unscored_selected(t: pa.Table) -> pa.Table:
    t = t.drop_columns(["weights"])
    top = t.column("top_ids").combine_chunks().flatten().to_numpy().reshape(-1, M)
    outside = next(e for e in range(E) if e not in top[0])
    return set_list(t, "selected", lambda a: _first(a, outside) if outside not in a[0] else a)


def _at0(a, v):
    a[0] = v
    return a


def _text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _truncate(src: Path, dst: Path) -> Path:
    data = src.read_bytes()
    dst.write_bytes(data[: len(data) // 2])
    return dst


def _plain(path: Path) -> Path:
    pq.write_table(pa.table({"seq": [0], "pos": [0], "layer": [0]}), path)
    return path


def _bad_meta(src: Path, dst: Path) -> Path:
    t = pq.read_table(src).replace_schema_metadata({b"moesim": b"{not json"})
    pq.write_table(t, dst)
    return dst


@pytest.fixture
def goods(tmp_path):
    return write_good(tmp_path / "good_sparse.parquet"), write_good(tmp_path / "good_dense.parquet", "dense")


def _one_error_line(result, pattern):
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("moesim: error: "), lines[0]
    assert "Traceback" not in result.output
    import re

    assert re.search(pattern, lines[0]), lines[0]


def test_good_traces_pass(goods):
    runner = CliRunner()
    for path in goods:
        for cmd in ("validate", "info"):
            result = runner.invoke(cli, [cmd, str(path)])
            assert result.exit_code == 0, result.output


@pytest.mark.parametrize("case", sorted(CASES))
def test_validate_rejects(case, tmp_path, goods):
    build, pattern, _ = CASES[case]
    path = build(tmp_path, *goods)
    _one_error_line(CliRunner().invoke(cli, ["validate", str(path)]), pattern)


@pytest.mark.parametrize("case", sorted(CASES))
def test_info_rejects_structure_and_skips_scores(case, tmp_path, goods):
    build, pattern, info_catches = CASES[case]
    path = build(tmp_path, *goods)
    result = CliRunner().invoke(cli, ["info", str(path), "--format", "json"])
    if info_catches:
        _one_error_line(result, pattern)
    else:
        # by design: info does not read score columns; it says so
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["scores_checked"] is False


@pytest.mark.parametrize("args", [["validate", "/nonexistent/x.parquet"], ["info", "/nonexistent/x.parquet"]])
def test_missing_file(args):
    _one_error_line(CliRunner().invoke(cli, args), "no such file")


def test_directory_is_not_a_trace(tmp_path):
    _one_error_line(CliRunner().invoke(cli, ["validate", str(tmp_path)]), "directory")


def _console_script() -> Path:
    exe = Path(sys.executable).with_name("moesim")
    if not exe.exists():
        pytest.skip("the moesim console script is not installed next to this Python")
    return exe


@pytest.mark.parametrize("case, cmd", [("truncated", "info"), ("NaN dense logits", "validate"),
                                       ("duplicate rows", "validate")])
def test_console_script_prints_one_line(case, cmd, tmp_path, goods):
    build, pattern, _ = CASES[case]
    path = build(tmp_path, *goods)
    proc = subprocess.run([str(_console_script()), cmd, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("moesim: error: ") and "Traceback" not in proc.stderr


@pytest.mark.parametrize("where", [0.05, 0.3, 0.45, 0.6, 0.9])
def test_corrupt_row_data_with_intact_footer(where, tmp_path, goods):
    """Damaged data pages (the footer still parses). Random bytes inside incompressible float
    data would decode to wrong but finite numbers; the page checksums the writer stores catch it."""
    data = bytearray(goods[1].read_bytes())
    footer = int.from_bytes(data[-8:-4], "little") + 8
    start = int((len(data) - footer) * where)
    data[start:start + 64] = np.random.default_rng(start).integers(0, 256, 64, dtype=np.uint8).tobytes()
    path = tmp_path / "corrupt.parquet"
    path.write_bytes(bytes(data))
    proc = subprocess.run([str(_console_script()), "validate", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("moesim: error: "), proc.stderr
    assert "damaged or truncated" in lines[0]


def test_signalling_nan_gives_one_line(tmp_path, goods):
    """A file without page checksums (written by another tool) holding a signalling NaN:
    numpy's cast warning must not leak to stderr next to the error line."""

    def snan(a):
        a.view(np.uint32)[0, 0] = 0x7FA00000
        return a

    path = rewrite(goods[1], tmp_path / "x.parquet", table=lambda t: set_list(t, "logits", snan))
    proc = subprocess.run([str(_console_script()), "validate", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"moesim: error: {path}: column logits holds NaN or infinite scores"]
