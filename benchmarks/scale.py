"""Cost of a replay and of the default sweep against trace length: Qwen3-235B-A22B geometry (94 MoE
layers, top-8 of 128 experts, 32 scored candidates stored per row, as `moesim synth` writes it) at
10k, 100k and 1M tokens.

    python benchmarks/scale.py [--tokens 10000,100000,1000000] [--cache DIR] [--jobs 2] [--no-sweep]

Traces are generated once into DIR (default /work/scale or $MOESIM_SCALE_DIR; never the repository)
by a cheap generator of this script: per layer a Zipf(0.8) popularity over the experts, each token
keeping each of the previous token's experts with probability 0.5 (temporal locality) and drawing the
rest by popularity; candidate scores decrease with the draw order. They are SYNTHETIC (metadata
`synthetic: true`): the point is the cost of a replay, not its hit rates.

Each measurement is a fresh `moesim` process, streamed (`--stream`): `moesim simulate -e lru -m
fetch-all -b 0.25` (one config: decode into the chunk files, then replay) and `moesim sweep -b 0.25`
(the default grid: 42 configs, 35 replays). Printed per run: wall time, requests per second of wall
time, the peak RSS of the largest process (getrusage of the children) and the peak of the summed RSS
of the process tree (sampled every 0.2 s), and the machine's load average.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from numba import njit

from moesim.costmodel.models import load_model
from moesim.traces import TraceMeta, TraceWriter

PRESET = "qwen3-235b-a22b"
M = 32  # scored candidates per row, the synth preset's


@njit(cache=True)
def _block(t0, n, L, E, k, M, cum, keep, seed, prev, ids, logits):
    """Rows of tokens t0 .. t0 + n - 1 (token-major, L layers each): M distinct candidate ids in
    draw order (the first k are selected) and their decreasing logits. ``prev`` [L, k]: the previous
    token's selection, updated."""
    s = np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(t0 + 1)
    for t in range(n):
        for l in range(L):
            row = t * L + l
            used0 = np.uint64(0)
            used1 = np.uint64(0)
            m = 0
            for j in range(k):  # keep some of the previous token's experts, in their order
                s ^= s << np.uint64(13)
                s ^= s >> np.uint64(7)
                s ^= s << np.uint64(17)
                e = prev[l, j]
                if e >= 0 and (s >> np.uint64(11)) * (1.0 / 9007199254740992.0) < keep:
                    ids[row, m] = e
                    if e < 64:
                        used0 |= np.uint64(1) << np.uint64(e)
                    else:
                        used1 |= np.uint64(1) << np.uint64(e - 64)
                    m += 1
            while m < M:  # the rest by popularity, distinct
                s ^= s << np.uint64(13)
                s ^= s >> np.uint64(7)
                s ^= s << np.uint64(17)
                u = (s >> np.uint64(11)) * (1.0 / 9007199254740992.0)
                e = np.searchsorted(cum[l], u)
                if e >= E:
                    e = E - 1
                if e < 64:
                    bit = np.uint64(1) << np.uint64(e)
                    if used0 & bit:
                        continue
                    used0 |= bit
                else:
                    bit = np.uint64(1) << np.uint64(e - 64)
                    if used1 & bit:
                        continue
                    used1 |= bit
                ids[row, m] = e
                m += 1
            for j in range(M):
                logits[row, j] = 4.0 - 0.25 * j
            for j in range(k):
                prev[l, j] = ids[row, j]


def generate(path: Path, tokens: int, seed: int = 0, seqs: int = 8) -> Path:
    """Write a SYNTHETIC trace of ``tokens`` tokens with Qwen3-235B-A22B geometry."""
    model = load_model(PRESET)
    L, E, k = len(model.moe_layers), model.n_experts, model.top_k
    assert E <= 128
    rng = np.random.default_rng(seed)
    pop = 1.0 / np.arange(1, E + 1) ** 0.8
    cum = np.stack([np.cumsum(rng.permutation(pop)) for _ in range(L)])
    cum /= cum[:, -1:]
    meta = TraceMeta(model_id=model.hf_id or model.name, family=model.family, n_experts=E, top_k=k,
                     moe_layers=model.moe_layers, gating=model.gating, norm_topk_prob=model.norm_topk_prob,
                     layout="sparse", n_candidates=M, synthetic=True,
                     tracer={"name": "benchmarks/scale.py", "version": "1"},
                     source={"note": "synthetic routing for a cost benchmark (Zipf 0.8 popularity, previous token's "
                                     "experts kept with p=0.5); not recorded from the model", "tokens": tokens,
                             "seed": seed})
    layers = np.asarray(model.moe_layers, np.int16)
    prev = np.full((L, k), -1, np.int64)
    per_seq = -(-tokens // seqs)
    chunk = 2048
    tmp = path.with_name(path.name + ".gen")
    with TraceWriter(tmp, meta) as wr:
        for t0 in range(0, tokens, chunk):
            n = min(chunk, tokens - t0)
            ids = np.empty((n * L, M), np.int16)
            logits = np.empty((n * L, M), np.float32)
            _block(t0, n, L, E, k, M, cum, 0.5, seed, prev, ids, logits)
            tok = np.arange(t0, t0 + n)
            lse = np.log(np.exp(logits.astype(np.float64)).sum(axis=1) + (E - M) * np.exp(logits[:, -1] - 1.0))
            wr.write(seq=np.repeat(tok // per_seq, L), pos=np.repeat(tok % per_seq, L), layer=np.tile(layers, n),
                     phase="decode", top_ids=ids, top_logits=logits, lse=lse.astype(np.float32))
    os.replace(tmp, path)
    return path


class TreeRss:
    """Peak of the summed RSS of a process and its descendants, sampled."""

    def __init__(self, pid: int, every: float = 0.2):
        self.pid, self.every, self.peak = pid, every, 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _tree(self) -> list[int]:
        out, todo = [], [self.pid]
        while todo:
            p = todo.pop()
            out.append(p)
            try:
                for task in os.listdir(f"/proc/{p}/task"):
                    with open(f"/proc/{p}/task/{task}/children") as f:
                        todo += [int(c) for c in f.read().split()]
            except OSError:
                pass
        return out

    def _run(self):
        while not self._stop.is_set():
            total = 0
            for p in self._tree():
                try:
                    with open(f"/proc/{p}/statm") as f:
                        total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
                except OSError:
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(self.every)

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        return self.peak


def measure(args: list[str]) -> tuple[float, int, int]:
    """Run `moesim ARGS` in a fresh process: (wall seconds, peak summed RSS of its process tree, peak RSS
    of its largest process as /usr/bin/time reports it), bytes."""
    with tempfile.NamedTemporaryFile("r") as maxrss:
        cmd = ["/usr/bin/time", "-f", "%M", "-o", maxrss.name, sys.executable, "-c",
               "import sys; from moesim.cli import main; sys.argv[0] = 'moesim'; main()", *args]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        rss = TreeRss(proc.pid)
        _, err = proc.communicate()
        wall = time.perf_counter() - t0
        tree = rss.stop()
        if proc.returncode != 0:
            raise SystemExit(f"moesim {' '.join(args)} failed:\n{err}")
        largest = int(maxrss.read().split()[-1]) * 1024
    return wall, tree, largest


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="10000,100000,1000000")
    ap.add_argument("--cache", default=os.environ.get("MOESIM_SCALE_DIR", "/work/scale"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--no-sweep", action="store_true")
    args = ap.parse_args()
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    model = load_model(PRESET)
    L, k = len(model.moe_layers), model.top_k
    print(f"{'tokens':>9} {'requests':>13} {'run':>14} {'wall s':>8} {'Mreq/s':>7} {'peak RSS tree':>14} "
          f"{'largest proc':>13} {'load':>5}")
    for T in [int(x) for x in args.tokens.split(",")]:
        path = cache / f"qwen3-235b-geometry-{T}.parquet"
        if not path.exists():
            t0 = time.perf_counter()
            generate(path, T)
            print(f"# generated {path} ({path.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - t0:.0f} s",
                  flush=True)
        n_req = T * L * k
        runs = [("simulate lru", ["simulate", str(path), "-e", "lru", "-m", "fetch-all", "-b", "0.25", "--stream",
                                  "--format", "json"])]
        if not args.no_sweep:
            with tempfile.TemporaryDirectory() as d:
                runs.append(("default sweep", ["sweep", str(path), "-b", "0.25", "--stream", "--jobs",
                                               str(args.jobs), "-o", str(Path(d) / "r.parquet")]))
                _report(T, n_req, runs)
        else:
            _report(T, n_req, runs)


def _report(T, n_req, runs):
    for name, argv in runs:
        load = os.getloadavg()[0]
        wall, tree, largest = measure(argv)
        print(f"{T:>9,} {n_req:>13,} {name:>14} {wall:>8.1f} {n_req / wall / 1e6:>7.1f} {tree / 2**30:>11.2f} GiB "
              f"{largest / 2**30:>9.2f} GiB {load:>5.1f}", flush=True)


if __name__ == "__main__":
    main()
