"""Emulation time against a plain forward pass of the same model on the same tokens.

    nice python benchmarks/emulate_speed.py [--model ~/.cache/moesim/demo-model] [--text FILE ...]

Both run in this process, side by side, best of --repeats: the plain pass is the model's own
forward over the run's windows (batch of windows, same attention mask, use_cache=False); an
emulation is one closed-loop pass of a policy (router taps, the replay of every layer's requests,
the outputs rewritten) plus its open-loop replay. Without --model, the demo model's architecture
(emulator/demo_model.py) with random weights is built in memory. Prints one line per policy with the
ratio; the target is <= 3x for per-layer pools on CPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "fixtures"))

POLICIES = [
    ("quality-first", dict(eviction="freq", miss="threshold:0.15", admit=0.5)),
    ("speed-first", dict(eviction="freq", miss="first-choice", admit=0.5)),
    ("lru substitute", dict(eviction="lru", miss="substitute", admit=0.5)),
    ("belady 0.15 rule", dict(eviction="belady", miss="threshold:0.15")),
    ("lru fetch-all", dict(eviction="lru", miss="fetch-all")),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--text", action="append", default=None)
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--budget", type=float, default=0.25)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)

    import torch

    from moesim.emulator import Emulator
    from moesim.simulator import SimConfig

    torch.set_num_threads(a.threads)
    texts = a.text
    if a.model:
        from moesim.traces.tracers.hf import load_local

        model, tok = load_local(a.model, "float32", "cpu")
        texts = texts or sorted(str(p) for p in Path(a.model).glob("eval_*.txt"))
        name = a.model
    else:
        import tempfile

        import tiny_moe
        import transformers

        from moesim.emulator.demo_model import CONFIG

        tok = tiny_moe.make_tokenizer(4096)
        cfg = transformers.Qwen3MoeConfig(**{**CONFIG, "output_router_logits": False}, vocab_size=len(tok))
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
        with torch.no_grad():   # spread router logits as a trained model's are, not the init's near-ties
            for layer in model.model.layers:
                layer.mlp.gate.weight.normal_(0.0, 0.5)
        if not texts:
            import sysconfig

            src = Path(sysconfig.get_paths()["stdlib"])
            d = Path(tempfile.mkdtemp())
            (d / "code.txt").write_text((src / "argparse.py").read_text())
            texts = [str(d / "code.txt")]
        name = "demo architecture, random weights"
    em = Emulator(model, tok, texts, window=a.window, max_tokens=a.max_tokens)
    s = em.setup
    print(f"{name}: {s.tokens:,} tokens in {s.windows} window(s) of <= {s.window}, {a.threads} threads, "
          f"best of {a.repeats}")

    def plain():
        t0 = time.perf_counter()
        with torch.inference_mode():
            model(input_ids=em.input_ids, attention_mask=em.attention_mask, use_cache=False)
        return time.perf_counter() - t0

    em.baseline()
    em.run(SimConfig(eviction="lru", miss="threshold:0.15", admit=0.5, budget=a.budget), shortcut=False)  # compile
    base = min(plain() for _ in range(a.repeats))
    print(f"{'plain forward':<22} {base * 1e3:9.1f} ms")
    for label, p in POLICIES:
        cfg = SimConfig(**p, budget=a.budget)
        times = []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            em.run(cfg, shortcut=False)
            times.append(time.perf_counter() - t0)
            b = plain()
            base = min(base, b)
        best = min(times)
        print(f"{label:<22} {best * 1e3:9.1f} ms  {best / base:5.2f}x plain forward")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
