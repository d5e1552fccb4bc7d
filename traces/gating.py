"""Router gating, vectorized over rows: rank candidates, select the top-k, weigh them.

Conventions (README, "Replay semantics"): candidates are ranked by the score the
router selects on (the logit; for sigmoid gating, sigmoid + selection bias),
equal scores putting the lower expert id first. The k selected experts are
ranked by their gate weight, ties again to the lower id; weights are normalized
to sum to 1 over the k. For every softmax variant the normalized weights are the
softmax over the k selected logits, whether or not the model renormalizes.
"""

from __future__ import annotations

import numpy as np

from moesim.errors import MoesimError


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (np.tanh(0.5 * x) + 1.0)


def rank_order(ids: np.ndarray, scores: np.ndarray, ids_sorted: bool = False) -> np.ndarray:
    """Per row, the permutation that sorts by score descending, equal scores lower id first
    (``ids_sorted``: the caller says the ids are ascending, or wants ties in the given order).

    One stable sort by score is exact when the ids of a row are ascending; otherwise
    only rows holding equal scores need the id tie-break, and ties are rare, so
    those rows alone get the second (full) sort."""
    order = np.argsort(-scores, axis=1, kind="stable")
    if ids_sorted or scores.shape[1] < 2:
        return order
    srt = np.take_along_axis(scores, order, axis=1)
    tied = np.flatnonzero((srt[:, 1:] == srt[:, :-1]).any(axis=1))
    if tied.size:
        sub_ids, sub_scores = ids[tied], scores[tied]
        by_id = np.argsort(sub_ids, axis=1, kind="stable")
        by_score = np.argsort(-np.take_along_axis(sub_scores, by_id, axis=1), axis=1, kind="stable")
        order[tied] = np.take_along_axis(by_id, by_score, axis=1)
    return order


def first_unranked_row(ids: np.ndarray, scores: np.ndarray, ties_by_id: bool = True) -> int:
    """The first row of candidates ids [n, M] whose selection scores [n, M] are not in rank order (a
    score above the one before it, or with ``ties_by_id`` an equal score with a lower id), else n."""
    up = scores[:, 1:] > scores[:, :-1]
    if ties_by_id:
        up |= (scores[:, 1:] == scores[:, :-1]) & (ids[:, 1:] < ids[:, :-1])
    bad = up.any(axis=1)
    return int(np.argmax(bad)) if bad.any() else len(ids)


def rank_rows(ids: np.ndarray, scores: np.ndarray, ids_sorted: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Sort each row by score descending, ties to the lower id. Returns (ids, scores)."""
    order = rank_order(ids, scores, ids_sorted)
    return np.take_along_axis(ids, order, axis=1), np.take_along_axis(scores, order, axis=1)


def selection_scores(logits: np.ndarray, gating: str, bias_rows: np.ndarray | None) -> np.ndarray:
    """The score the router takes its top-k on (float64)."""
    s = np.asarray(logits, dtype=np.float64)
    if gating == "sigmoid":
        s = sigmoid(s)
        if bias_rows is not None:
            s = s + bias_rows
    return s


def group_limited_topk(scores: np.ndarray, k: int, n_group: int, topk_group: int) -> np.ndarray:
    """DeepSeek-V3 selection on dense scores [n, E]: keep the ``topk_group`` groups
    with the best sum of their top-2 scores, then take the top-k inside them."""
    n, e = scores.shape
    grouped = scores.reshape(n, n_group, e // n_group)
    top2 = -np.sort(-grouped, axis=2)[:, :, : min(2, e // n_group)].sum(axis=2)
    ids = np.broadcast_to(np.arange(n_group), top2.shape)
    keep, _ = rank_rows(ids, top2)
    mask = np.zeros((n, n_group), dtype=bool)
    np.put_along_axis(mask, keep[:, :topk_group], True, axis=1)
    masked = np.where(np.repeat(mask, e // n_group, axis=1), scores, -np.inf)
    ranked, _ = rank_rows(np.broadcast_to(np.arange(e), (n, e)), masked)
    return ranked[:, :k]


def gate_weights(sel_logits: np.ndarray, gating: str) -> np.ndarray:
    """Normalized gate weights of the selected experts from their raw logits."""
    x = np.asarray(sel_logits, dtype=np.float64)
    if gating == "sigmoid":
        w = sigmoid(x)
    else:
        w = np.exp(x - x.max(axis=1, keepdims=True))
    return normalize(w)


def normalize(w: np.ndarray) -> np.ndarray:
    w = np.asarray(w, dtype=np.float64)
    total = w.sum(axis=1, keepdims=True)
    if (total <= 0).any() or (w < 0).any():
        raise MoesimError("gate weights must be non-negative with a positive sum over the k selected experts")
    return w / total


def order_selected(sel: np.ndarray, w: np.ndarray, keep_stored: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Rank the selected experts: highest weight first, ties to the lower id
    (``keep_stored``: ties keep the order of ``sel`` as given)."""
    return rank_rows(sel, w, ids_sorted=keep_stored)


def lookup(cand_ids: np.ndarray, cand_vals: np.ndarray, want: np.ndarray, dense: bool = False
           ) -> tuple[np.ndarray, np.ndarray]:
    """Values of ``want`` ids [n, k] within candidate rows [n, M]; second result: found mask.
    ``dense``: the candidate rows are all E experts in id order."""
    if dense:
        return np.take_along_axis(cand_vals, want, axis=1), np.ones(want.shape, dtype=bool)
    match = cand_ids[:, None, :] == want[:, :, None]
    found = match.any(axis=2)
    idx = match.argmax(axis=2)
    return np.take_along_axis(cand_vals, idx, axis=1), found
