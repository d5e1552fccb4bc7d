"""Requests per second of moesim's kernel vs libCacheSim's C replay, same stream, same process.

    python benchmarks/replay_vs_libcachesim.py [--steps 625000] [--experts 512] [--k 8] [--capacity 128]
                                               [--policies lru,fifo,...] [--clock cpu|wall] [--processes N]

Policies without a libCacheSim twin (lfuda, lcp, lfru: libCacheSim has no such rule; its LFUDA is another
one) get a row of moesim's speed alone (``--alone``). ``--second-touch lru,...`` adds rows ``lru+2t``: moesim's
``--admission second-touch`` (the ext kernel) against libCacheSim's policy with its BloomFilterAdmissioner, the
same rule under fetch-all from a cold start (docs/replay-semantics.md).

One layer of E experts, top-k routing with Zipf-like popularity and temporal
locality; libCacheSim replays the same flattened stream from an oracleGeneral
file (its fastest path). Each side is timed best-of-N after a warm-up run,
alternating the two so that load on a shared machine hits both alike (moesim:
the kernel alone, compiled; libCacheSim: process_trace alone, file written
beforehand), by default in CPU time of this thread (steadier than elapsed time
when other jobs load the machine). Prints requests/s and the ratio per policy,
then how long a fresh process takes to get a ready kernel (from numba's on-disk
cache). libCacheSim's own speed moves by up to ~1.9x from one process to the next
(with the same stream and the same cache sizes), so ``--processes N`` runs the
whole comparison in N fresh processes, one after another, and prints each
policy's ratio per process and their median, minimum and maximum.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from replay_helpers import libcachesim_cache, make_routing, oracle_trace  # noqa: E402

from moesim.policies import registry  # noqa: E402
from moesim.simulator import SimConfig, kernels, simulate  # noqa: E402
from moesim.simulator.args import build  # noqa: E402
from moesim.simulator.counters import MISSES  # noqa: E402


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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=625_000)
    ap.add_argument("--experts", type=int, default=512)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--capacity", type=int, default=128)
    ap.add_argument("--zipf", type=float, default=0.8)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--policies", default=",".join(registry.libcachesim_twins()),
                    help="default: every eviction whose module names a libCacheSim twin")
    ap.add_argument("--alone", default="lfuda,lcp,lfru",
                    help="evictions without a libCacheSim twin, timed on moesim's side only ('' for none)")
    ap.add_argument("--second-touch", default="lru",
                    help="evictions also timed with --admission second-touch against libCacheSim's Bloom-filter "
                         "admissioner (rows POLICY+2t; '' for none)")
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                    help="cpu: this thread's CPU time (steadier on a shared machine); wall: elapsed time")
    ap.add_argument("--processes", type=int, default=1,
                    help="run the comparison in this many fresh processes and summarize the ratios")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one process's rows, for --processes
    args = ap.parse_args()
    if args.processes > 1:
        return across_processes(args)

    import libcachesim as lcs

    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    routing = zipf_topk_routing(args.steps, args.experts, args.k, args.zipf, 0)
    stream = routing.sel.reshape(-1).astype(np.int64)
    n = len(stream)
    tmp = Path(tempfile.mkdtemp()) / "stream.oracle"
    oracle_trace(tmp, stream)
    twins = registry.libcachesim_twins()
    say = (lambda *a, **k: None) if args.json else print
    say(f"stream: {n:,} requests, {args.experts} experts, top-{args.k}, capacity {args.capacity}, "
        f"best of {args.repeat}, {args.clock} time; load average {os.getloadavg()[0]:.1f}")
    say(f"{'policy':8} {'libCacheSim Mreq/s':>19} {'moesim Mreq/s':>14} {'ratio':>6}  misses (equal?)")
    alone = [p for p in args.alone.split(",") if p]
    rows = [(p, p, "always") for p in [p for p in args.policies.split(",") if p] + alone]
    rows += [(f"{p}+2t", p, "second-touch") for p in args.second_touch.split(",") if p]
    for label, policy, admission in rows:
        config = SimConfig(eviction=policy, miss="fetch-all", slots=args.capacity, admission=admission)
        simulate(routing, config)  # compile + shared arrays

        def run_moesim(config=config):
            prep = build(routing, config)  # fresh state; the routing's derived arrays are shared
            replay = kernels.kernel(prep.variant)
            t0 = clock()
            replay(*prep.args)
            return clock() - t0, int(prep.args.out.layer_counts[:, MISSES].sum())

        def run_lcs(policy=policy, admission=admission):
            reader = lcs.TraceReader(str(tmp), lcs.TraceType.ORACLE_GENERAL_TRACE)
            # libCacheSim's default hash table (2^24 buckets), as every row before; CAR from its C init
            admissioner = lcs.BloomFilterAdmissioner() if admission != "always" else None
            cache = libcachesim_cache(policy, args.capacity, hashpower=24, admissioner=admissioner)
            t0 = clock()
            ratio = cache.process_trace(reader)[0]
            return clock() - t0, int(round(ratio * n))

        twin = policy in twins
        if twin:
            run_lcs()
        t_m = t_l = float("inf")
        for _ in range(args.repeat):  # alternated, so a change in the machine's load hits both
            dt, m_misses = run_moesim()
            t_m = min(t_m, dt)
            if twin:
                dt, l_misses = run_lcs()
                t_l = min(t_l, dt)
        if args.json:
            if twin:
                print(json.dumps(dict(policy=label, lcs=n / t_l, moesim=n / t_m, equal=m_misses == l_misses)),
                      flush=True)
            continue
        if not twin:
            print(f"{label:8} {'-':>19} {n / t_m / 1e6:14.1f} {'-':>6}  {m_misses} (no libCacheSim twin)", flush=True)
            continue
        print(f"{label:8} {n / t_l / 1e6:19.1f} {n / t_m / 1e6:14.1f} {t_l / t_m:6.2f}  "
              f"{m_misses} vs {l_misses} ({'yes' if m_misses == l_misses else 'NO'})", flush=True)
    if args.json:
        return
    code = ("import time; t0 = time.perf_counter(); from moesim.simulator import kernels; "
            "kernels.ensure([kernels.variant('lru', 'plain')]); print(time.perf_counter() - t0)")
    secs = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    print(f"a fresh process: import + ready kernel in {secs:.2f} s (numba cache hit)")


def across_processes(args):
    """The comparison in args.processes fresh processes in turn; each policy's ratio per process and summary."""
    import statistics

    rows: dict[str, list[dict]] = {}
    print(f"{args.processes} fresh processes, one after another; load average {os.getloadavg()[0]:.1f} at start",
          flush=True)
    for p in range(args.processes):
        # the last --processes wins, whatever form the first one took
        child = [sys.executable, __file__, *sys.argv[1:], "--processes", "1", "--json"]
        out = subprocess.run(child, capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"process {p + 1} failed:\n{out.stderr}")
        for line in out.stdout.splitlines():
            row = json.loads(line)
            rows.setdefault(row["policy"], []).append(row)
        print(f"  process {p + 1}: " + ", ".join(f"{k} {v[-1]['moesim'] / v[-1]['lcs']:.2f}" for k, v in rows.items()),
              flush=True)
    print(f"{'policy':8} {'ratio median':>12} {'min':>6} {'max':>6}  {'libCacheSim Mreq/s':>19}  "
          f"{'moesim Mreq/s':>14}  misses equal")
    for policy, runs in rows.items():
        ratios = [r["moesim"] / r["lcs"] for r in runs]
        lcs = [r["lcs"] / 1e6 for r in runs]
        ms = [r["moesim"] / 1e6 for r in runs]
        print(f"{policy:8} {statistics.median(ratios):12.2f} {min(ratios):6.2f} {max(ratios):6.2f}  "
              f"{min(lcs):8.1f} - {max(lcs):8.1f}  {min(ms):6.1f} - {max(ms):5.1f}  "
              f"{'yes' if all(r['equal'] for r in runs) else 'NO'}")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
