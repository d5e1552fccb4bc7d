"""Concurrent writers lose nothing: two sweeps with different grids writing one results file both keep
every row (each flush merges under a lock), and two synth runs writing one trace never share a
temporary file (the last rename wins; both exit 0, the file is whole)."""

from __future__ import annotations

import json
import re

import polars as pl
import pyarrow.parquet as pq
import pytest
from sweep_helpers import run_cli, small_trace, spawn

from moesim.sweeps.grid import grid_from_options
from moesim.sweeps.run import run_sweep
from moesim.sweeps.store import ResultStore, layers_path
from moesim.traces.routing import validate_trace


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return small_trace(tmp_path_factory.mktemp("concurrent"))


def _counts(err: str) -> tuple[int, int]:
    m = re.search(r"(\d+) configs: (\d+) computed", err)
    assert m, err
    return int(m.group(1)), int(m.group(2))


def test_two_sweeps_with_different_grids_keep_all_rows(trace, tmp_path):
    out = tmp_path / "r.parquet"
    grids = [["--budget", "0.25"], ["--budget", "0.125", "--budget", "0.5"]]
    # slowed down and flushing after every row, so that their flushes interleave
    procs = [spawn("sweep", trace, *g, "-o", out, "--jobs", "1", "--flush-every", "0",
                   env={"MOESIM_SWEEP_TEST_DELAY": "0.02"}) for g in grids]
    results = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [r[1] for r in results]
    totals = [_counts(err)[0] for _, err in results]
    rows = pl.read_parquet(out)
    assert rows.height == sum(totals) == 3 * 48  # 48 configs per budget (the default grid on a trace with scores)
    assert rows["row_key"].n_unique() == rows.height
    assert set(pl.read_parquet(layers_path(out))["row_key"]) == set(rows["row_key"])
    # rerunning either grid computes nothing: every row of both is in the file
    for g in grids:
        assert _counts(run_cli("sweep", trace, *g, "-o", out, "--jobs", "1").stderr)[1] == 0


def test_stores_merge_on_flush(trace, tmp_path):
    """Two stores opened on one file before either wrote: the second flush keeps the first's rows."""
    out = tmp_path / "r.parquet"
    a, b = ResultStore(out), ResultStore(out)
    ga = grid_from_options(budgets=[0.25], evictions=["lru"], misses=["fetch-all"], admits=["none"], presets=False)
    gb = grid_from_options(budgets=[0.5], evictions=["lru"], misses=["fetch-all"], admits=["none"], presets=False)
    ra = run_sweep(trace, ga, jobs=1)
    rb = run_sweep(trace, gb, jobs=1)
    for store, res in ((a, ra), (b, rb)):
        for row in res.rows.iter_rows(named=True):
            store.add(row, [r for r in res.layers.iter_rows(named=True) if r["row_key"] == row["row_key"]])
    a.flush()
    b.flush()
    keys = set(ra.rows["row_key"]) | set(rb.rows["row_key"])
    assert set(pl.read_parquet(out)["row_key"]) == keys
    assert set(pl.read_parquet(layers_path(out))["row_key"]) == keys
    assert set(b.rows()["row_key"]) == keys and "r.parquet" in str(b.path)


def test_two_synths_to_one_file(tmp_path):
    out = tmp_path / "t.parquet"
    procs = [spawn("synth", "--preset", "qwen3-30b-a3b", "--tokens", "600", "--seed", str(seed), "-o", out)
             for seed in (1, 2)]
    results = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [r[1] for r in results]
    assert all("Traceback" not in err for _, err in results)
    seed = json.loads(pq.read_schema(out).metadata[b"moesim"])["source"]["seed"]
    assert seed in (1, 2)
    validate_trace(out)
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]
