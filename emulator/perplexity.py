"""Teacher-forced perplexity over windows of a run, and how far a policy's next-token distributions
are from the unmodified model's (KL divergence, top-1 agreement) on the same scored positions.

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


def token_divergence(torch, logits, base_logits, lengths: list[int], chunk: int = 1 << 24):
    """Per scored position (as token_nll orders them): KL(P_base || P) in nats, float64, and whether the
    most likely next token is the unmodified model's. ``logits``/``base_logits`` [B, S, V]; rows are
    taken ``chunk`` // V at a time in float64 (a large vocabulary would not fit whole)."""
    kl, top1 = [], []
    for b, n in enumerate(lengths):
        if n < 2:
            continue
        step = max(1, chunk // int(logits.shape[-1]))
        for i in range(0, n - 1, step):
            j = min(n - 1, i + step)
            lq = torch.log_softmax(logits[b, i:j].double(), dim=-1)
            lp = torch.log_softmax(base_logits[b, i:j].to(lq.device).double(), dim=-1)
            kl.append((lp.exp() * (lp - lq)).sum(dim=-1).clamp_min(0.0).cpu().numpy())
            top1.append((lq.argmax(dim=-1) == lp.argmax(dim=-1)).cpu().numpy())
    if not kl:
        return np.zeros(0), np.zeros(0, dtype=bool)
    return np.concatenate(kl), np.concatenate(top1)


def perplexity(nll: np.ndarray) -> float:
    return math.exp(float(np.mean(nll))) if len(nll) else float("nan")


def dppl_pct(ppl: float, base: float) -> float:
    return 100.0 * (ppl / base - 1.0)
