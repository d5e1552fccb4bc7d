"""Train the demo model: a small Qwen3-MoE language model on text every Debian/Ubuntu Python
machine has offline, so perplexity means something (random weights make it meaningless).

    nice python -m moesim.emulator.demo_model [--out ~/.cache/moesim/demo-model] [--steps N]

Three domains, held out by file for evaluation:
- code: the Python standard library's own top-level modules (``sysconfig``'s stdlib folder);
- docs: the Python reference documentation that ships inside the stdlib (``pydoc_data.topics``);
- legal: license texts in ``/usr/share/common-licenses`` and ``/usr/share/doc/*/copyright``
  (Debian's base-files and every installed package); where that folder does not exist, the
  license files of the installed Python packages (``*.dist-info/LICENSE*``).

Architecture: 6 layers, 32 experts, top-4, hidden 128, a 4,096-token byte-level BPE trained on
the training split. Deterministic (fixed seeds, one thread order, files sorted, held-out files
chosen by zlib.crc32 of their names); ~8 minutes on 2 CPU cores by default. Writes the checkpoint,
its tokenizer, one evaluation text per domain (eval_<domain>.txt) and train_manifest.json (sources,
sizes, digests, loss curve) into --out, never into the repository.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import sysconfig
import time
import zlib
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "moesim" / "demo-model"
DOMAINS = ("code", "docs", "legal")
HELD_OUT = 8          # a file is held out for evaluation when crc32(name) % HELD_OUT == 0
EVAL_CHARS = 60_000   # characters of each domain's evaluation text
CAP_CHARS = 3_000_000  # training characters kept per domain (the largest source is capped)

CONFIG: dict[str, Any] = dict(num_hidden_layers=6, hidden_size=128, intermediate_size=256, moe_intermediate_size=128,
              num_experts=32, num_experts_per_tok=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
              max_position_embeddings=1024, norm_topk_prob=True, tie_word_embeddings=True, rms_norm_eps=1e-6,
              router_aux_loss_coef=0.01, output_router_logits=True, mlp_only_layers=[], decoder_sparse_step=1)


def _held_out(name: str) -> bool:
    return zlib.crc32(name.encode()) % HELD_OUT == 0


def sources() -> dict[str, list[tuple[str, str]]]:
    """{domain: [(name, text), ...]} sorted by name."""
    out: dict[str, list[tuple[str, str]]] = {}
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out["code"] = [(p.name, p.read_text(encoding="utf-8", errors="replace")) for p in sorted(stdlib.glob("*.py"))]
    import pydoc_data.topics as topics

    out["docs"] = [(k, v) for k, v in sorted(topics.topics.items())]
    legal = []
    lic = Path("/usr/share/common-licenses")
    if lic.is_dir():
        legal += [(f"common-licenses/{p.name}", p.read_text(errors="replace")) for p in sorted(lic.iterdir())
                  if p.is_file()]
        legal += [(f"doc/{p.parent.name}", p.read_text(errors="replace"))
                  for p in sorted(Path("/usr/share/doc").glob("*/copyright")) if p.is_file()]
    else:
        import site

        for sp in sorted(site.getsitepackages()):
            legal += [(f"{p.parent.name}/{p.name}", p.read_text(errors="replace"))
                      for p in sorted(Path(sp).glob("*.dist-info/LICENSE*")) if p.is_file()]
    out["legal"] = legal
    for d in DOMAINS:
        if not out[d]:
            raise SystemExit(f"demo_model: found no text for the {d} domain")
    return out


def split(src: dict) -> tuple[dict[str, str], dict[str, str], dict]:
    train, evals, info = {}, {}, {}
    for d, files in src.items():
        tr = [t for n, t in files if not _held_out(n)]
        ev = [t for n, t in files if _held_out(n)]
        train[d] = "\n\n".join(tr)[:CAP_CHARS]
        evals[d] = "\n\n".join(ev)[:EVAL_CHARS]
        info[d] = {"files": len(files), "train_files": len(tr), "eval_files": len(ev),
                   "train_chars": len(train[d]), "eval_chars": len(evals[d]),
                   "train_sha256": hashlib.sha256(train[d].encode()).hexdigest()[:16],
                   "eval_sha256": hashlib.sha256(evals[d].encode()).hexdigest()[:16],
                   "names": [n for n, _ in files][:5] + (["..."] if len(files) > 5 else [])}
    return train, evals, info


def make_tokenizer(texts: list[str], vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    # chunks: the trainer counts words per item; one huge string would be one item
    tok.train_from_iterator((t[i:i + 10_000] for t in texts for i in range(0, len(t), 10_000)), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def train(out: Path, steps: int, seq_len: int, batch: int, lr: float, seed: int, threads: int, log=print) -> dict:
    import numpy as np
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    tr, ev, info = split(sources())
    tok = make_tokenizer([tr[d] for d in DOMAINS], 4096)
    data = {d: np.asarray(tok(tr[d], add_special_tokens=False)["input_ids"], dtype=np.int64) for d in DOMAINS}
    for d in DOMAINS:
        info[d]["train_tokens"] = int(len(data[d]))
    log(f"data: {', '.join(f'{d} {len(data[d]):,} tokens' for d in DOMAINS)} ({time.perf_counter() - t0:.0f} s)")
    cfg = transformers.Qwen3MoeConfig(**CONFIG, vocab_size=len(tok), eos_token_id=tok.eos_token_id,
                                      pad_token_id=tok.pad_token_id, bos_token_id=None)
    # grouped matmuls: ~2-3x faster than the per-expert loop for training on CPU (same outputs)
    cfg._experts_implementation = "grouped_mm"
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    rng = np.random.default_rng(seed)
    curve = []
    for step in range(steps):
        rows = []
        for b in range(batch):   # domains in turn: every batch holds all three
            arr = data[DOMAINS[(step * batch + b) % len(DOMAINS)]]
            i = int(rng.integers(0, len(arr) - seq_len - 1))
            rows.append(arr[i:i + seq_len])
        ids = torch.as_tensor(np.stack(rows))
        outp = model(input_ids=ids, labels=ids)
        opt.zero_grad(set_to_none=True)
        outp.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 10 == 0 or step == steps - 1:
            lm = float(outp.loss.detach()) - cfg.router_aux_loss_coef * float(outp.aux_loss.detach())
            curve.append({"step": step, "loss": round(lm, 4), "seconds": round(time.perf_counter() - t0, 1)})
            log(f"step {step:4d}  loss {lm:.3f}  ({time.perf_counter() - t0:.0f} s)")
    model.eval()
    model.config.output_router_logits = False
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    for d in DOMAINS:
        (out / f"eval_{d}.txt").write_text(ev[d])
    manifest = {"seed": seed, "steps": steps, "seq_len": seq_len, "batch": batch, "lr": lr, "threads": threads,
                "config": CONFIG, "vocab": len(tok), "parameters": sum(p.numel() for p in model.parameters()),
                "sources": info, "loss_curve": curve, "seconds": round(time.perf_counter() - t0, 1),
                "torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0]}
    (out / "train_manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"checkpoint folder (default {DEFAULT_OUT})")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    repo = Path(__file__).resolve().parent.parent
    if repo in a.out.resolve().parents or a.out.resolve() == repo:
        print("demo_model: write the checkpoint outside the repository (--out)", file=sys.stderr)
        return 2
    m = train(a.out, a.steps, a.seq_len, a.batch, a.lr, a.seed, a.threads)
    print(f"wrote {a.out} ({m['parameters']:,} parameters, {m['seconds']:.0f} s, final loss "
          f"{m['loss_curve'][-1]['loss']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
