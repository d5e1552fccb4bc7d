"""Nothing lost, round two: no output of any command replaces or deletes a file the command read (a trace
found through the results, a --prefetch-train trace, a quality file) or a file it did not write (a foreign
file at a side file's name, a file beside an earlier report). One test per data-loss case of issue 33."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from quality_helpers import write_quality
from sweep_helpers import small_trace

from moesim import files
from moesim.cli import cli
from moesim.errors import MoesimError

LRU = ["-e", "lru", "-m", "fetch-all", "--budget", "0.25"]
NEXT_LAYER = ["--prefetch", "next-layer", "--prefetch-train"]


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    return small_trace(tmp_path_factory.mktemp("inputs"))


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def refused(res, pattern: str, *kept: tuple[Path, bytes]) -> None:
    """exit 2 with one 'moesim: error:' line holding ``pattern``; every (file, bytes) of ``kept`` unchanged."""
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("moesim: error: ") and pattern in lines[0], res.stderr
    for path, data in kept:
        assert path.read_bytes() == data, f"{path} changed"


def keep(path: Path) -> tuple[Path, bytes]:
    return path, path.read_bytes()


def earlier_report(directory: Path, *names: str) -> None:
    """A directory that looks like an earlier report whose report.json names ``names`` (so it may be replaced)."""
    directory.mkdir(exist_ok=True)
    charts = {f"c{i}": {"png": n, "svg": n, "spec": n} for i, n in enumerate(names)}
    (directory / "report.json").write_text(json.dumps({"files": {"html": "index.html", "charts": charts,
                                                                 "tables": {}}}))


# ---------------------------------------------------------------------------------------------- report -o DIR


def test_report_keeps_the_trace_its_results_name(trace, tmp_path):
    """The sweep recorded its trace's path; the report reads it from there. It lies inside -o DIR, whose old
    report.json even names it: replacing DIR would delete it."""
    rep = tmp_path / "rep"
    earlier_report(rep, "t.parquet")
    inside = shutil.copyfile(trace, rep / "t.parquet")
    assert invoke("sweep", inside, *LRU, "-o", tmp_path / "r.parquet").exit_code == 0
    refused(invoke("report", tmp_path / "r.parquet", "-o", rep), "is an input of this command", keep(inside))


def test_report_keeps_a_quality_file_inside_its_directory(tmp_path):
    rep = tmp_path / "rep"
    earlier_report(rep, "q.parquet")
    q = write_quality(rep / "q.parquet")
    refused(invoke("report", "--quality", q, "-o", rep), "is an input of this command", keep(q))
    refused(invoke("report", q, "-o", rep), "is an input of this command", keep(q))  # read as --quality


def test_sweep_report_keeps_its_prefetch_train_trace(trace, tmp_path):
    rep = tmp_path / "rep"
    earlier_report(rep, "train.parquet")
    train = shutil.copyfile(trace, rep / "train.parquet")
    res = invoke("sweep", trace, *LRU, *NEXT_LAYER, train, "--report", rep)
    refused(res, "is an input of this command", keep(train))


def test_report_never_deletes_a_file_it_did_not_write(trace, tmp_path):
    rep = tmp_path / "rep"
    earlier_report(rep)
    (rep / "thesis.tex").write_text("precious")
    refused(invoke("report", "--trace", trace, "-o", rep), "holds files the earlier report did not write",
            keep(rep / "thesis.tex"))


# ---------------------------------------------------------------------------------------------- side files


def test_sweep_side_file_never_replaces_a_foreign_file(trace, tmp_path):
    side = tmp_path / "r.layers.parquet"  # no r.parquet: not the side file of earlier results
    side.write_text("my notes, not a sweep's")
    refused(invoke("sweep", trace, *LRU, "-o", tmp_path / "r.parquet"), "not the per-layer file", keep(side))
    assert not (tmp_path / "r.parquet").exists()


def test_sweep_side_file_never_replaces_its_prefetch_train_trace(trace, tmp_path):
    train = shutil.copyfile(trace, tmp_path / "r.layers.parquet")
    res = invoke("sweep", trace, *LRU, *NEXT_LAYER, train, "-o", tmp_path / "r.parquet")
    refused(res, "is an input of this command", keep(train))


def test_sweep_side_file_never_replaces_its_quality_input(trace, tmp_path):
    q = write_quality(tmp_path / "r.layers.parquet")
    refused(invoke("sweep", trace, *LRU, "--quality", q, "-o", tmp_path / "r.parquet"), "is an input of this command",
            keep(q))


@pytest.mark.parametrize("alias", ["same", "hard link", "symlink"])
def test_simulate_per_token_never_replaces_its_prefetch_train_trace(alias, trace, tmp_path):
    train = shutil.copyfile(trace, tmp_path / "train.parquet")
    out = train
    if alias == "hard link":
        os.link(train, out := tmp_path / "alias.parquet")
    elif alias == "symlink":
        (out := tmp_path / "alias.parquet").symlink_to(train)
    res = invoke("simulate", trace, "-b", "0.25", *NEXT_LAYER, train, "--per-token", out)
    refused(res, "is an input of this command", keep(train))


def test_mrc_side_file_never_replaces_a_foreign_file(trace, tmp_path):
    side = tmp_path / "c.layers.csv"
    side.write_text("a,b\n1,2\n")
    refused(invoke("mrc", trace, "-e", "lru", "-o", tmp_path / "c.csv"), "not the per-layer file of moesim mrc",
            keep(side))
    assert not (tmp_path / "c.csv").exists()
    side.unlink()
    assert invoke("mrc", trace, "-e", "lru", "-o", tmp_path / "c.csv").exit_code == 0
    assert invoke("mrc", trace, "-e", "lru", "-o", tmp_path / "c.csv").exit_code == 0  # its own: replaced


# ---------------------------------------------------------------------------------------------- the library


def test_every_file_read_is_an_input_while_tracking(trace, tmp_path):
    copy = shutil.copyfile(trace, tmp_path / "t.parquet")
    files.regular_file(copy)
    files.check_output(copy)  # not tracking: a library caller names its inputs itself
    with files.tracking_inputs():
        files.regular_file(copy)
        with pytest.raises(MoesimError, match="is an input"):
            files.check_output(copy)
        with pytest.raises(MoesimError, match="is an input"):
            files.check_output(tmp_path, directory=True)
        files.check_output(tmp_path / "other.parquet")
    files.check_output(copy)
