"""Tokens/s of `moesim trace llama` vs plain llama.cpp evaluation of the same GGUF, same process.

    python benchmarks/llama_trace_overhead.py [--gguf MODEL.gguf] [--tokens 2048] [--seq-len 512]
                                              [--threads 1] [--repeats 3]

Three runs over the same token ids, each end to end (model load, context, every
llama_decode call with output logits for every token, as the tracer requests them):

- plain:     llama.cpp with no eval callback;
- callback:  the tracer's eval callback installed but asking for no tensor (the cost
             of llama.cpp calling into Python once per graph node);
- traced:    trace_llama itself (callback, copying the router tensors out, writing the
             trace).

Without --gguf a random Qwen3-MoE is built and written as an f32 GGUF (default: 8
layers, hidden 256, 32 experts of 128, top-4: small enough to build in seconds, so
the fixed per-node cost weighs more than on a real model). Each run is timed best
of N after a warm-up, the three alternating so that load on a shared machine hits
all alike. One thread by default: on a shared 2-core machine, two llama.cpp threads
spin-wait on each other whenever another process holds a core, which swamps the
difference being measured. Needs the [tracers] extra.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fixtures"))


def build_gguf(d: Path, layers: int, hidden: int, experts: int, inter: int, k: int) -> Path:
    import tiny_gguf
    import tiny_moe

    tok = tiny_moe.make_tokenizer()
    _, model, _ = tiny_moe.build("qwen3_moe", d / "model", tokenizer=tok, seed=0, num_hidden_layers=layers,
                                 mlp_only_layers=[], norm_topk_prob=True, hidden_size=hidden,
                                 num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64, head_dim=64,
                                 num_experts=experts, moe_intermediate_size=inter, num_experts_per_tok=k,
                                 intermediate_size=inter)
    return tiny_gguf.write_qwen3moe_gguf(model, tok, d / "bench.gguf", name="bench-qwen3-moe")


def clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def since(t0: tuple[float, float]) -> tuple[float, float]:
    """(wall, CPU) seconds since ``t0``."""
    return time.perf_counter() - t0[0], time.process_time() - t0[1]


def plain_run(gguf: Path, seqs: list[np.ndarray], n_batch: int, threads: int, callback: bool) -> tuple[float, float]:
    """(wall, CPU) seconds for llama.cpp to load ``gguf`` and decode ``seqs`` (all outputs on),
    optionally with an eval callback that asks for nothing."""
    from moesim.traces.tracers.llama import import_llama

    llama_cpp, _ = import_llama()
    t0 = clock()
    model = llama_cpp.llama_model_load_from_file(str(gguf).encode(), llama_cpp.llama_model_default_params())
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = max(max(len(s) for s in seqs), 16)
    cp.n_batch = cp.n_ubatch = n_batch
    cp.n_seq_max = 1
    cp.n_threads = cp.n_threads_batch = threads
    cb = llama_cpp.ggml_backend_sched_eval_callback(lambda t, ask, ud: False)
    if callback:
        cp.cb_eval = cb
        cp.cb_eval_user_data = None
    ctx = llama_cpp.llama_init_from_model(model, cp)
    batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
    try:
        for s in seqs:
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
            for start in range(0, len(s), n_batch):
                chunk = s[start:start + n_batch]
                batch.n_tokens = len(chunk)
                for i, tok in enumerate(chunk):
                    batch.token[i], batch.pos[i], batch.n_seq_id[i] = int(tok), start + i, 1
                    batch.seq_id[i][0], batch.logits[i] = 0, 1
                if llama_cpp.llama_decode(ctx, batch) != 0:
                    raise RuntimeError("llama_decode failed")
        return since(t0)
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=Path, help="a GGUF to run (default: build a random Qwen3-MoE)")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--expert-size", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=4)
    a = ap.parse_args()

    import pyarrow.parquet as pq
    import tiny_moe

    from moesim.traces.tracers.llama import import_llama, trace_llama

    llama_cpp, _ = import_llama()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        gguf = a.gguf or build_gguf(d, a.layers, a.hidden, a.experts, a.expert_size, a.top_k)
        text = d / "text.txt"
        text.write_text((tiny_moe.PROSE + "\n" + tiny_moe.CODE) * (1 + a.tokens // 200))
        kw = dict(seq_len=a.seq_len, max_tokens=a.tokens, n_batch=a.seq_len, n_threads=a.threads)

        def traced() -> tuple[float, float]:
            out = d / "trace.parquet"
            out.unlink(missing_ok=True)
            t0 = clock()
            trace_llama(gguf, [str(text)], out, **kw)
            return since(t0)

        traced()   # warm-up; its trace gives the token ids the plain runs decode
        t = pq.read_table(d / "trace.parquet", columns=["seq", "layer", "token"])
        first = np.asarray(t.column("layer")) == np.asarray(t.column("layer"))[0]
        seq, tok = np.asarray(t.column("seq"))[first], np.asarray(t.column("token"))[first]
        seqs = [tok[seq == s] for s in np.unique(seq)]
        n = sum(len(s) for s in seqs)
        runs = {"plain": lambda: plain_run(gguf, seqs, a.seq_len, a.threads, False),
                "callback": lambda: plain_run(gguf, seqs, a.seq_len, a.threads, True),
                "traced": traced}
        wall = {k: float("inf") for k in runs}
        cpu = {k: float("inf") for k in runs}
        for name, f in runs.items():
            if name != "traced":
                f()   # warm-up
        for _ in range(a.repeats):
            for name, f in runs.items():
                w, c = f()
                wall[name], cpu[name] = min(wall[name], w), min(cpu[name], c)
        print(f"llama-cpp-python {getattr(llama_cpp, '__version__', '?')}, {gguf.name}, {n} tokens in "
              f"{len(seqs)} sequences of <= {a.seq_len}, {a.threads} threads, best of {a.repeats}")
        print(f"{'run':<10}{'wall s':>9}{'tokens/s':>10}{'vs plain':>10}"
              f"{'CPU s':>9}{'tokens/CPU s':>14}{'vs plain':>10}")
        for name in runs:
            print(f"{name:<10}{wall[name]:>9.3f}{n / wall[name]:>10.0f}{wall['plain'] / wall[name]:>10.2f}"
                  f"{cpu[name]:>9.3f}{n / cpu[name]:>14.0f}{cpu['plain'] / cpu[name]:>10.2f}")
        print(f"traced/plain throughput: {wall['plain'] / wall['traced']:.2f} wall, "
              f"{cpu['plain'] / cpu['traced']:.2f} CPU (callback alone: {wall['plain'] / wall['callback']:.2f} wall, "
              f"{cpu['plain'] / cpu['callback']:.2f} CPU)")


if __name__ == "__main__":
    main()
