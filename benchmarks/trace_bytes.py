"""Bytes per token of each part of a trace, old (sparse) vs compact (ranked) encoding of the same routing,
their write and read (decode) speed, and how deep substitution looks into the candidate list.

    python benchmarks/trace_bytes.py [--preset qwen3-235b-a22b] [--tokens 20000]

Both files come from `moesim synth` with the same seed; the script checks they decode to the same arrays.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from moesim.simulator import SimConfig, simulate
from moesim.traces import load_routing
from moesim.traces.synthetic import synthesize


def column_bytes(path: Path) -> dict[str, int]:
    md = pq.ParquetFile(path).metadata
    out: dict[str, int] = {}
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        for j in range(rg.num_columns):
            c = rg.column(j)
            name = c.path_in_schema.split(".")[0]
            out[name] = out.get(name, 0) + c.total_compressed_size
    return out


def timed(fn):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def substitution_depth(routing, budgets=(0.05, 0.125, 0.25, 0.5)) -> list[str]:
    """Where in the ranked candidate list the chosen substitutes sit (1 = best-scored)."""
    lines = []
    for b in budgets:
        for ev, miss in (("lru", "substitute"), ("freq", "threshold:0.15")):
            res = simulate(routing, SimConfig(eviction=ev, miss=miss, budget=b, warm=True), record=True)
            sub = res.decisions.substitute  # [T, L, k] expert or -1
            t, l, _ = np.nonzero(sub >= 0)
            if not len(t):
                lines.append(f"  budget {b}: {ev}/{miss}: no substitutions")
                continue
            cand = routing.cand[t, l]
            depth = np.argmax(cand == sub[sub >= 0][:, None], axis=1) + 1
            q = np.percentile(depth, [50, 99, 99.9])
            lines.append(f"  budget {b}: {ev}/{miss}: {len(depth):,} substitutions, depth median {q[0]:.0f}, "
                         f"p99 {q[1]:.0f}, p99.9 {q[2]:.0f}, max {depth.max()} of M={routing.n_candidates}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3-235b-a22b")
    ap.add_argument("--tokens", type=int, default=20000)
    ap.add_argument("--depth", action="store_true", help="also measure substitution depth")
    args = ap.parse_args()
    os.environ.setdefault("MOESIM_DECODE_CACHE", "0")
    with tempfile.TemporaryDirectory(prefix="moesim-bytes") as d:
        measure(args, Path(d))


def measure(args, tmp: Path) -> None:
    T = args.tokens
    files, routings = {}, {}
    for layout in ("sparse", "ranked"):
        target = tmp / f"{layout}.parquet"
        path, wall, cpu = timed(lambda lay=layout, out=target: synthesize(args.preset, T, seed=0, path=out,
                                                                          layout=lay))
        files[layout] = path
        r, rwall, rcpu = timed(lambda p=path: load_routing(p))
        routings[layout] = r
        size = path.stat().st_size
        print(f"{layout:7s} {size / T:8.0f} B/token ({size / 1e6:.1f} MB): synth {T / wall:,.0f} tokens/s "
              f"({wall:.1f} s, {cpu:.1f} s CPU); read+decode {rwall:.1f} s ({rcpu:.1f} s CPU, "
              f"{size / 1e6 / rwall:.0f} MB/s, {r.n_tokens * r.n_layers / rwall / 1e6:.2f} M steps/s)")
        for name, b in sorted(column_bytes(path).items(), key=lambda kv: -kv[1]):
            print(f"    {name:12s} {b / T:8.1f} B/token")
    a, b = routings["sparse"], routings["ranked"]
    same = all(np.array_equal(getattr(a, n), getattr(b, n)) for n in ("sel", "w", "cand", "seq", "pos", "domain"))
    print(f"same routing: {same}; ranked / sparse bytes: "
          f"{files['ranked'].stat().st_size / files['sparse'].stat().st_size:.2f}")
    if args.depth:
        print("substitution depth (ranked candidates, warm start):")
        print("\n".join(substitution_depth(b)))


if __name__ == "__main__":
    main()
