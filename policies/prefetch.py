"""Prefetch policies: which experts to copy ahead of their request. One record per policy is the single
source of its name, code and documentation (as policies/miss.py for miss policies); ``transitions`` learns
the next-layer predictor's table. The kernel's side (issuing, landing, serving) is simulator/prefetch.py;
the rules are in docs/replay-semantics.md ("Prefetch")."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moesim.errors import MoesimError

# prefetch policy codes (plain ints for the kernel)
NONE, PREV_TOKEN, NEXT_LAYER, LOOKAHEAD, ORACLE = range(5)
# overlap modes of the clock (plain ints for the kernel)
OVERLAP_NONE, OVERLAP_LAYER, OVERLAP_CROSS = range(3)
OVERLAPS = ("none", "layer", "cross-layer")

# next-layer: the training prefix when no --prefetch-train trace is given (a fraction of the trace's
# tokens, at most a cap), and how many successors each (layer, expert) keeps
TRAIN_FRACTION = 0.1
TRAIN_MAX_TOKENS = 10_000
SUCCESSORS_PER_K = 2


@dataclass(frozen=True)
class PrefetchPolicy:
    name: str
    code: int
    doc: str
    predicts: str  # what it predicts for step (t, l + D), as docs/replay-semantics.md's table says


PREFETCH_POLICIES: dict[str, PrefetchPolicy] = {p.name: p for p in (
    PrefetchPolicy("none", NONE, "no prefetch", "nothing"),
    PrefetchPolicy("prev-token", PREV_TOKEN, "the experts the previous token (same sequence) selected at the "
                   "target layer", "the experts token t - 1 selected at layer l + D, in rank order (nothing at a "
                   "sequence's first token)"),
    PrefetchPolicy("next-layer", NEXT_LAYER, "the target layer's experts most often selected together with this "
                   "layer's experts (transition counts layer l -> l+D from a training prefix or --prefetch-train)",
                   "the k experts of layer l + D with the largest summed transition counts from the experts "
                   "selected at (t, l) (equal sums: lower id)"),
    PrefetchPolicy("lookahead", LOOKAHEAD, "layer l+1's router applied to layer l's hidden state (the trace's "
                   "lookahead column; depth 1)", "the trace's `lookahead` column at (t, l): layer l+1's router "
                   "applied to layer l's hidden state (D must be 1)"),
    PrefetchPolicy("oracle", ORACLE, "the experts the target layer really selects (the upper bound)",
                   "the experts (t, l + D) really selects, in rank order: the upper bound"),
)}


def get(name: str) -> PrefetchPolicy:
    try:
        return PREFETCH_POLICIES[name]
    except KeyError:
        raise MoesimError(f"unknown prefetch policy {name!r} (known: {', '.join(PREFETCH_POLICIES)})") from None


def overlap_code(name: str) -> int:
    if name not in OVERLAPS:
        raise MoesimError(f"unknown overlap mode {name!r} (known: {', '.join(OVERLAPS)})")
    return OVERLAPS.index(name)


def help_text() -> str:
    return "Prefetch policy: " + "; ".join(f"{p.name} = {p.doc}" for p in PREFETCH_POLICIES.values()) + "."


def default_train_tokens(n_tokens: int) -> int:
    """The next-layer predictor's default training prefix: the first 10% of the trace's tokens (at least
    one, at most 10,000)."""
    return max(1, min(TRAIN_MAX_TOKENS, int(n_tokens * TRAIN_FRACTION)))


def transitions(sel: np.ndarray, n_experts: int, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """The next-layer predictor's table from training routing ``sel`` [T, L, k] (negative ids: padding):
    for each (layer l, expert e), the S = min(2k, E) experts of layer l + depth most often selected in the same
    token as e at layer l (most often first, equal counts: lower id; only counts > 0), as (ids int16
    [L, E, S], -1 padded; counts int64 [L, E, S]). Layers without a layer ``depth`` ahead have no
    successors."""
    T, L, k = sel.shape
    E = n_experts
    S = min(SUCCESSORS_PER_K * k, E)
    ids = np.full((L, E, S), -1, np.int16)
    cnt = np.zeros((L, E, S), np.int64)
    s64 = sel.astype(np.int64)
    for l in range(L - depth):
        a, b = s64[:, l, :], s64[:, l + depth, :]
        pairs = (a[:, :, None] * E + b[:, None, :])[(a[:, :, None] >= 0) & (b[:, None, :] >= 0)]
        table = np.bincount(pairs, minlength=E * E).reshape(E, E)
        order = np.argsort(-table, axis=1, kind="stable")[:, :S]  # stable: equal counts keep the lower id first
        top = np.take_along_axis(table, order, axis=1)
        ids[l] = np.where(top > 0, order, -1)
        cnt[l] = np.where(top > 0, top, 0)
    return ids, cnt
