"""Wall time of a default sweep (`moesim sweep TRACE --budget 0.25`), cold and warm, 1 vs N processes.

    python benchmarks/sweep_timing.py [TRACE] [--repeat 3] [--jobs 1,2] [--ci 95]

cold: the numba cache (~/.cache/moesim/numba) and the decoded-trace cache are deleted first, so
the run compiles the kernels and decodes the trace. warm: both caches filled, no results file (every
config is replayed). Each run is a fresh `moesim` process, as a user would start it. The load
average is printed because the machine may be shared: timings on a busy machine are upper bounds.
With --ci LEVEL every warm run is also made with `--ci LEVEL`, interleaved, and the ratio printed:
the cost of confidence intervals (docs/uncertainty.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "moesim"


def run(trace: str, out: Path, jobs: int, extra: tuple[str, ...] = ()) -> float:
    out.unlink(missing_ok=True)
    out.with_name(out.stem + ".layers.parquet").unlink(missing_ok=True)
    cmd = [sys.executable, "-c", "import sys; from moesim.cli import main; sys.argv[0] = 'moesim'; main()",
           "sweep", trace, "--budget", "0.25", "-o", str(out), "--jobs", str(jobs), *extra]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = REPO / "traces" / "qwen3next.parquet"
    ap.add_argument("trace", nargs="?", default=str(default))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--jobs", default="1,2", help="process counts to compare, e.g. 1,2")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold (compiling) run")
    ap.add_argument("--ci", default=None, metavar="LEVEL", help="also time every warm run with --ci LEVEL")
    args = ap.parse_args()
    jobs = [int(j) for j in args.jobs.split(",")]
    variants = [()] + ([("--ci", args.ci)] if args.ci else [])
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "r.parquet"
        print(f"trace {args.trace}; load average before: {os.getloadavg()[0]:.2f}")
        if not args.no_cold:
            shutil.rmtree(CACHE / "numba", ignore_errors=True)
            shutil.rmtree(CACHE / "decoded", ignore_errors=True)
            t = run(args.trace, out, max(jobs))
            print(f"cold (compile + decode), {max(jobs)} processes: {t:.2f} s")
        else:
            run(args.trace, out, max(jobs))  # make sure the caches are warm
        for v in variants[1:]:
            run(args.trace, out, max(jobs), v)  # and the code behind the variant compiled
        times: dict[tuple, list[float]] = {(j, v): [] for j in jobs for v in variants}
        for _ in range(args.repeat):
            for j in jobs:  # interleaved, so a change in the machine's load hits every setting
                for v in variants:
                    times[(j, v)].append(run(args.trace, out, j, v))
        for j in jobs:
            for v in variants:
                ts = times[(j, v)]
                ratio = ""
                if v:
                    base = statistics.median(times[(j, ())])
                    ratio = f"; {statistics.median(ts) / base:.2f}x the run without it"
                print(f"warm, {j} process(es){' ' + ' '.join(v) if v else ''}: median {statistics.median(ts):.2f} s "
                      f"(min {min(ts):.2f}, max {max(ts):.2f}, n={len(ts)}){ratio}")
        print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
