"""Hostile metadata, footers and numbers: one `moesim: error:` line and exit 2, never a traceback, a hang,
minutes of work or a printed nan."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from test_format_validation import rewrite, write_good

from moesim.cli import cli
from moesim.errors import MoesimError
from moesim.traces import TraceMeta

PRESETS = Path(__file__).resolve().parents[1] / "costmodel" / "presets"


def one_line(res, pattern: str):
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("moesim: error: "), res.stderr
    assert re.search(pattern, lines[0]), lines[0]


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def good(tmp_path):
    return write_good(tmp_path / "good.parquet")


# ---------------------------------------------------------------------------------------------- metadata


def _deep(n: int) -> dict:
    doc: dict = {}
    for _ in range(n):
        doc = {"a": doc}
    return doc


@pytest.mark.parametrize("edit, pattern", [
    (lambda m: m.update(source=_deep(500)), "nested more than 64 levels"),
    (lambda m: m.update(tracer=_deep(900)), "nested more than 64 levels"),
    (lambda m: m.update(source="a string", extra_key=1), "source must be a JSON object"),
    (lambda m: m.update(source=[1, 2], extra_key=1), "source must be a JSON object"),
    (lambda m: m.update(dense_layers=list(range(40000, 40003))), "dense layer indices"),
])
def test_hostile_metadata(edit, pattern, good, tmp_path):
    path = rewrite(good, tmp_path / "x.parquet", meta=edit)
    for cmd in ("info", "validate"):
        one_line(invoke(cmd, path), pattern)
    doc = json.loads(pq.read_schema(path).metadata[b"moesim"])
    with pytest.raises(MoesimError, match=pattern):  # the library, not only the CLI
        TraceMeta.from_json(json.dumps(doc))


# ---------------------------------------------------------------------------------------------- footers


def varint(n: int) -> bytes:
    """A Thrift compact-protocol varint (Parquet footers)."""
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def forge_counts(data: bytes, old: int, new: int, which: list[int]) -> bytes:
    """Rewrite i64 fields of the Thrift footer that hold ``old`` (field header 0x16 + zigzag varint): in
    file order, 0 = the file's num_rows, then every column chunk's num_values, last the row group's
    num_rows. The footer length is fixed up, so the file still parses."""
    n = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - n
    footer = data[start:-8]
    pat = b"\x16" + varint(old << 1)
    hits = [m.start() for m in re.finditer(re.escape(pat), footer)]
    which = [h if h >= 0 else len(hits) + h for h in which]
    for k in sorted(which, reverse=True):
        i = hits[k]
        footer = footer[:i] + b"\x16" + varint(new << 1) + footer[i + len(pat):]
    return data[:start] + footer + len(footer).to_bytes(4, "little") + b"PAR1"


@pytest.mark.parametrize("which, new, pattern", [
    ([-1], 0, "damaged footer: the file claims 12 rows, its row groups 0"),
    ([0], 10**12, "the file claims 1000000000000 rows, its row groups 12"),
    ([0, -1], 10**12, "row group 0 claims 1000000000000 rows but 12 seq values"),
    ("all", 10**12, "row group 0 holds 12 rows of .*, its footer says 1000000000000"),
    # fewer rows claimed everywhere: the reader stops at the claimed count; the keys then do not add up
    ("all", 5, "token \\(seq=0, pos=0\\) lacks layer 3"),
    ([1], 0, "row group 0 claims 12 rows but 0 seq values"),
])
def test_footer_row_counts_are_checked(which, new, pattern, good, tmp_path):
    data = good.read_bytes()
    md = pq.ParquetFile(good).metadata
    assert md.num_rows == 12 and md.num_row_groups == 1
    flat = [i for i in range(md.num_columns) if md.row_group(0).column(i).num_values == 12]
    if which == "all":  # file, row group and every flat column agree on the forged count: only the data can tell
        which = [0, *range(1, len(flat) + 1), -1]
    path = tmp_path / "forged.parquet"
    path.write_bytes(forge_counts(data, 12, new, which))
    assert pq.ParquetFile(path).metadata.num_rows in (12, new)
    for cmd in ("info", "validate"):
        one_line(invoke(cmd, path), pattern)


# ---------------------------------------------------------------------------------------------- numbers


@pytest.mark.parametrize("args, pattern", [
    (["sweep", "{t}", "--slots", "nan"], "bad slots 'nan': expected a whole number"),
    (["sweep", "{t}", "--slots", "inf"], "bad slots 'inf'"),
    (["sweep", "{t}", "--budget", "0.25", "--batch", "inf"], "bad batch 'inf'"),
    (["sweep", "{t}", "--budget", "0.25", "--batch", "nan"], "bad batch 'nan'"),
    (["sweep", "{t}", "--budget", "nan"], "bad budget 'nan'"),
    (["sweep", "{t}", "--budget", "0.25", "--theta", "inf"], "bad threshold"),
    (["sweep", "{t}", "--budget", "0.25:inf:0.25"], "bad budget 'inf'"),
    (["mrc", "{t}", "--slots-grid", "nan"], "bad slots 'nan'"),
    (["mrc", "{t}", "--slots-grid", "1:inf:1"], "bad slots 'inf'"),
    (["sweep", "{t}", "--config", "{toml:slots = [nan]}"], "bad slots nan"),
    (["sweep", "{t}", "--config", "{toml:budget = 0.25\nwarmup_tokens = inf}"], "bad warmup_tokens inf"),
    (["sweep", "{t}", "--config", "{toml:budget = 0.25\nbatch = [1.5]}"], "bad batch 1.5"),
    (["estimate", "--model", "qwen3-30b-a3b", "--hw", "rtx3090-pcie4", "--zipf", "400"], "zipf exponent"),
])
def test_non_finite_numbers_are_refused(args, pattern, good, tmp_path):
    def fill(a):
        if a.startswith("{toml:"):
            p = tmp_path / "grid.toml"
            p.write_text(a[len("{toml:"):-1] + "\n")
            return str(p)
        return a.replace("{t}", str(good))
    one_line(invoke(*map(fill, args)), pattern)


def test_steep_zipf_is_finite():
    from moesim.costmodel.timing import expected_union, selection_probs

    assert expected_union(128, 8, 4, 400.0) == pytest.approx(8.0)  # the limit: the top k experts always
    assert selection_probs(512, 10, 1e6).sum() == pytest.approx(10.0)
    res = invoke("estimate", "--model", "qwen3-30b-a3b", "--hw", "rtx3090-pcie4", "--zipf", "20", "--format", "json")
    assert res.exit_code == 0 and "NaN" not in res.output and "nan" not in res.output


# ---------------------------------------------------------------------------------------------- machine and model files


def _edited(tmp_path: Path, src: Path, old: str, new: str) -> Path:
    text = src.read_text()
    assert old in text, old
    out = tmp_path / src.name
    out.write_text(text.replace(old, new, 1))
    return out


@pytest.mark.parametrize("old, new, pattern", [
    ("pcie_gen = 4", "pcie_gen = [4]", r"pcie_gen must be one of .* \(got \[4\]\)"),
    ("lanes = 16", 'lanes = "16"', "lanes must be one of"),
    ("capacity_gib = 24", "capacity_gib = 1e300", "capacity_gib must be <= 1e\\+09"),
    ("capacity_gib = 24", "capacity_gib = nan", "capacity_gib must be a number"),
    ('kind = "pcie"', 'kind = ["pcie"]', "kind must be 'pcie' or 'unified'"),
])
def test_hostile_hardware_files(old, new, pattern, tmp_path):
    path = _edited(tmp_path, PRESETS / "hardware" / "rtx3090-pcie4.toml", old, new)
    one_line(invoke("hw", "show", path), pattern)


@pytest.mark.parametrize("old, new, pattern", [
    ("n_layers = 48", "n_layers = inf", "moe.n_layers must be a whole number \\(got inf\\)"),
    ("n_layers = 48", "n_layers = 1e8", "moe.n_layers must be between 1 and 1024"),
    ("n_layers = 48", "n_layers = 100000000", "moe.n_layers must be between 1 and 1024"),
    ("top_k = 8", "top_k = 8.9", "moe.top_k must be a whole number \\(got 8.9\\)"),
    ("top_k = 8", 'top_k = "8"', "moe.top_k must be a whole number"),
    ("hidden_size = 2048", "hidden_size = 1e12", "dense.hidden_size must be between"),
    ("n_experts = 128", "n_experts = 128.0", None),  # a whole float is a whole number
    ('gating = "softmax"', 'gating = "banana"', "moe.gating 'banana' is not one of softmax, softmax_topk, sigmoid"),
    ("active_params_b = 3.3", "active_params_b = 40.0", "active_params_b \\(40\\) exceeds total_params_b \\(30.5\\)"),
    ("n_kv_heads = 4", "n_kv_heads = 5", "attention.n_kv_heads \\(5\\) must divide n_heads \\(32\\)"),
    ("n_kv_heads = 4", "n_kv_heads = 64", "attention.n_kv_heads \\(64\\) must divide n_heads"),
])
def test_hostile_model_files(old, new, pattern, tmp_path):
    path = _edited(tmp_path, PRESETS / "models" / "qwen3-30b-a3b.toml", old, new)
    t0 = time.perf_counter()
    res = invoke("models", "show", path)
    assert time.perf_counter() - t0 < 30
    if pattern is None:
        assert res.exit_code == 0, res.output
    else:
        one_line(res, pattern)
        one_line(invoke("estimate", "--model", path, "--hw", "rtx3090-pcie4"), pattern)


@pytest.mark.parametrize("kind", ["hw", "models"])
def test_files_that_are_not_utf8(kind, tmp_path):
    path = tmp_path / "x.toml"
    path.write_bytes(b'name = "\xff\xfe"\n')
    one_line(invoke(kind, "show", path), "not UTF-8 text")


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "[1]"])
def test_hostile_engine_files(value, tmp_path):
    src = PRESETS / "engines" / "llama.cpp.toml"
    line = next(x for x in src.read_text().splitlines() if x.startswith("gpu_layer_us"))
    path = _edited(tmp_path, src, line, f"gpu_layer_us = {value}")
    one_line(invoke("estimate", "--model", "qwen3-30b-a3b", "--hw", "rtx3090-pcie4", "--engine", path),
             "gpu_layer_us must be a number in 0..1e9")
