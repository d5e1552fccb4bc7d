"""Nothing lost: kill a sweep midway, rerun the same command, only the missing configs are computed
and the results equal an uninterrupted run's."""

import re
import signal
import time

import polars as pl
import pyarrow.parquet as pq
import pytest
from sweep_helpers import run_cli, small_trace, spawn

from moesim.sweeps.store import layers_path

# 14 configs: lru (7) and freq (6: the never-cached cpu replay is kept once, under lru) x the default
# miss/admission axis, plus the llama.cpp preset
GRID = ["--budget", "0.25", "--eviction", "lru", "--eviction", "freq"]
N_CONFIGS = 14


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return small_trace(tmp_path_factory.mktemp("resume"))


@pytest.fixture(scope="module")
def reference(trace, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "full.parquet"
    res = run_cli("sweep", trace, *GRID, "-o", out, "--jobs", "1")
    assert f"{N_CONFIGS} computed, 0 already" in res.stderr
    return out


def rows_in(path):
    try:
        return pq.ParquetFile(path).metadata.num_rows
    except (FileNotFoundError, OSError):
        return 0


def interrupt_midway(trace, out, sig, jobs, at_least=3):
    """Start a slowed-down sweep, wait until some rows are flushed, send ``sig``."""
    proc = spawn("sweep", trace, *GRID, "-o", out, "--jobs", jobs, "--flush-every", "0",
                 env={"MOESIM_SWEEP_TEST_DELAY": "0.3"})
    deadline = time.monotonic() + 60
    while rows_in(out) < at_least:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "sweep flushed nothing"
        time.sleep(0.02)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def check_resumed(trace, out, reference, partial):
    before = pl.read_parquet(out)
    assert 0 < partial == before.height < N_CONFIGS
    assert set(pl.read_parquet(layers_path(out))["row_key"]) == set(before["row_key"])
    res = run_cli("sweep", trace, *GRID, "-o", out, "--jobs", "1")
    m = re.search(r"(\d+) computed, (\d+) already in ", res.stderr)
    assert (int(m.group(1)), int(m.group(2))) == (N_CONFIGS - partial, partial)
    after, want = pl.read_parquet(out), pl.read_parquet(reference)
    assert after.equals(want)  # same rows, same order, same values (derived columns included)
    assert pl.read_parquet(layers_path(out)).equals(pl.read_parquet(layers_path(reference)))
    # the rows finished before the kill were kept as they were
    kept = after.filter(pl.col("row_key").is_in(before["row_key"].to_list())).sort("row_key")
    cols = [c for c in before.columns if c not in ("rank", "pareto", "speedup", "baseline")]
    assert kept.select(cols).equals(before.sort("row_key").select(cols))


def test_sigkill_then_rerun_computes_only_the_rest(trace, reference, tmp_path):
    out = tmp_path / "r.parquet"
    code, _ = interrupt_midway(trace, out, signal.SIGKILL, jobs=1)
    assert code == -signal.SIGKILL
    check_resumed(trace, out, reference, rows_in(out))


def test_ctrl_c_saves_finished_rows_and_stops_the_workers(trace, reference, tmp_path):
    out = tmp_path / "r.parquet"
    code, err = interrupt_midway(trace, out, signal.SIGINT, jobs=2)
    assert code == 130 and "interrupted" in err and "run the same command again" in err
    assert "Traceback" not in err
    check_resumed(trace, out, reference, rows_in(out))
