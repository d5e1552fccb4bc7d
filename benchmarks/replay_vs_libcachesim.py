"""Requests per second of moesim's kernel vs libCacheSim's C replay, same stream, same process.

    python benchmarks/replay_vs_libcachesim.py [--steps 625000] [--experts 512] [--k 8] [--capacity 128]

One layer of E experts, top-k routing with Zipf-like popularity and temporal
locality; libCacheSim replays the same flattened stream from an oracleGeneral
file (its fastest path). Each side is timed best-of-N after a warm-up run,
alternating the two so that load on a shared machine hits both alike (moesim:
the kernel alone, compiled; libCacheSim: process_trace alone, file written
beforehand). Prints requests/s and the ratio per policy, then how long a fresh
process takes to get a ready kernel (from numba's on-disk cache).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from replay_helpers import make_routing, oracle_trace  # noqa: E402

from moesim.simulator import SimConfig, simulate  # noqa: E402


def zipf_topk_routing(steps, E, k, zipf, seed):
    """Top-k of (Zipf popularity + a sticky AR(1) state + noise): k distinct experts per step."""
    rng = np.random.default_rng(seed)
    pop = -zipf * np.log(np.arange(1, E + 1))
    rng.shuffle(pop)
    sel = np.empty((steps, 1, k), np.int16)
    state = np.zeros(E)
    chunk = 4096
    for s0 in range(0, steps, chunk):
        n = min(chunk, steps - s0)
        noise = rng.gumbel(size=(n, E))
        for i in range(n):
            if i % 16 == 0:
                state = 0.9 * state + 0.45 * rng.normal(size=E)
            x = pop + state + noise[i]
            sel[s0 + i, 0] = np.argpartition(-x, k)[:k][np.argsort(-x[np.argpartition(-x, k)[:k]], kind="stable")]
    w = np.full((steps, 1, k), 1.0 / k, np.float32)
    return make_routing(sel, w, sel.copy(), np.zeros(steps, np.int32), E)


def best_of(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=625_000)
    ap.add_argument("--experts", type=int, default=512)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--capacity", type=int, default=128)
    ap.add_argument("--zipf", type=float, default=0.8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--policies", default="lru,fifo,lfu,belady,arc,s3fifo,sieve,clock")
    args = ap.parse_args()

    import libcachesim as lcs

    routing = zipf_topk_routing(args.steps, args.experts, args.k, args.zipf, 0)
    stream = routing.sel.reshape(-1).astype(np.int64)
    n = len(stream)
    tmp = Path(tempfile.mkdtemp()) / "stream.oracle"
    oracle_trace(tmp, stream)
    from moesim.policies import registry

    classes = {name: getattr(lcs, cls) for name, cls in registry.libcachesim_twins().items()}
    print(f"stream: {n:,} requests, {args.experts} experts, top-{args.k}, capacity {args.capacity}, "
          f"best of {args.repeat}")
    print(f"{'policy':8} {'libCacheSim Mreq/s':>19} {'moesim Mreq/s':>14} {'ratio':>6}  misses (equal?)")
    for policy in args.policies.split(","):
        config = SimConfig(eviction=policy, miss="fetch-all", slots=args.capacity)
        simulate(routing, config)  # compile + shared arrays

        def run_moesim(config=config):
            return simulate(routing, config)

        def run_lcs(policy=policy):
            reader = lcs.TraceReader(str(tmp), lcs.TraceType.ORACLE_GENERAL_TRACE)
            return classes[policy](cache_size=args.capacity).process_trace(reader)[0]

        run_lcs()
        t_m = t_l = float("inf")
        for _ in range(args.repeat):
            res = run_moesim()
            t_m = min(t_m, res.replay_seconds)
            dt, ratio_l = best_of(run_lcs, 1)
            t_l = min(t_l, dt)
        m_misses = res.totals()["misses"]
        l_misses = int(round(ratio_l * n))
        print(f"{policy:8} {n / t_l / 1e6:19.1f} {n / t_m / 1e6:14.1f} {t_l / t_m:6.2f}  "
              f"{m_misses} vs {l_misses} ({'yes' if m_misses == l_misses else 'NO'})")
    code = ("import time; t0 = time.perf_counter(); from moesim.simulator import driver; "
            "driver.ensure_compiled(); print(time.perf_counter() - t0)")
    secs = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    print(f"a fresh process: import + ready kernel in {secs:.2f} s (numba cache hit)")


if __name__ == "__main__":
    main()
