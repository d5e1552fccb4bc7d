"""Compile time of the replay kernels: each variant from an empty numba cache, in a fresh process.

    python benchmarks/compile_time.py [--evictions lru,lfu,...] [--skip-commands]

For every kernel variant (simulator/kernels.py: plain per eviction, the ext and engine kernels with one
eviction's hooks, and the generic ext kernel with each step rule, simulator/paths.py) a fresh process with
an empty cache directory compiles it alone: CPU seconds (user + system of that process), wall seconds, and
the bytes it wrote to the cache; then a second fresh process loads it from that cache (wall). Then the
kernels the README's default sweep needs, compiled together in one process from an empty cache (what a
fresh install pays before the first table), and the two commands end to end from an empty cache:
``moesim simulate TRACE -e lru -m fetch-all --budget 0.25`` and ``moesim sweep TRACE --budget 0.25`` (CPU
of the command and its children). Numbers move with the machine's load; run it on a quiet machine and
compare runs side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "traces" / "qwen3next.parquet"

CHILD = """
import json, resource, sys, time
t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
from moesim.simulator import kernels
t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
kernels.ensure([kernels.Variant(*v) for v in json.loads(sys.argv[1])])
t2, r2 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
cpu = lambda a, b: (b.ru_utime + b.ru_stime) - (a.ru_utime + a.ru_stime)
print(json.dumps({"import_s": t1 - t0, "cpu_s": cpu(r1, r2), "wall_s": t2 - t1}))
"""


def _env(cache: Path) -> dict:
    env = dict(os.environ, XDG_CACHE_HOME=str(cache))
    env.pop("NUMBA_CACHE_DIR", None)
    return env


def _compile(variants: list, cache: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(variants)], env=_env(cache), capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and f.suffix in (".nbc", ".nbi"))


def _command(args: list[str], cache: Path) -> tuple[float, float]:
    """(wall, CPU of the command and its children) of one command from the given cache."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(args, env=_env(cache), cwd=REPO, capture_output=True, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def default_sweep_variants() -> list:
    """The kernels the README's ``moesim sweep TRACE --budget 0.25`` runs (the grid's generic kernel and the
    hooks of every eviction in it)."""
    from moesim.simulator.args import variant_of
    from moesim.sweeps.grid import Grid, expand

    # a sweep runs every config on the generic kernel, whatever its price (simulator/kernels.py)
    return sorted({tuple(variant_of(p.config, None, generic=True)) for p in expand(Grid(budgets=[0.25]))})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--evictions", default="lru,fifo,lfu,freq,belady,static",
                    help="the evictions whose variants are measured one by one")
    ap.add_argument("--skip-commands", action="store_true", help="leave out the two commands end to end")
    args = ap.parse_args()
    from moesim.policies.registry import GENERIC
    from moesim.simulator.kernels import FAMILIES, Variant, variant
    from moesim.simulator.paths import STEP_RULES

    print(f"load average {os.getloadavg()[0]:.1f}; every row from an empty numba cache in a fresh process")
    print(f"{'variant':34} {'CPU s':>7} {'wall s':>7} {'cache KB':>9} {'load s':>7}")
    rows = []
    todo = [tuple(variant(ev, family)) for ev in args.evictions.split(",") for family in FAMILIES]
    todo += [tuple(Variant("ext", GENERIC, step)) for step in STEP_RULES if step != "none"]  # a kernel + its rule
    for v in todo:
        with tempfile.TemporaryDirectory() as d:
            r = _compile([v], Path(d))
            size = _bytes(Path(d))
            load = _compile([v], Path(d))["wall_s"]
        name = f"{v[0]} {v[1]}" + (f" + {v[2]}" if v[2] != "none" else "")
        rows.append(dict(variant=name, size_kb=size / 1024, load_s=load, **r))
        print(f"{name:34} {r['cpu_s']:7.1f} {r['wall_s']:7.1f} {size / 1024:9.0f} {load:7.2f}", flush=True)
    sweep = default_sweep_variants()
    with tempfile.TemporaryDirectory() as d:
        r = _compile(sweep, Path(d))
        size = _bytes(Path(d))
    names = ", ".join(sorted({f"{f} {h}" + (f" + step rule {st}" if st != "none" else "") for f, h, st in sweep}))
    print(f"the default sweep's {len(sweep)} kernels together ({names}): {r['cpu_s']:.1f} s CPU, "
          f"{r['wall_s']:.1f} s wall, {size / 1024:.0f} KB")
    if args.skip_commands:
        return
    moesim = str(Path(sys.executable).with_name("moesim"))
    for cmd in ([moesim, "simulate", str(TRACE), "-e", "lru", "-m", "fetch-all", "--budget", "0.25"],
                [moesim, "sweep", str(TRACE), "--budget", "0.25"]):
        with tempfile.TemporaryDirectory() as d:
            cold = _command(cmd, Path(d))
            warm = _command(cmd, Path(d))
        print(f"{' '.join(['moesim', *cmd[1:2], 'TRACE', *cmd[3:]])}: cold {cold[0]:.1f} s wall / {cold[1]:.1f} s CPU, "
              f"cached {warm[0]:.1f} s wall / {warm[1]:.1f} s CPU")


if __name__ == "__main__":
    main()
