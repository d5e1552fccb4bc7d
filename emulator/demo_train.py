"""The demo model's training loop: the recipe, the two router terms of the locality study,
checkpoints to resume from and to branch variants off, and the held-out evaluation.

Loss = language-model cross-entropy + ``aux`` x the router's load-balancing loss (transformers'
``router_aux_loss_coef``) + ``locality`` x L_loc + ``domain`` x L_dom, with per MoE layer and the
router's softmax p_t over all E experts at token t:

- L_loc, the locality term: the total-variation distance between consecutive tokens' routing,
  1 - sum_e min(p_t(e), p_{t-1}(e)), averaged over the batch's consecutive pairs and the layers.
  It is zero when token t is routed exactly like token t-1, so a positive weight rewards routing
  token t like t-1 (what an LRU cache of the previous tokens' experts turns into hits);
- L_dom, the domain term: the entropy of each domain's mean routing over the batch's tokens of that
  domain, divided by log E, averaged over the domains and layers. A positive weight concentrates
  each domain on fewer experts; the load-balancing loss keeps the whole batch spread over all of
  them, so together they give each domain experts of its own.

Both are logged on every run (also at weight 0) so a variant's routing can be compared with the
baseline's in the loss curve.

A run keeps ``train_state/`` in its output folder: the tokenizer, ``latest.pt`` (model, optimizer,
schedule and sampler state, rewritten atomically every ``checkpoint_every`` steps; a restarted run
with the same recipe and text resumes from it, bit for bit) and ``branch.pt`` (the state after
``branch_at`` steps, kept: a variant with other router-term weights continues from it with the same
data order and learning-rate schedule, so it differs from the baseline in those weights only), and
``texts.json.gz``, the text split it trained on (demo_data.kept_split: what a resume or a variant reads).
"""

from __future__ import annotations

import math
import shutil
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from moesim.emulator.demo_data import KEPT, make_tokenizer, save_split
from moesim.errors import MoesimError
from moesim.files import atomic, write_text

EVAL_WINDOWS = 4   # windows of each domain's held-out text scored during training (all at the end)
# the domain of each batch row, in turn: 3 code, 1 docs, 3 legal of every 7 rows (the docs domain has a
# tenth of the others' tokens; in equal turns it would be seen ~13 times in a default run)
ROW_DOMAINS = (0, 2, 1, 0, 2, 0, 2)


@dataclass(frozen=True)
class Recipe:
    """What a trained model's weights depend on (besides the text, the architecture and the thread count)."""

    steps: int = 800
    seq_len: int = 512
    batch: int = 8
    lr: float = 3e-3
    seed: int = 0
    aux: float = 0.01
    locality: float = 0.0
    domain: float = 0.0
    vocab: int = 4096

    def __post_init__(self):
        for name in ("steps", "seq_len", "batch", "vocab"):
            if getattr(self, name) < 1:
                raise MoesimError(f"{name} must be at least 1")
        for name in ("aux", "locality", "domain"):
            v = getattr(self, name)
            if not math.isfinite(v) or v < 0:
                raise MoesimError(f"the {name} weight must be finite and >= 0, got {v}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise MoesimError(f"lr must be positive, got {self.lr}")

    def differs(self, other: dict, ignore: tuple[str, ...] = ()) -> list[str]:
        return [f.name for f in fields(self) if f.name not in ignore and other.get(f.name) != getattr(self, f.name)]


def router_terms(torch, router_logits, batch: int, seq_len: int, row_domains: list[int]):
    """(L_loc, L_dom) of one forward pass (module docstring); ``router_logits``: per MoE layer
    [batch * seq_len, E]; ``row_domains``: the domain of each batch row."""
    doms = sorted(set(row_domains))
    rows = {d: torch.as_tensor([b for b, x in enumerate(row_domains) if x == d]) for d in doms}
    loc: Any = 0.0
    dom: Any = 0.0
    for lg in router_logits:
        p = torch.softmax(lg.float(), dim=-1).view(batch, seq_len, -1)
        loc = loc + (1.0 - torch.minimum(p[:, 1:], p[:, :-1]).sum(-1)).mean()
        for d in doms:
            q = p[rows[d]].mean(dim=(0, 1))
            dom = dom - (q * torch.log(q.clamp_min(1e-12))).sum() / math.log(p.shape[-1])
    n = len(router_logits)
    return loc / n, dom / (n * len(doms))


def _lr_factor(step: int, steps: int) -> float:
    """Linear warm-up over 5% of the steps, then cosine decay to a tenth of the peak."""
    warm = max(1, steps // 20)
    return min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(step, steps) / steps)))


def heldout_nll(torch, model, ids: np.ndarray, seq_len: int, windows: int | None) -> tuple[float, int]:
    """(summed NLL, scored tokens) of consecutive windows of ``seq_len`` tokens (each scores tokens 2..n)."""
    total, count = 0.0, 0
    starts = list(range(0, len(ids) - 1, seq_len))[:windows]
    with torch.no_grad():
        for s in starts:
            w = torch.as_tensor(ids[s:s + seq_len][None])
            if w.shape[1] < 2:
                continue
            logits = model(input_ids=w).logits[0, :-1].float()
            total += float(torch.nn.functional.cross_entropy(logits, w[0, 1:], reduction="sum"))
            count += w.shape[1] - 1
    return total, count


def _evaluate(torch, model, evals: dict[str, np.ndarray], seq_len: int, windows: int | None) -> dict:
    model.eval()
    per, tot, cnt = {}, 0.0, 0
    for d, ids in evals.items():
        s, n = heldout_nll(torch, model, ids, seq_len, windows)
        per[d] = round(math.exp(s / n), 3) if n else None
        tot, cnt = tot + s, cnt + n
    model.train()
    return {"ppl": round(math.exp(tot / cnt), 3) if cnt else None, "domains": per, "tokens": cnt}


def _load(torch, path: Path) -> dict:
    try:
        return torch.load(path, weights_only=True)
    except Exception as e:  # a damaged or foreign file: one line
        raise MoesimError(f"{path}: not a readable demo-model training state ({type(e).__name__})") from None


def _save(torch, state: dict, path: Path) -> None:
    with atomic(path) as tmp:
        torch.save(state, tmp)


def train(out: Path, recipe: Recipe, *, config: dict, texts: tuple[dict, dict, dict], threads: int = 1,
          branch_from: Path | None = None, branch_at: int | None = None, checkpoint_every: int = 25,
          eval_every: int = 100, stop_at: int | None = None, log=print) -> dict | None:
    """Train (or resume, or branch off ``branch_from``'s kept state) and write the model into ``out``.
    ``texts``: (train, eval, info) of demo_data.split; ``config``: the Qwen3-MoE architecture fields.
    ``stop_at``: stop after that step with its checkpoint written (returns None), as a killed run would."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(threads)
    t_wall, t_cpu = time.perf_counter(), time.process_time()
    tr, ev, info = texts
    domains = list(tr)
    digests = {d: (info[d]["train_sha256"], info[d]["eval_sha256"]) for d in domains}
    if (out / "train_manifest.json").exists():
        raise MoesimError(f"{out} already holds a trained model (train_manifest.json): train into another --out")
    state_dir = out / "train_state"
    latest = state_dir / "latest.pt"
    branch_at = round(2 * recipe.steps / 3) if branch_at is None else branch_at
    if not 0 < branch_at <= recipe.steps:
        raise MoesimError(f"--branch-at must be in 1..{recipe.steps}, got {branch_at}")

    ckpt = None
    origin: dict[str, Any] = {"kind": "fresh"}
    if latest.exists():
        ckpt = _load(torch, latest)
        diff = recipe.differs(ckpt["recipe"])
        if diff or ckpt["config"] != config or ckpt["digests"] != digests:
            what = ", ".join(diff) or ("the architecture" if ckpt["config"] != config else "the training text")
            raise MoesimError(f"{latest} was trained with another {what}: resume with the same settings or train "
                              "into another --out")
        tok = transformers.PreTrainedTokenizerFast.from_pretrained(state_dir / "tokenizer")
        origin = ckpt["origin"]
        log(f"resuming from step {ckpt['step']} ({latest})")
    elif branch_from is not None:
        src = branch_from / "train_state" / "branch.pt"
        if not src.exists():
            raise MoesimError(f"{src}: no branch state to continue from (train the baseline into {branch_from} first)")
        ckpt = _load(torch, src)
        diff = recipe.differs(ckpt["recipe"], ignore=("locality", "domain"))
        if diff or ckpt["config"] != config or ckpt["digests"] != digests:
            what = ", ".join(diff) or ("the architecture" if ckpt["config"] != config else "the training text")
            raise MoesimError(f"{src} was trained with another {what}: a variant differs from its baseline in the "
                              "--locality and --domain weights only")
        tok = transformers.PreTrainedTokenizerFast.from_pretrained(branch_from / "train_state" / "tokenizer")
        origin = {"kind": "branch", "from": str(branch_from.resolve()), "step": ckpt["step"],
                  "recipe": ckpt["recipe"]}
        log(f"branching off {src} at step {ckpt['step']}")
    else:
        tok = make_tokenizer([tr[d] for d in domains], recipe.vocab)
    if not (state_dir / "tokenizer").exists():
        state_dir.mkdir(parents=True, exist_ok=True)
        tok.save_pretrained(state_dir / "tokenizer")
    if not (state_dir / KEPT).exists():   # a resume reads this text, whatever the machine installed since
        save_split((tr, ev, {d: dict(info[d]) for d in domains}), state_dir / KEPT)

    data = {d: np.asarray(tok(tr[d], add_special_tokens=False)["input_ids"], dtype=np.int64) for d in domains}
    evals = {d: np.asarray(tok(ev[d], add_special_tokens=False)["input_ids"], dtype=np.int64) for d in domains}
    for d in domains:
        info[d]["train_tokens"], info[d]["eval_tokens"] = int(len(data[d])), int(len(evals[d]))
        if len(data[d]) <= recipe.seq_len + 1:
            raise MoesimError(f"the {d} domain has {len(data[d])} training tokens, fewer than --seq-len + 2")
    log(f"data: {', '.join(f'{d} {len(data[d]):,} tokens' for d in domains)}")

    torch.manual_seed(recipe.seed)
    arch = {**config, "router_aux_loss_coef": recipe.aux, "output_router_logits": True}
    cfg = transformers.Qwen3MoeConfig(**arch, vocab_size=len(tok), eos_token_id=tok.eos_token_id,
                                      pad_token_id=tok.pad_token_id, bos_token_id=None)
    # grouped matmuls: ~2-3x faster than the per-expert loop for training on CPU (same outputs)
    cfg._experts_implementation = "grouped_mm"
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, recipe.steps))
    rng = np.random.default_rng(recipe.seed)
    curve: list[dict] = []
    start, wall0, cpu0 = 0, 0.0, 0.0
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        sched.load_state_dict(ckpt["sched"])
        rng.bit_generator.state = ckpt["rng"]
        start, curve, wall0, cpu0 = ckpt["step"], list(ckpt["curve"]), ckpt["wall"], ckpt["cpu"]

    def clock() -> tuple[float, float]:
        return wall0 + time.perf_counter() - t_wall, cpu0 + time.process_time() - t_cpu

    def state(step: int) -> dict:
        w, c = clock()
        return {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                "rng": rng.bit_generator.state, "step": step, "curve": curve, "recipe": asdict(recipe),
                "config": config, "digests": digests, "origin": origin, "wall": w, "cpu": c}

    use_terms = recipe.locality > 0 or recipe.domain > 0
    for step in range(start, recipe.steps):
        rows, row_dom = [], []
        for b in range(recipe.batch):   # domains in turn (ROW_DOMAINS): every batch of 7 rows or more holds all
            di = ROW_DOMAINS[(step * recipe.batch + b) % len(ROW_DOMAINS)] % len(domains)
            arr = data[domains[di]]
            i = int(rng.integers(0, len(arr) - recipe.seq_len - 1))
            rows.append(arr[i:i + recipe.seq_len])
            row_dom.append(di)
        ids = torch.as_tensor(np.stack(rows))
        outp = model(input_ids=ids, labels=ids)
        logged = step % 10 == 0 or step == recipe.steps - 1
        loss = outp.loss
        loc = dom = None
        if use_terms or logged:
            with torch.enable_grad() if use_terms else torch.no_grad():
                loc, dom = router_terms(torch, outp.router_logits, recipe.batch, recipe.seq_len, row_dom)
            if use_terms:
                loss = loss + recipe.locality * loc + recipe.domain * dom
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if logged:
            assert loc is not None and dom is not None
            lm = float(outp.loss.detach()) - recipe.aux * float(outp.aux_loss.detach())
            w, c = clock()
            curve.append({"step": step, "loss": round(lm, 4), "locality": round(float(loc.detach()), 4),
                          "domain": round(float(dom.detach()), 4), "seconds": round(w, 1), "cpu_seconds": round(c, 1)})
            log(f"step {step:4d}  loss {lm:.3f}  locality {float(loc.detach()):.3f}  domain {float(dom.detach()):.3f}  "
                f"({w:.0f} s, cpu {c:.0f} s)")
        done = step + 1
        if done % eval_every == 0 and done < recipe.steps:
            e = _evaluate(torch, model, evals, recipe.seq_len, EVAL_WINDOWS)
            curve.append({"step": done, "eval_ppl": e["ppl"], "eval_domains": e["domains"],
                          "eval_tokens": e["tokens"]})
            log(f"step {done:4d}  held-out ppl {e['ppl']} {e['domains']}")
        if done == branch_at and origin["kind"] == "fresh":
            _save(torch, state(done), state_dir / "branch.pt")
        if (done % checkpoint_every == 0 or done == stop_at) and done < recipe.steps:
            _save(torch, state(done), latest)
        if done == stop_at:
            return None

    final = _evaluate(torch, model, evals, recipe.seq_len, None)
    curve.append({"step": recipe.steps, "eval_ppl": final["ppl"], "eval_domains": final["domains"],
                  "eval_tokens": final["tokens"]})
    log(f"held-out ppl {final['ppl']} {final['domains']}")
    wall, cpu = clock()
    model.eval()
    model.config.output_router_logits = False
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    for d in domains:
        write_text(ev[d], out / f"eval_{d}.txt")
    manifest = {"recipe": asdict(recipe), "threads": threads, "config": config, "vocab": len(tok),
                "parameters": sum(p.numel() for p in model.parameters()), "sources": info,
                "heldout": {**final, "seq_len": recipe.seq_len, "note": "every token of eval_<domain>.txt in "
                            "windows of seq_len tokens, each scoring its tokens 2..n"},
                "origin": origin, "branch_at": branch_at if origin["kind"] == "fresh" else None,
                "loss_curve": curve, "seconds": round(wall, 1), "cpu_seconds": round(cpu, 1),
                "torch": torch.__version__, "transformers": transformers.__version__,
                "python": sys.version.split()[0]}
    import json

    write_text(json.dumps(manifest, indent=1) + "\n", out / "train_manifest.json")
    latest.unlink(missing_ok=True)
    if origin["kind"] != "fresh":   # a variant keeps no branch state; its tokenizer is in `out`
        shutil.rmtree(state_dir, ignore_errors=True)
    return manifest
