"""Layer-to-layer predictability of routing: how well the experts a token uses at MoE layer l
predict the ones it uses at layer l+1 (the signal a `next-layer` prefetcher uses), against
predicting layer l+1's most popular experts and against reusing the previous token's experts
at layer l+1 (the `prev-token` signal). Definitions: docs/coupling.md."""

from __future__ import annotations

import numpy as np

from moesim.errors import MoesimError
from moesim.traces.routing import Routing

_BLOCK = 2048  # test tokens scored at once: bounds the [n, E] score temporary
PREDICTORS = ("next-layer", "next-layer-best", "frequency", "prev-token", "lookahead", "chance")


def transition_counts(sel: np.ndarray, n_experts: int) -> np.ndarray:
    """int64 [L-1, E, E]: ``C[l, d, e]`` = steps whose token selected expert d at MoE layer l and
    expert e at layer l+1 (padding ids < 0 are not counted)."""
    T, L, k = sel.shape
    E = int(n_experts)
    out = np.zeros((max(L - 1, 0), E, E), dtype=np.int64)
    s = sel.astype(np.int64)
    for lay in range(L - 1):
        a, b = s[:, lay, :, None], s[:, lay + 1, None, :]
        ok = (a >= 0) & (b >= 0)
        flat = (a * E + b)[ok]
        out[lay] = np.bincount(flat, minlength=E * E).reshape(E, E)
    return out


def next_layer_scores(trans: np.ndarray, popularity: np.ndarray) -> np.ndarray:
    """float64 [L-1, E, E]: P(e at l+1 | d at l) from transition counts, each row normalized; a row
    never seen in training falls back to layer l+1's popularity. Summing a step's rows scores l+1's
    experts (the next-layer predictor)."""
    rows = trans.sum(axis=2, keepdims=True).astype(np.float64)
    pop = popularity[1:].astype(np.float64)
    pop = pop / np.maximum(pop.sum(axis=1, keepdims=True), 1.0)
    return np.where(rows > 0, trans / np.maximum(rows, 1.0), pop[:, None, :])


def _top(scores: np.ndarray, n: int, tiebreak: np.ndarray) -> np.ndarray:
    """[rows, n] ids of the n best scores per row; ties go to the more popular expert, then lower id."""
    E = scores.shape[1]
    key = scores + tiebreak[None, :]
    if n >= E:
        return np.argsort(-key, axis=1, kind="stable")
    part = np.argpartition(-key, n - 1, axis=1)[:, :n]
    return part


def _covered(pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    """bool [rows, k]: which of the true experts are among the predicted ones."""
    return (true[:, :, None] == pred[:, None, :]).any(axis=2)


def layer_coupling(r: Routing, train_tokens: int | None = None, predict: int | None = None,
                   trace: str | None = None, layers: tuple[int, int] | None = None) -> dict:
    """Predictability of layer l+1's experts, learned on the first ``train_tokens`` tokens (in (seq,
    pos) order; default: half of them) and measured on the rest. Each predictor names ``predict``
    experts (default k) for layer l+1 of a test token; ``recall`` is the share of the k experts the
    router then selects that were named (with ``predict`` = k it is also the precision),
    ``weighted_recall`` the share of their gate weight, ``beyond_frequency`` (recall - r_f) / (1 - r_f)
    with r_f the frequency predictor's recall. ``layers`` (first, last): only the MoE layers whose
    original index lies in that range. ``next-layer`` scores each expert e of l+1 by the sum over
    the step's experts d at l of P(e | d), ``next-layer-best`` by their maximum."""
    keep = list(range(r.n_layers))
    if layers is not None:
        keep = [i for i, x in enumerate(r.meta.moe_layers) if layers[0] <= x <= layers[1]]
    moe_layers = [int(r.meta.moe_layers[i]) for i in keep]
    sel, w = r.sel[:, keep], r.w[:, keep]
    look = r.lookahead[:, keep] if r.lookahead is not None else None
    T, L, k = sel.shape
    E = r.n_experts
    n = k if predict is None else int(predict)
    if not 1 <= n <= E:
        raise MoesimError(f"--predict must be between 1 and E={E}, got {n}")
    if L < 2:
        raise MoesimError("layer coupling needs at least two MoE layers" + ("" if layers is None else
                                                                            f" in {layers[0]}..{layers[1]}"))
    n_train = T // 2 if train_tokens is None else int(train_tokens)
    if not 1 <= n_train < T:
        raise MoesimError(f"--train-tokens must be between 1 and {T - 1} (the trace has {T} tokens), got {n_train}")
    train = sel[:n_train]
    pop = r.request_counts(n_train)[keep]  # [L, E]
    trans = transition_counts(train, E)
    cond = next_layer_scores(trans, pop)
    # popularity as a tie-break below any transition difference
    tieb = pop.astype(np.float64) / (np.maximum(pop.sum(axis=1, keepdims=True), 1) * 1e6)
    test = np.arange(n_train, T)
    prev_ok = (r.seq[test] == r.seq[test - 1]) & (r.pos[test] == r.pos[test - 1] + 1)
    has_la = look is not None
    names = [p for p in PREDICTORS if p != "lookahead" or has_la]
    hit = {p: np.zeros(L - 1) for p in names}
    mass = {p: np.zeros(L - 1) for p in names}
    steps = {p: np.zeros(L - 1) for p in names}
    for lay in range(L - 1):
        freq_pred = _top(pop[lay + 1][None, :].astype(np.float64), n, tieb[lay + 1])
        for start in range(0, len(test), _BLOCK):
            t = test[start:start + _BLOCK]
            true, tw = sel[t, lay + 1].astype(np.int64), w[t, lay + 1].astype(np.float64)
            src = sel[t, lay].astype(np.int64)
            rows_p = cond[lay][np.maximum(src, 0)]  # [n, k, E]: P(e at l+1 | each expert of the step)
            preds = {
                "next-layer": _top(rows_p.sum(axis=1), n, tieb[lay + 1]),
                "next-layer-best": _top(rows_p.max(axis=1), n, tieb[lay + 1]),
                "frequency": np.broadcast_to(freq_pred, (len(t), n)),
            }
            pt = prev_ok[start:start + _BLOCK]
            preds["prev-token"] = sel[t - 1, lay + 1].astype(np.int64)[:, :n]
            if look is not None:
                preds["lookahead"] = look[t, lay].astype(np.int64)[:, :n]
            for p, pred in preds.items():
                rows = pt if p == "prev-token" else (pred[:, 0] >= 0 if p == "lookahead" else slice(None))
                cov = _covered(pred[rows], true[rows])
                hit[p][lay] += cov.sum()
                mass[p][lay] += (cov * tw[rows]).sum()
                steps[p][lay] += cov.shape[0]
        steps["chance"][lay] = 1.0
        hit["chance"][lay] = min(n, E) / E * k
        mass["chance"][lay] = min(n, E) / E
    out_layers = []
    for lay in range(L - 1):
        row: dict[str, float | int | None] = {"layer": moe_layers[lay], "next": moe_layers[lay + 1]}
        for p in names:
            row[p] = _ratio(hit[p][lay], steps[p][lay] * k)
        out_layers.append(row)
    summary = {}
    fr_rec = _ratio(hit["frequency"].sum(), steps["frequency"].sum() * k)
    for p in names:
        tot_steps = steps[p].sum() if p != "chance" else float(L - 1)
        rec = _ratio(hit[p].sum(), tot_steps * k)
        summary[p] = {
            "recall": rec,
            "weighted_recall": _ratio(mass[p].sum(), tot_steps),
            # share of what popularity leaves unpredicted that this predictor names
            "beyond_frequency": None if rec is None or fr_rec is None or fr_rec >= 1 else (rec - fr_rec) / (1 - fr_rec),
            "steps": int(steps[p].sum()) if p != "chance" else None,
        }
    nl, fr = summary["next-layer"]["recall"], summary["frequency"]["recall"]
    return {
        "trace": trace or (str(r.path) if r.path is not None else None),
        "model": r.meta.model_id,
        "synthetic": r.synthetic,
        "tokens": T, "train_tokens": n_train, "test_tokens": T - n_train,
        "n_layers": L, "experts": E, "top_k": k, "predict": n,
        "predictors": summary,
        "lift_over_frequency": None if nl is None or not fr else nl / fr,
        "layers": out_layers,
    }


def _ratio(a: float, b: float) -> float | None:
    return float(a) / float(b) if b > 0 else None


def coupling_trace(path, train_tokens: int | None = None, predict: int | None = None,
                   layers: tuple[int, int] | None = None) -> dict:
    from moesim.traces.decode_cache import load_decoded

    return layer_coupling(load_decoded(path), train_tokens, predict, trace=str(path), layers=layers)


__all__ = ["layer_coupling", "coupling_trace", "transition_counts", "next_layer_scores", "PREDICTORS"]
