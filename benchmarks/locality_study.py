"""The second study's locality experiment at toy scale (docs/locality-study.md): a baseline demo model and
variants trained with the locality term, each measured on the same held-out tokens.

    nice python benchmarks/locality_study.py BASELINE VARIANT [VARIANT ...] [--reroute bias:0.25 ...]
        [--budget 0.25] [--static-budget 0.5] [--max-tokens 4096] [--window 512] [--json OUT.json]

Per model (its unmodified routing on the baseline's eval_<domain>.txt, the same tokens for every model:
a variant branched off the baseline keeps its tokenizer): held-out perplexity (the trainer's, from
train_manifest.json, over every held-out token), next-token reuse (`moesim profile`), the fetch-all
hit rate of LRU at --budget and of static pinning at --static-budget (`moesim simulate`, cold, per-layer
pools). Then the locality tax against rerouting (the study's Table 6): for every model, LRU fetch-all
at --budget with and without each --reroute, emulated (closed loop), its perplexity against the
*baseline's* unmodified perplexity on the same tokens (the locality tax and the rerouting's cost together),
the KL divergence of its next-token distribution from that model's own unmodified one (the rerouting's
alone), and the misses it avoids against the baseline's LRU misses. Prints two Markdown tables; --json
writes every number.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

DOMAINS = ("code", "docs", "legal")


def measure(model_dir: Path, texts: list[Path], domains: list[str], *, budget: float, static_budget: float,
            reroutes: list[str], window: int, max_tokens: int | None) -> dict:
    from moesim.emulator import load_emulator
    from moesim.reports.profile import profile
    from moesim.simulator import SimConfig, simulate

    em = load_emulator(model_dir, texts, domains=domains, window=window, max_tokens=max_tokens)
    _, routing, _, _ = em.baseline()
    lru = simulate(routing, SimConfig(eviction="lru", budget=budget)).totals()
    static = simulate(routing, SimConfig(eviction="static", budget=static_budget)).totals()
    manifest = model_dir / "train_manifest.json"
    m = json.loads(manifest.read_text()) if manifest.exists() else {}
    doc = {"model": str(model_dir), "locality": m.get("recipe", {}).get("locality"),
           "domain": m.get("recipe", {}).get("domain"), "heldout_ppl": m.get("heldout", {}).get("ppl"),
           "ppl": em.baseline_ppl, "scored_tokens": em.setup.scored_tokens,
           "reuse_next_token": profile(routing)["reuse_next_token"],
           "lru_hit_rate": lru["hit_rate"], "lru_misses": lru["misses"], "static_hit_rate": static["hit_rate"],
           "rerouted": {}}
    for r in reroutes:
        run = em.run(SimConfig(eviction="lru", budget=budget, reroute=r))
        t = run.result.totals()
        doc["rerouted"][r] = {"ppl": run.ppl, "kl": run.kl, "top1_agreement": run.top1_agreement,
                              "hit_rate": t["hit_rate"], "misses": t["misses"],
                              "displaced_mass_per_step": t["displaced_mass_per_step"]}
    return doc


def tables(docs: list[dict], budget: float, static_budget: float) -> str:
    base = docs[0]

    def name(d: dict) -> str:
        return "baseline" if d is base else f"locality {d['locality'] or 0:g}"

    out = [f"| model | held-out ppl | ppl (study tokens) | next-token reuse | LRU hit % @{budget:.0%} | "
           f"static hit % @{static_budget:.0%} |", "|---|---|---|---|---|---|"]
    for d in docs:
        held = "-" if d["heldout_ppl"] is None else f"{d['heldout_ppl']:.2f}"
        out.append(f"| {name(d)} | {held} | {d['ppl']:.2f} | {d['reuse_next_token']:.3f} | "
                   f"{100 * d['lru_hit_rate']:.1f} | {100 * d['static_hit_rate']:.1f} |")
    out += ["", f"| point (LRU, fetch-all, {budget:.0%}) | dppl % vs baseline | KL vs its own model | LRU misses | "
            "misses avoided % | dppl % per 10% of misses avoided |", "|---|---|---|---|---|---|"]
    ref_ppl, ref_miss = base["ppl"], base["lru_misses"]

    def row(label: str, ppl: float, kl: float | None, misses: int) -> str:
        dppl, avoided = 100 * (ppl / ref_ppl - 1), 100 * (1 - misses / ref_miss)
        cost = f"{10 * dppl / avoided:+.2f}" if avoided > 0 else "-"
        return (f"| {label} | {dppl:+.2f} | {'-' if kl is None else f'{kl:.4f}'} | {misses:,} | {avoided:.1f} | "
                f"{cost} |")

    for d in docs:
        out.append(row(name(d), d["ppl"], None, d["lru_misses"]))
        for r, x in d["rerouted"].items():
            kind = "rerouting" if d is base else "stacked"
            out.append(row(f"{name(d)} + {r} ({kind})", x["ppl"], x["kl"], x["misses"]))
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("models", nargs="+", type=Path, help="the baseline's folder, then the variants'")
    ap.add_argument("--reroute", action="append", default=None, help="rerouting rules (default bias:0.25)")
    ap.add_argument("--budget", type=float, default=0.25)
    ap.add_argument("--static-budget", type=float, default=0.5)
    ap.add_argument("--max-tokens", type=int, default=4096, help="tokens per domain")
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    import torch

    from moesim.errors import MoesimError
    from moesim.files import write_text

    torch.set_num_threads(a.threads)
    texts = [a.models[0] / f"eval_{d}.txt" for d in DOMAINS]
    try:
        docs = []
        for m in a.models:
            docs.append(measure(m, texts, list(DOMAINS), budget=a.budget, static_budget=a.static_budget,
                                reroutes=a.reroute or ["bias:0.25"], window=a.window, max_tokens=a.max_tokens))
            print(f"measured {m}", file=sys.stderr, flush=True)
    except MoesimError as e:
        print(f"locality_study: error: {e}", file=sys.stderr)
        return 2
    if a.json is not None:
        clean = json.loads(json.dumps(docs, default=float), parse_constant=lambda c: None)
        write_text(json.dumps(clean, indent=1) + "\n", a.json)
    print(tables(docs, a.budget, a.static_budget))
    return 0 if all(math.isfinite(d["ppl"]) for d in docs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
