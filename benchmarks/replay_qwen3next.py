"""Replay time of one config on a 10,000-token Qwen3-Next-sized trace (48 layers x top-10 of 512 = 4.8 M requests).

    python benchmarks/replay_qwen3next.py [TRACE]

Without TRACE it synthesizes one (moesim synth --preset qwen3-next-80b-a3b --tokens 10000 --seqs 8) into a
temporary file. Prints the kernel's wall time (best of 3, compiled) per policy at a 25% budget, unpriced and
priced on the default machine.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from moesim.costmodel.pricing import cost_for_trace
from moesim.simulator import SimConfig, simulate
from moesim.traces import load_routing
from moesim.traces.synthetic import synthesize

CONFIGS = [("lru", "fetch-all", None), ("fifo", "fetch-all", None), ("lfu", "fetch-all", None),
           ("freq", "fetch-all", None), ("belady", "fetch-all", None), ("freq", "threshold:0.15", 0.5),
           ("freq", "first-choice", 0.5), ("static", "cpu", None)]


def main():
    if len(sys.argv) > 1:
        path = Path(sys.argv[1])
    else:
        path = Path(tempfile.mkdtemp()) / "qwen3next-10k.parquet"
        synthesize("qwen3-next-80b-a3b", 10_000, seqs=8, seed=0, path=path)
    routing = load_routing(path)
    cost, note = cost_for_trace(routing.meta)
    print(f"{path}: {routing.n_tokens} tokens, {routing.sel.size:,} requests; priced as {note}")
    for eviction, miss, admit in CONFIGS:
        config = SimConfig(eviction=eviction, miss=miss, admit=admit, budget=0.25)
        row = []
        for c in (None, cost):
            best = min(simulate(routing, config, cost=c).replay_seconds for _ in range(3))
            row.append(f"{best:6.3f} s ({routing.sel.size / best / 1e6:5.1f} M req/s)")
        print(f"{config.label():45} unpriced {row[0]}   priced {row[1]}")


if __name__ == "__main__":
    main()
