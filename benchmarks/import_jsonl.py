"""`moesim import jsonl` on a generated ~1M-record router log, against a plain json.loads loop.

    python benchmarks/import_jsonl.py [RECORDS]

Writes a vLLM-style log (a meta line, then one record per token and layer: problem_id, token_idx,
layer, 8 topk_ids of 64, 8 topk_weights, dataset; 16 layers, 128 tokens per problem) to a temporary
folder, then times in this process the full import (streamed parse, checks, sort, Parquet write) and,
as the baseline, a Python loop that only json.loads every line and appends the fields to lists (no
checks, no output). Prints both, their ratio, and the import's peak memory growth.
"""

from __future__ import annotations

import json
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

from moesim.traces.importers.jsonl import import_jsonl

MAP = "seq=problem_id,pos=token_idx,experts=topk_ids,weights=topk_weights,domain=dataset"


def generate(path: Path, n: int, layers: int = 16, k: int = 8, experts: int = 64) -> int:
    rnd = random.Random(0)
    written = 0
    with open(path, "w") as f:
        f.write(json.dumps({"type": "meta", "model": "allenai/OLMoE-1B-7B-0924", "top_k": k}) + "\n")
        seq = 0
        while written < n:
            for pos in range(128):
                for layer in range(layers):
                    w = sorted((rnd.random() for _ in range(k)), reverse=True)
                    f.write(json.dumps({"problem_id": seq, "token_idx": pos, "layer": layer,
                                        "topk_ids": rnd.sample(range(experts), k),
                                        "topk_weights": [round(x, 6) for x in w], "dataset": "gsm8k"}) + "\n")
                    written += 1
            seq += 1
    return written


def baseline(path: Path) -> int:
    cols = {"problem_id": [], "token_idx": [], "layer": [], "topk_ids": [], "topk_weights": []}
    with open(path, "rb") as f:
        for line in f:
            rec = json.loads(line)
            if "topk_ids" in rec:
                for key, values in cols.items():
                    values.append(rec[key])
    return len(cols["layer"])


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    tmp = Path(tempfile.mkdtemp())
    src = tmp / "router.jsonl"
    records = generate(src, n)
    print(f"{src}: {records:,} records, {src.stat().st_size / 1e6:.0f} MB")
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    res = import_jsonl([src], tmp / "router.parquet", mapping=MAP)
    t_imp = time.perf_counter() - t
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    baseline(src)
    t_base = time.perf_counter() - t
    print(res.summary())
    print(f"baseline (json.loads + lists, no checks, no output): {t_base:6.2f} s "
          f"({records / t_base / 1e3:6.0f} k rec/s)")
    print(f"moesim import jsonl (parse, check, write Parquet):   {t_imp:6.2f} s ({records / t_imp / 1e3:6.0f} k rec/s)"
          f" = {t_base / t_imp:.2f}x the baseline's speed; the import's peak RSS grew "
          f"{max(0, rss1 - rss0) / 1024:.0f} MB")


if __name__ == "__main__":
    main()
