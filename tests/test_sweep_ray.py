"""--executor ray: configs run as Ray tasks on a local cluster; results merge into the same keyed
Parquet as a local run's and are identical to it."""

import polars as pl
import pytest
from sweep_helpers import run_cli, small_trace

from moesim.sweeps.store import layers_path

ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'moesim[ray]'")


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


def test_ray_merges_into_the_local_results(cluster, tmp_path):
    trace = small_trace(tmp_path)
    grid = ["--budget", "0.25", "-e", "lru", "-e", "belady"]
    local = tmp_path / "local.parquet"
    run_cli("sweep", trace, *grid, "-o", local, "--jobs", "1")
    # half the grid locally, then the whole grid on Ray into the same file: only the rest runs on Ray
    mixed = tmp_path / "mixed.parquet"
    run_cli("sweep", trace, "--budget", "0.25", "-e", "lru", "-o", mixed, "--jobs", "1")
    n_lru = pl.read_parquet(mixed).height
    res = run_cli("sweep", trace, *grid, "-o", mixed, "--executor", "ray")
    total = pl.read_parquet(local).height
    assert f"{total - n_lru} computed, {n_lru} already" in res.stderr
    assert pl.read_parquet(mixed).equals(pl.read_parquet(local))
    assert pl.read_parquet(layers_path(mixed)).equals(pl.read_parquet(layers_path(local)))
    assert ray.is_initialized()  # a cluster the caller started is left running


def test_mrc_replays_on_ray(cluster, tmp_path):
    from moesim.sweeps.mrc import mrc

    trace = small_trace(tmp_path)
    on_ray, _ = mrc(trace, evictions=["fifo", "belady"], slots=[8, 16], executor="ray")
    local, _ = mrc(trace, evictions=["fifo", "belady"], slots=[8, 16], jobs=1)
    assert on_ray.equals(local)


def test_ray_sweep_with_intervals_equals_a_local_one(cluster, tmp_path):
    trace = small_trace(tmp_path, seqs=4)
    grid = ["--budget", "0.25", "-e", "lru", "-e", "freq", "--ci", "95"]
    local, on_ray = tmp_path / "local.parquet", tmp_path / "ray.parquet"
    run_cli("sweep", trace, *grid, "-o", local, "--jobs", "1")
    run_cli("sweep", trace, *grid, "-o", on_ray, "--executor", "ray")
    a, b = pl.read_parquet(local), pl.read_parquet(on_ray)
    assert a["hit_rate_low"].is_not_null().all() and a.equals(b)
