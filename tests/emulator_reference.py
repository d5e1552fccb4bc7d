"""Slow reference of the emulator: decode token by token with a KV cache and apply the policy
online, deciding each (token, layer) step with the pure-Python replay reference run on the layer's
requests so far. Written independently of moesim.emulator: its own router hook, its own ranking
(a softmax router's weights are distinct in the tiny test models), its own weight rewrite."""

from __future__ import annotations

import numpy as np
from reference_replay import reference_replay

CODES = {"hit": 0, "fetch": 1, "substitute": 2, "drop": 3, "cpu": 4}


def _rank(ids: np.ndarray, w: np.ndarray) -> list[int]:
    """Columns in rank order: highest weight first, equal weights lower id first."""
    return sorted(range(len(ids)), key=lambda c: (-w[c], ids[c]))


def reference_emulate(torch, model, tokens: list[int], routers: list, *, M: int, drop: str = "renormalize",
                      **policy):
    """(per-token NLL of tokens 2..T, outcomes [T, L, k] in rank order). ``routers``: the MoE
    routers in layer order; ``policy``: reference_replay's keyword arguments (eviction, miss, slots,
    theta, admit, warm...)."""
    import transformers

    L = len(routers)
    E = model.config.num_experts
    k = model.config.num_experts_per_tok
    hist = [{"sel": [], "w": [], "cand": []} for _ in range(L)]
    T = len(tokens)
    outcome = np.full((T, L, k), -1, dtype=np.int64)
    state = {"t": 0}

    def hook_for(layer):
        def hook(module, args, output):
            logits, weights, ids = output
            t = state["t"]
            lg = logits[0].double().numpy()
            i0, w0 = ids[0].numpy(), weights[0].double().numpy()
            cols = _rank(i0, w0)
            h = hist[layer]
            h["sel"].append([int(i0[c]) for c in cols])
            h["w"].append([w0[c] / w0.sum() for c in cols])
            h["cand"].append(sorted(range(E), key=lambda e: (-lg[e], e))[:M])
            sel = np.array(h["sel"])[:, None, :]
            decisions = {}
            reference_replay(sel, np.array(h["w"])[:, None, :], np.array(h["cand"])[:, None, :],
                             np.zeros(t + 1, np.int32), E, decisions=decisions, **policy)
            new_ids, new_w = ids.clone(), weights.clone()
            dropped = []
            for r, c in enumerate(cols):
                what, sub = decisions[(t, 0, r)]
                outcome[t, layer, r] = CODES[what]
                if what == "substitute":
                    new_ids[0, c] = sub
                elif what == "drop":
                    dropped.append(c)
            if dropped:
                total = weights[0].sum()
                keep = [c for c in range(k) if c not in dropped]
                for c in dropped:
                    new_w[0, c] = 0
                if drop == "renormalize" and keep:
                    new_w[0, keep] = weights[0, keep] * (total / weights[0, keep].sum())
            return logits, new_w, new_ids
        return hook

    handles = [r.register_forward_hook(hook_for(i)) for i, r in enumerate(routers)]
    nll = []
    try:
        cache = transformers.DynamicCache(config=model.config)
        with torch.no_grad():
            for t in range(T):
                state["t"] = t
                out = model(input_ids=torch.tensor([[tokens[t]]]), cache=cache, use_cache=True)
                if t + 1 < T:
                    lp = torch.log_softmax(out.logits[0, -1].double(), dim=-1)
                    nll.append(-float(lp[tokens[t + 1]]))
    finally:
        for h in handles:
            h.remove()
    return np.array(nll), outcome
