"""Fuzzing the commands with every kind of file they read besides traces (issue 33): mutated sweep results,
quality results, CSV tables, JSON Lines, NumPy arrays, TOML machine/model/engine files and llama-bench
output must give a result or one `moesim: error:` line with exit 2, never a traceback or another exit.
Deterministic (seeds from zlib.crc32, a fixed number of cases per kind), bounded in time; a failure names
the seed that reproduces it. Charts are not drawn (their export is stubbed): the readers are under test."""

from __future__ import annotations

import re
import shutil
import time
import zlib
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner
from conftest import FIXTURES, REPO
from quality_helpers import write_quality
from sweep_helpers import small_trace
from test_fuzz_inputs import edit_bytes

from moesim.cli import cli
from moesim.sweeps.store import layers_path

CASES = 120  # per kind
LRU = ["-e", "lru", "-m", "fetch-all", "--budget", "0.25"]
JUNK = ["nan", "NaN", "inf", "-inf", "-1", "0", "1e308", "1e-300", "18446744073709551615", "", "abc", '"x"',
        "[]", "{}", "true", "\x1b]0;t\x07", "caf\xe9", "1.5", "2", "-0"]
CELLS = [float("nan"), float("inf"), -1.0, 0.0, 1e300, 2.0, -(2**62), 2**62, None, "abc", "", True]


def _seed(name: str) -> int:
    return zlib.crc32(name.encode())


def _contract(res, what: str, seed: int) -> None:
    if res.exit_code == 0:
        return
    lines = res.stderr.strip().splitlines() if res.exit_code == 2 else []
    ok = len(lines) == 1 and lines[0].startswith("moesim: error: ")
    assert ok, f"{what} (seed {seed}): exit {res.exit_code}, {res.exception!r}, stderr {res.stderr[-500:]!r}"


def _mutate_bytes(data: bytes, rng: np.random.Generator, head: int | None = None) -> bytes:
    """Byte edits, half of them in the first ``head`` bytes (a header) when given."""
    return edit_bytes(data, rng, (lambda n: (0, min(n, head))) if head else None)


def _mutate_fields(text: str, rng: np.random.Generator, pattern: str) -> bytes:
    """Replace 1-3 matches of ``pattern`` (a cell, a value) by junk; sometimes drop or repeat a line."""
    spans = [m.span() for m in re.finditer(pattern, text)]
    for _ in range(int(rng.integers(1, 4))):
        if spans:
            a, b = spans[int(rng.integers(0, len(spans)))]
            text = text[:a] + JUNK[int(rng.integers(0, len(JUNK)))] + text[b:]
            spans = [m.span() for m in re.finditer(pattern, text)]
    lines = text.split("\n")
    if rng.random() < 0.2 and len(lines) > 1:
        i = int(rng.integers(0, len(lines)))
        lines.insert(i, lines[i]) if rng.random() < 0.5 else lines.pop(i)
    return "\n".join(lines).encode("utf-8", "surrogateescape").replace("caf\xe9".encode(), b"caf\xe9")


def _mutate_frame(df: pl.DataFrame, rng: np.random.Generator) -> pl.DataFrame:
    """1-3 cells set to junk of any type (the column retyped as needed), or a column dropped."""
    for _ in range(int(rng.integers(1, 4))):
        name = df.columns[int(rng.integers(0, df.width))]
        if rng.random() < 0.1:
            df = df.drop(name)
            continue
        col = df[name].to_list()
        col[int(rng.integers(0, len(col)))] = CELLS[int(rng.integers(0, len(CELLS)))]
        df = df.with_columns(pl.Series(name, col, strict=False))
    return df


def _fuzz(kind: str, make, run) -> None:
    """``make(rng) -> None`` writes the mutated file(s); ``run() -> Result`` runs the command on them."""
    root, t0 = _seed(f"fuzz-files-{kind}"), time.perf_counter()
    for i in range(CASES):
        make(np.random.default_rng(root + i))
        _contract(run(), kind, root + i)
    assert time.perf_counter() - t0 < 240


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def no_charts(monkeypatch):
    from moesim.reports import charts

    monkeypatch.setattr(charts, "export", lambda fig, directory: {k: directory / f"{fig.name}.{k}"
                                                                  for k in ("png", "svg", "spec")})


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz-results")
    trace = small_trace(d)
    assert invoke("sweep", trace, *LRU, "-o", d / "r.parquet").exit_code == 0
    return trace, d / "r.parquet"


# ---------------------------------------------------------------------------------------------- tables moesim wrote


def test_mutated_results(sweep, tmp_path, no_charts, monkeypatch):
    from moesim.reports import report

    monkeypatch.setattr(report, "_make_figures_and_tables", lambda *a: ([], []))
    trace, results = sweep
    rows, layers = pl.read_parquet(results), pl.read_parquet(layers_path(results))
    bad = tmp_path / "bad.parquet"

    def make(rng):
        if rng.random() < 0.3:
            bad.write_bytes(_mutate_bytes(results.read_bytes(), rng))
            shutil.copyfile(layers_path(results), layers_path(bad))
        else:
            _mutate_frame(rows, rng).write_parquet(bad)
            (_mutate_frame(layers, rng) if rng.random() < 0.3 else layers).write_parquet(layers_path(bad))

    _fuzz("results: report", make, lambda: invoke("report", bad, "--trace", trace, "-o", tmp_path / "rep"))
    _fuzz("results: resume", make, lambda: invoke("sweep", trace, *LRU, "-o", bad))


def test_mutated_quality(sweep, tmp_path, no_charts):
    base = write_quality(tmp_path / "base.parquet")
    frame = pl.read_parquet(base)
    bad = tmp_path / "q.parquet"

    def make(rng):
        if rng.random() < 0.3:
            bad.write_bytes(_mutate_bytes(base.read_bytes(), rng))
        else:
            _mutate_frame(frame, rng).write_parquet(bad)

    _fuzz("quality: report", make, lambda: invoke("report", "--quality", bad, "-o", tmp_path / "rep"))
    _fuzz("quality: sweep", make, lambda: invoke("sweep", sweep[0], *LRU, "--quality", bad))


# ---------------------------------------------------------------------------------------------- imported files

CELL = r"(?<=[,;\n])[^,;\n]*"
JSON_VALUE = r'(?<=: )(?:"[^"]*"|\[[^\]]*\]|[^,}\]]+)|(?<=[\[,] )[^,\]]+'


@pytest.mark.parametrize("kind, fixture, cmd", [
    ("csv", "table_long.csv", ["import", "table", "{f}", "--experts", "8", "-o", "{o}"]),
    ("jsonl", "jsonl_router.jsonl", ["import", "jsonl", "{f}", "--map", "seq=problem_id,pos=token_idx,"
                                     "experts=topk_ids,weights=topk_weights,domain=dataset", "-o", "{o}"]),
])
def test_mutated_text_imports(kind, fixture, cmd, tmp_path):
    text = (FIXTURES / fixture).read_text()
    bad, out = tmp_path / f"bad.{kind}", tmp_path / "out.parquet"
    argv = [a.format(f=bad, o=out) for a in cmd]

    def make(rng):
        data = _mutate_bytes(text.encode(), rng) if rng.random() < 0.3 else _mutate_fields(
            text, rng, CELL if kind == "csv" else JSON_VALUE)
        bad.write_bytes(data)

    _fuzz(kind, make, lambda: invoke(*argv))


@pytest.mark.parametrize("cmd", [["import", "array", "{f}", "--experts", "8", "-o", "{o}"],
                                 ["import", "moe-infinity", "{f}", "--top-k", "2", "-o", "{o}"]])
def test_mutated_numpy(cmd, tmp_path):
    rng0 = np.random.default_rng(_seed("fuzz-npy-base"))
    ids = np.argsort(rng0.random((6, 2, 8)), axis=2)[:, :, :2].astype(np.int32)
    base = tmp_path / "base.npy"
    np.save(base, ids if cmd[1] == "array" else np.ones((3, 2, 8), np.float32))
    npz = tmp_path / "base.npz"
    np.savez(npz, ids=ids, weights=np.full(ids.shape, 0.5), seq=np.repeat([0, 1], 3))
    bad, out = tmp_path / "bad.npy", tmp_path / "out.parquet"

    def make(rng):
        src = npz if cmd[1] == "array" and rng.random() < 0.3 else base
        bad.write_bytes(_mutate_bytes(src.read_bytes(), rng, head=128))

    argv = [a.format(f=bad, o=out) for a in cmd]
    _fuzz(f"numpy {cmd[1]}", make, lambda: invoke(*argv))


TOML_VALUE = r"(?<== )[^\n#]+"


@pytest.mark.parametrize("preset, cmd", [
    ("hardware/rtx3090-pcie4.toml", ["hw", "show", "{f}"]),
    ("models/qwen3-30b-a3b.toml", ["models", "show", "{f}"]),
    ("engines/llama.cpp.toml", ["estimate", "--model", "qwen3-30b-a3b", "--hw", "rtx3090-pcie4", "--engine", "{f}"]),
])
def test_mutated_toml(preset, cmd, tmp_path):
    text = (REPO / "costmodel" / "presets" / preset).read_text()
    bad = tmp_path / "bad.toml"

    def make(rng):
        bad.write_bytes(_mutate_bytes(text.encode(), rng) if rng.random() < 0.3 else
                        _mutate_fields(text, rng, TOML_VALUE))

    argv = [a.format(f=bad) for a in cmd]
    _fuzz(f"toml {preset}", make, lambda: invoke(*argv))


BENCH = ("| model | size | params | backend | ngl | n_cpu_moe | test | t/s |\n"
         "| --- | ---: | ---: | --- | --: | --: | --: | --: |\n"
         "| qwen3moe 30B.A3B Q4_K - Medium | 17.28 GiB | 30.53 B | CUDA | 99 | 36 | tg128 | 36.70 ± 0.11 |\n"
         "| qwen3moe 30B.A3B Q4_K - Medium | 17.28 GiB | 30.53 B | CUDA | 99 | 20 | tg128 | 45.02 ± 0.20 |\n"
         "| qwen3moe 30B.A3B Q4_K - Medium | 17.28 GiB | 30.53 B | CUDA | 99 |  | tg128 | 60.00 ± 0.30 |\n"
         "| qwen3moe 30B.A3B Q4_K - Medium | 17.28 GiB | 30.53 B | CPU | 0 |  | tg128 | 12.00 ± 0.05 |\n")


def test_mutated_llama_bench(tmp_path):
    bad, out = tmp_path / "bench.md", tmp_path / "cal.toml"
    res = invoke("calibrate", _write(bad, BENCH), "--hw", "rtx2080-i9-10900x", "--model", "qwen3-30b-a3b", "-o", out)
    assert res.exit_code == 0, res.output

    def make(rng):
        out.unlink(missing_ok=True)
        bad.write_bytes(_mutate_bytes(BENCH.encode(), rng) if rng.random() < 0.3 else
                        _mutate_fields(BENCH, rng, r"(?<=\|)[^|\n]+(?=\|)"))

    _fuzz("llama-bench", make, lambda: invoke("calibrate", bad, "--hw", "rtx2080-i9-10900x", "--model",
                                              "qwen3-30b-a3b", "-o", out))


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
