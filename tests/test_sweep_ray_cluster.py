"""A sweep on a real two-node Ray cluster (`ray start --head` plus a worker node, both on a loopback
address of this machine, each with its own raylet and object store) gives the local run's rows."""

import polars as pl
import pytest
from ray_cluster import RAY_ENV, local_cluster, wait_for_nodes
from sweep_helpers import run_cli, small_trace

from moesim.sweeps.store import layers_path

ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'moesim[ray]'")


def test_two_node_cluster_rows_equal_the_local_run(tmp_path, monkeypatch):
    trace = small_trace(tmp_path)
    grid = ["--budget", "0.25", "-e", "lru", "-e", "fifo", "-m", "fetch-all", "-m", "threshold:0.15",
            "--hw", "rtx3090-pcie4"]
    local = tmp_path / "local.parquet"
    run_cli("sweep", trace, *grid, "-o", local, "--jobs", "1")
    if ray.is_initialized():  # another module's local cluster
        ray.shutdown()
    with local_cluster(nodes=2, cpus_per_node=1) as address:
        for name, value in RAY_ENV.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("RAY_ADDRESS", address)
        ray.init(address=address, log_to_driver=False, logging_level="ERROR")
        try:
            wait_for_nodes(2)
            on_ray = tmp_path / "ray.parquet"
            res = run_cli("sweep", trace, *grid, "-o", on_ray, "--executor", "ray")
        finally:
            ray.shutdown()
    a, b = pl.read_parquet(local), pl.read_parquet(on_ray)
    assert a["row_key"].sort().to_list() == b["row_key"].sort().to_list()
    assert b.sort("row_key").equals(a.sort("row_key"))  # identical counters, seconds, ranks
    assert pl.read_parquet(layers_path(on_ray)).sort("row_key", "layer").equals(
        pl.read_parquet(layers_path(local)).sort("row_key", "layer"))
    # both nodes replayed; the trace went into the object store once
    assert "on 2 node(s)" in res.stderr and "1 trace object(s)" in res.stderr, res.stderr
