"""A sweep on a two-node Ray cluster started on this machine vs the local executor: wall time, rows
equal, and what moved (the trace object once per node: each node's object store holds one copy).

    python benchmarks/ray_cluster.py [TRACE] [--nodes 2]

Without TRACE a 2,000-token Qwen3-30B-A3B synthetic trace is written to a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import polars as pl  # noqa: E402
import ray  # noqa: E402
from ray_cluster import RAY_ENV, local_cluster, wait_for_nodes  # noqa: E402

from moesim.sweeps.executors import ray_summary, routing_nbytes  # noqa: E402
from moesim.sweeps.grid import grid_from_options  # noqa: E402
from moesim.sweeps.run import run_sweep  # noqa: E402
from moesim.traces.decode_cache import load_decoded  # noqa: E402


def loopback_bytes() -> int:
    """Bytes received on the loopback interface so far (Linux): the cluster's traffic, since its nodes
    talk over a loopback address (other programs' loopback traffic adds noise)."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            return int(rest.split()[0])
    return 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", nargs="?")
    ap.add_argument("--nodes", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="moesim-ray-bench") as d:
        measure(args, Path(d))


def measure(args, tmp: Path) -> None:
    trace = args.trace
    if trace is None:
        from moesim.traces.synthetic import synthesize

        trace = str(synthesize("qwen3-30b-a3b", 2000, seqs=2, path=tmp / "t.parquet"))
    grid = grid_from_options(None, budgets=[0.25], evictions=["lru", "fifo", "lfu", "belady"],
                             misses=["fetch-all", "threshold:0.15", "substitute"], hws=["rtx3090-pcie4"])
    print(f"trace {trace}: {routing_nbytes(load_decoded(trace)) / 1e6:.1f} MB decoded")
    t0 = time.perf_counter()
    local = run_sweep([trace], grid, output=tmp / "local.parquet", jobs=args.nodes)
    t_local = time.perf_counter() - t0
    print(f"local executor ({args.nodes} processes): {len(local.rows)} configs in {t_local:.1f} s", flush=True)
    for k, v in RAY_ENV.items():
        os.environ[k] = v
    t0 = time.perf_counter()
    with local_cluster(nodes=args.nodes, cpus_per_node=1) as address:
        ray.init(address=address, log_to_driver=False, logging_level="ERROR")
        wait_for_nodes(args.nodes)
        print(f"cluster of {args.nodes} nodes up in {time.perf_counter() - t0:.1f} s", flush=True)
        lo = loopback_bytes()
        t0 = time.perf_counter()
        on_ray = run_sweep([trace], grid, output=tmp / "ray.parquet", executor="ray")
        t_ray = time.perf_counter() - t0
        print(f"ray executor: {len(on_ray.rows)} configs in {t_ray:.1f} s", flush=True)
        print(ray_summary(on_ray.executor_stats), flush=True)
        moved = (loopback_bytes() - lo) / 1e6
        size = on_ray.executor_stats["trace_bytes"] / 1e6
        print(f"loopback traffic during the sweep: {moved:.1f} MB (trace {size:.1f} MB; shipping it with each of "
              f"the {on_ray.executor_stats['tasks']} tasks would move {size * on_ray.executor_stats['tasks']:.1f} MB)",
              flush=True)
        ray.shutdown()
    same = local.rows.sort("row_key").drop("rank").equals(on_ray.rows.sort("row_key").drop("rank"))
    same_files = pl.read_parquet(tmp / "local.parquet").sort("row_key").equals(
        pl.read_parquet(tmp / "ray.parquet").sort("row_key"))
    print(f"rows equal: {same and same_files}")


if __name__ == "__main__":
    main()
