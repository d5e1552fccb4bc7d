"""`moesim synth` speed, side by side in one process, for the Qwen3-235B-A22B geometry (94 MoE layers x
128 experts, top-8, 32 candidates): the default command (ranked layout, layers coupled), without layer
coupling (knob couple = 0: the generator before coupling, same bytes), with the lookahead column, and the
sparse layout; tokens/s by wall clock and per CPU-second (all threads of the process), bytes per token, and
the load average of the machine around each run.

    python benchmarks/synth_speed.py [--tokens 20000] [--preset qwen3-235b-a22b]
    python benchmarks/synth_speed.py --default-only --stages [--against CHECKOUT] [--rounds 3]

``--stages``: where the CPU goes, one thread (numba's threads set to 1, the generator not run ahead):
the generator (kernel, candidate sort and unpacking) and the rest (the writer's columns and checks,
Parquet/zstd, Python), in CPU seconds per 10,000 tokens, each the least of 3 runs; the sum is what one
core needs.

``--against CHECKOUT``: the same measurement (default row and stages) of another checkout of moesim (e.g.
``git worktree add /tmp/base <commit>``), each in a fresh process, alternating with this checkout for
``--rounds`` rounds, so both see the same load; the summary gives the mean ratios and each side's best
round (other jobs only ever add CPU time, so the least is the steadiest estimate). The other checkout's
sources are put first on the import path (through a temporary directory of links laid out like the
installed package).

The machine is shared: wall-clock rates fall when other jobs run, CPU-time rates much less.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def run(preset: str, tokens: int, path: Path, **kw) -> tuple[float, float, int]:
    from moesim.traces.synthetic import synthesize

    t0, c0 = time.perf_counter(), time.process_time()
    synthesize(preset, tokens, path=path, **kw)
    return time.perf_counter() - t0, time.process_time() - c0, path.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3-235b-a22b")
    ap.add_argument("--tokens", type=int, default=20000)
    ap.add_argument("--default-only", action="store_true", help="only the default command (ranked)")
    ap.add_argument("--stages", action="store_true", help="CPU per stage, one thread")
    ap.add_argument("--against", type=Path, help="another checkout of moesim, measured alternately")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one result line (for --against)
    args = ap.parse_args()
    if args.against:
        against(args)
        return
    with tempfile.TemporaryDirectory(prefix="moesim-synth") as d:
        measure(args, Path(d))


def measure(args, tmp: Path) -> None:
    from moesim.traces.synth_presets import PRESETS
    from moesim.traces.synthetic import synthesize

    synthesize(args.preset, 50, path=tmp / "warm.parquet")  # compile (or load) the kernels first
    if not args.json:
        print(f"{args.preset}, {os.cpu_count()} cores")
    rows = []
    uncoupled = PRESETS[args.preset].replace(couple=0.0)
    cases: list[tuple[str, int, dict]] = [("ranked (default)", args.tokens, {})]
    if not args.default_only:
        synthesize(args.preset, 50, path=tmp / "warm.parquet", knobs=uncoupled, lookahead=True)
        cases += [("ranked, uncoupled", args.tokens, {"knobs": uncoupled}),
                  ("ranked, --lookahead", args.tokens, {"lookahead": True}),
                  ("sparse", args.tokens, {"layout": "sparse"})]
    result: dict = {}
    for label, tokens, kw in cases:
        before = load()
        wall, cpu, size = run(args.preset, tokens, tmp / "t.parquet", **kw)
        rows.append((label, tokens, tokens / wall, tokens / cpu, size / tokens))
        result.update(wall=tokens / wall, cpu=tokens / cpu, bytes=size / tokens, load=before)
        if not args.json:
            print(f"{label:34s} {tokens:6d} tokens: {tokens / wall:8,.0f} tokens/s wall, "
                  f"{tokens / cpu:8,.0f} tokens per CPU-second, {size / tokens:6,.0f} B/token ({before})",
                  flush=True)
    if args.stages:
        result["stages"] = stages(args.preset, args.tokens, tmp)
        if not args.json:
            print_stages(result["stages"])
    if args.json:
        print(json.dumps(result))
    if args.default_only:
        return
    print(f"coupled / uncoupled: {rows[0][2] / rows[1][2]:.2f}x wall, {rows[0][3] / rows[1][3]:.2f}x CPU; "
          f"--lookahead / default: {rows[2][3] / rows[0][3]:.2f}x CPU; ranked / sparse: {rows[0][3] / rows[3][3]:.1f}x "
          f"CPU, bytes {rows[0][4] / rows[3][4]:.2f}x")


REPEATS = 3  # each stage's time is its least of this many runs: other jobs only ever add time


def best(fn, repeats: int) -> float:
    """The least CPU time (process_time) of ``repeats`` calls of fn."""
    times = []
    for _ in range(repeats):
        c0 = time.process_time()
        fn()
        times.append(time.process_time() - c0)
    return min(times)


def stages(preset: str, tokens: int, tmp: Path) -> dict:
    """CPU seconds per 10,000 tokens of each stage of the default command, on one thread (each the least
    of REPEATS runs)."""
    import numba
    import numpy as np

    from moesim.costmodel.models import load_model
    from moesim.traces import synthetic as S
    from moesim.traces.synth_presets import PRESETS

    numba.set_num_threads(1)
    ahead = S._ahead
    S._ahead = lambda chunks, depth=2: chunks  # the generator in the calling thread
    try:
        total = best(lambda: S.synthesize(preset, tokens, path=tmp / "s.parquet"), REPEATS)
    finally:
        S._ahead = ahead
    model, kn = load_model(preset), PRESETS[preset]
    L, E = len(model.moe_layers), model.n_experts
    M = min(E, kn.candidates)
    names = list(kn.default_domains) or ["general"]
    weights = np.array([kn.domain(d).weight for d in names], dtype=np.float64)
    seq, pos, dom = S.plan_tokens(tokens, 1, len(names), kn, weights, S._rng(0, "layout"))
    base = S.base_scores(0, L, E, names, kn)
    def generate():
        for _ in S._chunks_v2(base, seq, pos, dom, kn, 0, M, full=False, lse=False, weights=weights):
            pass

    gen = best(generate, REPEATS)
    per = 10000 / tokens
    return {"generator": gen * per, "rest": (total - gen) * per, "total": total * per}


def print_stages(st: dict) -> None:
    print("one thread, CPU s per 10,000 tokens: " + ", ".join(f"{k} {v:.3f}" for k, v in st.items())
          + f" -> {10000 / st['total']:,.0f} tokens per CPU-second")


def _package_links(checkout: Path, tmp: Path) -> Path:
    """A directory that imports as the checkout's moesim namespace (pyproject's package-dir as links)."""
    dirs = tomllib.loads((checkout / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    root = tmp / "moesim"
    root.mkdir(parents=True)
    for f in (checkout / dirs["moesim"]).iterdir():
        (root / f.name).symlink_to(f.resolve())
    for name, d in dirs.items():
        parts = name.split(".")
        if len(parts) == 2:
            (root / parts[1]).symlink_to((checkout / d).resolve())
    return tmp


def against(args) -> None:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--preset", args.preset, "--tokens", str(args.tokens),
           "--default-only", "--stages", "--json"]
    with tempfile.TemporaryDirectory(prefix="moesim-synth-base") as d:
        env_base = dict(os.environ, PYTHONPATH=str(_package_links(args.against.resolve(), Path(d) / "before")))
        env_this = dict(os.environ, PYTHONPATH=str(_package_links(REPO, Path(d) / "after")))
        print(f"{args.preset}, {args.tokens} tokens, {os.cpu_count()} cores; before = {args.against}, "
              f"after = {REPO}")
        res: dict[str, list] = {"before": [], "after": []}
        for r in range(args.rounds):
            for name, env in (("before", env_base), ("after", env_this)):
                out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
                x = json.loads(out.strip().splitlines()[-1])
                res[name].append(x)
                st = x["stages"]
                print(f"round {r + 1} {name:6s}: {x['wall']:7,.0f} tokens/s wall, {x['cpu']:7,.0f} tokens per "
                      f"CPU-second (2 threads), {x['bytes']:5,.0f} B/token ({x['load']}); one thread: "
                      + ", ".join(f"{k} {v:.3f}" for k, v in st.items()) + " CPU s per 10k tokens", flush=True)
        b, a = res["before"], res["after"]

        def mean(rows, key):
            return sum(x[key] if isinstance(key, str) else key(x) for x in rows) / len(rows)

        def one(x):
            return x["stages"]["total"]

        print(f"after / before (mean of {args.rounds}): wall {mean(a, 'wall') / mean(b, 'wall'):.2f}x, "
              f"CPU (2 threads) {mean(a, 'cpu') / mean(b, 'cpu'):.2f}x, "
              f"one-thread CPU {mean(b, one) / mean(a, one):.2f}x; "
              f"one thread: {10000 / mean(b, one):,.0f} -> {10000 / mean(a, one):,.0f} tokens per CPU-second")
        # the least disturbed round of each side (other jobs only ever add CPU time)
        lo = {k: (min(x["stages"][k] for x in b), min(x["stages"][k] for x in a)) for k in b[0]["stages"]
              if k in a[0]["stages"]}  # the stages both sides measure
        print("best round, one thread, CPU s per 10k tokens, before -> after: "
              + ", ".join(f"{k} {x:.3f} -> {y:.3f} ({x / y:.2f}x)" for k, (x, y) in lo.items())
              + f"; 2 threads: {max(x['cpu'] for x in b):,.0f} -> {max(x['cpu'] for x in a):,.0f} tokens per "
              "CPU-second")

if __name__ == "__main__":
    main()
