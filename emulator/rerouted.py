"""Rerouting inside the model: the experts the replay's step policy (``--reroute``) chose for a step, with
the gate weights the model applies to them.

The replay records each step's rerouted row (``Decisions.selected``, rank order); a step whose set of
experts did not change keeps the router's row exactly (docs/replay-semantics.md, "Rerouting"), so the
model's output for it is left bit for bit. For a changed step the row's normalized weights follow the
replay's rule for ``--reroute-weights original``: the unbiased scores renormalized over the new set
(softmax of the set's router logits; sigmoid(logit) normalized for sigmoid gating), from the same
float32 candidate logits, in float64. The model applies them scaled as it scales its own: by the
router's own weight sum at that step (1 when the model renormalizes its top-k; DeepSeek's
routed_scaling_factor), or, for a softmax router that does not renormalize (``norm_topk_prob`` false:
Qwen2-MoE, OLMoE), by the new set's share of the softmax over all experts, so each expert gets
exactly the weight the model gives it whenever it is selected.
"""

from __future__ import annotations

import numpy as np

from moesim.errors import MoesimError

BIASED_NEEDS = ("the emulator computes the rerouted experts' weights from the router's logits, which "
                "--reroute-weights biased replaces by biased ones that need each step's residency; emulate "
                "--reroute-weights original")


def changed_rows(selected: np.ndarray, sel: np.ndarray) -> np.ndarray:
    """Indices of the steps whose set of experts the step policy changed; ``selected`` and ``sel`` [T, k]."""
    return np.flatnonzero(np.any(np.sort(selected, axis=1) != np.sort(sel, axis=1), axis=1))


def set_weights(cand: np.ndarray, cand_logits: np.ndarray, ids: np.ndarray, gating: str) -> np.ndarray:
    """Normalized gate weights [n, k] of the experts ``ids`` [n, k] from the steps' candidate logits
    (``cand``/``cand_logits`` [n, M]): the replay's ``original`` rule."""
    match = cand[:, None, :] == ids[:, :, None]          # [n, k, M]
    if not match.any(axis=2).all():
        raise MoesimError("a rerouted expert is not among its step's candidates")
    x = np.take_along_axis(cand_logits.astype(np.float64), match.argmax(axis=2), axis=1)
    if gating == "sigmoid":
        v = 1.0 / (1.0 + np.exp(-x))
    else:
        v = np.exp(x - x.max(axis=1, keepdims=True))
    return v / v.sum(axis=1, keepdims=True)


def model_scale(router_w: np.ndarray, full_logits: np.ndarray, ids: np.ndarray, gating: str,
                norm_topk_prob: bool) -> np.ndarray:
    """[n, 1]: what the model multiplies a step's normalized weights by (module docstring)."""
    if gating == "softmax" and not norm_topk_prob:
        lg = full_logits.astype(np.float64)
        p = np.exp(lg - lg.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        return np.take_along_axis(p, ids.astype(np.int64), axis=1).sum(axis=1, keepdims=True)
    return router_w.astype(np.float64).sum(axis=1, keepdims=True)
