"""Teacher-forced perplexity over windows of a run.

A text that fits the window (default: the model's context, ``max_position_embeddings``) is one
sequence; a longer one is cut into consecutive, non-overlapping windows of that many tokens (the
tracer's sequences). Each window scores its tokens 2..n (the first has no context), and the
perplexity is exp of the mean NLL over every scored token of every window: for one window,
exactly the loss transformers computes with ``labels=input_ids``; for several, the same loss over
the batch of windows with padding labelled -100.
"""

from __future__ import annotations

import math

import numpy as np


def token_nll(torch, logits, input_ids, lengths: list[int]) -> np.ndarray:
    """NLL (float64) of tokens 2..n of each window, window after window. ``logits`` [B, S, V]."""
    out = []
    for b, n in enumerate(lengths):
        if n < 2:
            continue
        lp = torch.log_softmax(logits[b, : n - 1].float(), dim=-1)
        tgt = input_ids[b, 1:n].to(lp.device)
        out.append(-lp.gather(1, tgt[:, None])[:, 0].double().cpu().numpy())
    return np.concatenate(out) if out else np.zeros(0)


def perplexity(nll: np.ndarray) -> float:
    return math.exp(float(np.mean(nll))) if len(nll) else float("nan")


def dppl_pct(ppl: float, base: float) -> float:
    return 100.0 * (ppl / base - 1.0)
