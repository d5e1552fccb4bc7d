"""`moesim synth` speed: generator 2 (jitted, the default) vs generator 1 (the original numpy one), side
by side in one process, for the Qwen3-235B-A22B geometry (94 MoE layers x 128 experts, top-8, 32
candidates); tokens/s by wall clock and per CPU-second, and bytes per token.

    python benchmarks/synth_speed.py [--tokens 20000] [--old-tokens 2000] [--preset qwen3-235b-a22b]

Also generator 2 without layer coupling (knob couple = 0: the generator before coupling, same bytes) and
with the lookahead column, so the cost of each is measured in the same process.

Generator 1 runs on fewer tokens (it is slow); its rate does not depend on the length. The machine is
shared: wall-clock rates fall when other jobs run, CPU-time rates much less.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from moesim.traces.synth_presets import PRESETS
from moesim.traces.synthetic import synthesize


def run(preset: str, tokens: int, path: Path, **kw) -> tuple[float, float, int]:
    t0, c0 = time.perf_counter(), time.process_time()
    synthesize(preset, tokens, path=path, **kw)
    return time.perf_counter() - t0, time.process_time() - c0, path.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3-235b-a22b")
    ap.add_argument("--tokens", type=int, default=20000)
    ap.add_argument("--old-tokens", type=int, default=2000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="moesim-synth") as d:
        measure(args, Path(d))


def measure(args, tmp: Path) -> None:
    synthesize(args.preset, 50, path=tmp / "warm.parquet")  # compile (or load) the kernels first
    print(f"{args.preset}, {os.cpu_count()} cores")
    rows = []
    uncoupled = PRESETS[args.preset].replace(couple=0.0)
    synthesize(args.preset, 50, path=tmp / "warm.parquet", knobs=uncoupled, lookahead=True)
    for label, tokens, kw in (("generator 2, ranked (default)", args.tokens, {}),
                              ("generator 2, ranked, uncoupled", args.tokens, {"knobs": uncoupled}),
                              ("generator 2, ranked, --lookahead", args.tokens, {"lookahead": True}),
                              ("generator 2, sparse", args.tokens, {"layout": "sparse"}),
                              ("generator 1, ranked", args.old_tokens, {"generator": 1}),
                              ("generator 1, sparse (before #17)", args.old_tokens,
                               {"generator": 1, "layout": "sparse"})):
        wall, cpu, size = run(args.preset, tokens, tmp / "t.parquet", **kw)
        rows.append((label, tokens, tokens / wall, tokens / cpu, size / tokens))
        print(f"{label:34s} {tokens:6d} tokens: {tokens / wall:8,.0f} tokens/s wall, "
              f"{tokens / cpu:8,.0f} tokens per CPU-second, {size / tokens:6,.0f} B/token", flush=True)
    new, old = rows[0], rows[5]
    print(f"coupled / uncoupled: {rows[0][2] / rows[1][2]:.2f}x wall, {rows[0][3] / rows[1][3]:.2f}x CPU; "
          f"--lookahead / default: {rows[2][3] / rows[0][3]:.2f}x CPU")
    print(f"speed-up of the default over the old command: {new[2] / old[2]:.1f}x wall, {new[3] / old[3]:.1f}x CPU; "
          f"bytes {new[4] / old[4]:.2f}x")


if __name__ == "__main__":
    main()
