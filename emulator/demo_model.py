"""Train the demo model: a small Qwen3-MoE language model on text every Debian/Ubuntu Python
machine has offline, so perplexity means something (random weights make it meaningless).

    nice python -m moesim.emulator.demo_model [--out ~/.cache/moesim/demo-model] [--steps N]
    nice python -m moesim.emulator.demo_model --locality 0.1 --from ~/.cache/moesim/demo-model --out DIR

Three domains held out by file (emulator/demo_data.py); architecture: 6 layers, 32 experts, top-4,
hidden 128, 512-token context, a 4,096-token byte-level BPE trained on the training split; 800 AdamW
steps of 8 x 512 tokens (27 CPU minutes on one core, 40 minutes of wall time under nice on a shared
2-core machine; held-out perplexity 98, docs/emulator.md). Deterministic (fixed seeds, files sorted,
one thread by default). Interrupted, the same command resumes from the last checkpoint (every 25
steps) and the text split the run kept (train_state/texts.json.gz). ``--locality`` / ``--domain``
weigh the locality study's router terms (emulator/demo_train.py, docs/locality-study.md); with
``--from BASELINE`` a variant continues from the state the baseline kept at its branch step (2/3 of
the steps), so only the last third is trained again. Writes the checkpoint, its tokenizer,
one evaluation text per domain (eval_<domain>.txt) and train_manifest.json (recipe, sources, sizes,
digests, the loss curve with held-out perplexity) into --out, never into the repository.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from moesim.errors import MoesimError

DEFAULT_OUT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "moesim" / "demo-model"

CONFIG: dict[str, Any] = dict(num_hidden_layers=6, hidden_size=128, intermediate_size=256, moe_intermediate_size=128,
              num_experts=32, num_experts_per_tok=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
              max_position_embeddings=512, norm_topk_prob=True, tie_word_embeddings=True, rms_norm_eps=1e-6,
              router_aux_loss_coef=0.01, output_router_logits=True, mlp_only_layers=[], decoder_sparse_step=1)


def main(argv=None) -> int:
    from moesim.emulator.demo_train import Recipe

    d = Recipe()
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"checkpoint folder (default {DEFAULT_OUT})")
    ap.add_argument("--steps", type=int, default=d.steps)
    ap.add_argument("--seq-len", type=int, default=d.seq_len, help="tokens per training row, and the model's context")
    ap.add_argument("--batch", type=int, default=d.batch)
    ap.add_argument("--lr", type=float, default=d.lr)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--aux", type=float, default=d.aux, help="router load-balancing loss weight")
    ap.add_argument("--locality", type=float, default=0.0, help="weight of the locality term (route t like t-1)")
    ap.add_argument("--domain", type=float, default=0.0, help="weight of the domain term (experts per domain)")
    ap.add_argument("--from", dest="branch_from", type=Path, default=None,
                    help="continue from this baseline's branch state (a variant: other --locality/--domain only)")
    ap.add_argument("--branch-at", type=int, default=None, help="step whose state is kept for variants (default 2/3)")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    repo = Path(__file__).resolve().parent.parent
    if repo in a.out.resolve().parents or a.out.resolve() == repo:
        print("demo_model: error: write the checkpoint outside the repository (--out)", file=sys.stderr)
        return 2
    try:
        from moesim.emulator.demo_data import kept_split, sources, split
        from moesim.emulator.demo_train import train

        recipe = Recipe(steps=a.steps, seq_len=a.seq_len, batch=a.batch, lr=a.lr, seed=a.seed, aux=a.aux,
                        locality=a.locality, domain=a.domain)
        config = {**CONFIG, "max_position_embeddings": a.seq_len}
        kept = kept_split(a.out / "train_state", a.branch_from / "train_state" if a.branch_from else None)
        m = train(a.out, recipe, config=config, texts=kept or split(sources()), threads=a.threads,
                  branch_from=a.branch_from, branch_at=a.branch_at, log=lambda s: print(s, flush=True))
        assert m is not None
    except MoesimError as e:
        print(f"demo_model: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.out} ({m['parameters']:,} parameters, {m['seconds']:.0f} s, {m['cpu_seconds']:.0f} CPU s, "
          f"held-out ppl {m['heldout']['ppl']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
