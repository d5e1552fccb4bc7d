"""A sweep on a real two-node Ray cluster (`ray start --head` plus a worker node, both on a loopback
address of this machine, each with its own raylet and object store) gives the local run's rows."""

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from ray_cluster import RAY_ENV, local_cluster
from sweep_helpers import MOESIM, run_cli, small_trace

from moesim.sweeps.store import layers_path

ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'moesim[ray]'")


WAIT = """
import ray, sys
sys.path.insert(0, sys.argv[1])
from ray_cluster import wait_for_nodes
ray.init(address=sys.argv[2], log_to_driver=False, logging_level="ERROR")
wait_for_nodes(2)
"""


def test_two_node_cluster_rows_equal_the_local_run(tmp_path):
    trace = small_trace(tmp_path)
    grid = ["--budget", "0.25", "-e", "lru", "-e", "fifo", "-m", "fetch-all", "-m", "threshold:0.15",
            "--hw", "rtx3090-pcie4"]
    local = tmp_path / "local.parquet"
    run_cli("sweep", trace, *grid, "-o", local, "--jobs", "1")
    on_ray = tmp_path / "ray.parquet"
    with local_cluster(nodes=2, cpus_per_node=1) as address:
        # the drivers are fresh processes, as `RAY_ADDRESS=... moesim sweep` is (Ray keeps per-process
        # state, e.g. its authentication mode, from any earlier ray.init in this test process)
        env = {**os.environ, **RAY_ENV, "RAY_ADDRESS": address}
        subprocess.run([sys.executable, "-c", WAIT, str(Path(__file__).parent), address], env=env, check=True,
                       timeout=120)
        res = subprocess.run(MOESIM + ["sweep", str(trace), *grid, "-o", str(on_ray), "--executor", "ray"],
                             env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
    a, b = pl.read_parquet(local), pl.read_parquet(on_ray)
    assert a["row_key"].sort().to_list() == b["row_key"].sort().to_list()
    assert b.sort("row_key").equals(a.sort("row_key"))  # identical counters, seconds, ranks
    assert pl.read_parquet(layers_path(on_ray)).sort("row_key", "layer").equals(
        pl.read_parquet(layers_path(local)).sort("row_key", "layer"))
    # both nodes replayed; the trace went into the object store once
    assert "on 2 node(s)" in res.stderr and "1 trace object(s)" in res.stderr, res.stderr
