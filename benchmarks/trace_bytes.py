"""Bytes per token of each part of a trace, full (sparse) vs compact (ranked) encoding of the same routing,
their write and read (decode) speed, and how deep substitution looks into the candidate list.

    python benchmarks/trace_bytes.py [--preset qwen3-235b-a22b] [--tokens 20000] [--encodings] [--depth]

Both files come from `moesim synth` with the same seed; the script checks they decode to the same arrays,
the candidates' logits included. ``--encodings``: the encodings of the ranked ids and the candidate logits
that were considered for the ranked layout, column by column on the same rows (B/token, CPU s per 10,000
tokens to write and to read each column, the least of 3 runs; docs/trace-format.md, "Bytes").
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
    ap.add_argument("--encodings", action="store_true", help="also the id and logit encodings considered")
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
    same = all(np.array_equal(getattr(a, n), getattr(b, n))
               for n in ("sel", "w", "cand", "logits", "seq", "pos", "domain"))
    print(f"same routing: {same}; ranked / sparse bytes: "
          f"{files['ranked'].stat().st_size / files['sparse'].stat().st_size:.2f}")
    if args.encodings:
        encodings(files["sparse"], T)
    if args.depth:
        print("substitution depth (ranked candidates, warm start):")
        print("\n".join(substitution_depth(b)))


def encodings(sparse: Path, T: int) -> None:
    """Each considered encoding of the ranked ids and the candidate logits, on the sparse file's rows (its
    candidates are in rank order), one column at a time."""
    import io

    import pyarrow as pa

    t = pq.read_table(sparse, columns=["top_ids", "top_logits"])
    M = t.schema.field("top_ids").type.list_size
    ids = t.column("top_ids").combine_chunks().flatten().to_numpy().astype(np.int16).reshape(-1, M)
    x = t.column("top_logits").combine_chunks().flatten().to_numpy().reshape(-1, M)
    grid = 1 / 32
    q = np.rint(x.astype(np.float64) / grid).astype(np.int64)
    exact = np.array_equal(q * grid, x.astype(np.float64))

    def binary(a):
        a = np.ascontiguousarray(a).view(np.uint8).reshape(len(a), -1)
        return pa.FixedSizeBinaryArray.from_buffers(pa.binary(a.shape[1]), len(a), [None, pa.py_buffer(a)])

    def listed(a, typ):
        return pa.FixedSizeListArray.from_arrays(pa.array(a.reshape(-1), typ), a.shape[1])

    wide = ids.max() > 255
    gaps = np.concatenate([q[:, :1].astype("<i4").view(np.uint8),
                           (q[:, :-1] - q[:, 1:]).astype("<u2").view(np.uint8)], axis=1)
    cases = [
        ("ids: int16 lists, zstd", listed(ids, pa.int16()), False),
        ("ids: int16 lists, byte stream split", listed(ids, pa.int16()), "list"),
        (f"ids: {'uint16' if wide else 'uint8'} binary rows, zstd", binary(ids.astype("<u2" if wide else "u1")),
         False),
        (f"ids: {'uint16' if wide else 'uint8'} binary rows, byte stream split (chosen)",
         binary(ids.astype("<u2" if wide else "u1")), True),
        ("logits: float32 lists, zstd", listed(x, pa.float32()), False),
        ("logits: float32 lists, byte stream split", listed(x, pa.float32()), "list"),
        ("logits: float32 binary rows, byte stream split (chosen)", binary(x.astype("<f4")), True),
    ]
    if exact:
        cases.append(("logits: 1/32-grid integers (int32 first, int16 gaps), binary rows, byte stream split",
                      binary(gaps), True))
    print(f"encodings of the ranked columns, {len(ids):,} rows of M={M} (write and read: CPU s per 10,000 tokens, "
          "zstd level 1, least of 3):")
    for label, arr, bss in cases:
        table = pa.table({"c": arr})
        split = ["c.list.element"] if bss == "list" else ["c"] if bss else False

        def write(table=table, split=split):
            buf = io.BytesIO()
            pq.write_table(table, buf, compression="zstd", compression_level=1, use_dictionary=False,
                           use_byte_stream_split=split, row_group_size=65536)
            return buf.getvalue()

        data, wt = min((timed(write)[::2] for _ in range(3)), key=lambda r: r[1])
        rt = min(timed(lambda d=data: pq.read_table(pa.BufferReader(d)))[2] for _ in range(3))
        print(f"    {label:82s} {len(data) / T:7.1f} B/token  write {wt * 1e4 / T:.3f}  read {rt * 1e4 / T:.3f}")


if __name__ == "__main__":
    main()
