"""Model side: forward hooks on each MoE layer's router that hand its output to the emulator and
return the outputs the policy leaves (substitute ids, zeroed or renormalized weights).

Every supported transformers 5 family computes a MoE block as ``_, weights, ids = router(h)``
then ``experts(h, ids, weights)``; a forward hook that returns a new (logits, weights, ids) tuple
therefore changes which experts run and how they are weighed, and nothing else."""

from __future__ import annotations

import numpy as np

from moesim.errors import MoesimError
from moesim.policies.miss import OUTCOME_DROP, OUTCOME_SUBSTITUTE

DROP_MODES = ("renormalize", "zero")


def split_output(output, n_experts: int):
    """(logits, weights [n, k], ids [n, k]) of a router's output, else one clear error."""
    if not isinstance(output, (tuple, list)) or len(output) != 3:
        raise MoesimError("the emulator needs routers that return (logits, gate weights, expert ids), as the "
                          "transformers 5 MoE families do")
    logits, weights, ids = output
    if ids.is_floating_point() or weights.shape != ids.shape or logits.shape[-1] != n_experts:
        raise MoesimError("unexpected router output: expected (logits [n, E], weights [n, k], ids [n, k])")
    return logits, weights, ids


def apply_decisions(torch, weights, ids, rows, outcome_cols: np.ndarray, sub_cols: np.ndarray, drop: str):
    """New (weights, ids) for the router's output rows ``rows`` (a LongTensor of the run's tokens in
    the flattened batch). ``outcome_cols``/``sub_cols`` [T, k] are in the router's column order.

    Substituted: the substitute's id with the missed expert's weight. Dropped: weight 0; with
    ``renormalize`` the step's other experts are scaled so the step's weights keep their sum (a
    step without a drop is left bit for bit)."""
    k = ids.shape[-1]
    w2 = weights.reshape(-1, k).clone()
    i2 = ids.reshape(-1, k).clone()
    dev = ids.device
    sub = outcome_cols == OUTCOME_SUBSTITUTE
    if sub.any():
        t, c = np.nonzero(sub)
        r = rows[torch.as_tensor(t, device=rows.device)].to(dev)
        i2[r, torch.as_tensor(c, device=dev)] = torch.as_tensor(sub_cols[t, c].astype(np.int64), device=dev).to(
            i2.dtype)
    dropped = outcome_cols == OUTCOME_DROP
    if dropped.any():
        t = np.flatnonzero(dropped.any(axis=1))
        r = rows[torch.as_tensor(t, device=rows.device)].to(dev)
        keep = torch.as_tensor(~dropped[t], device=dev)
        w = w2[r]
        kept = torch.where(keep, w, torch.zeros_like(w))
        if drop == "renormalize":
            total, left = w.sum(dim=1, keepdim=True), kept.sum(dim=1, keepdim=True)
            scale = torch.where(left > 0, total / torch.where(left > 0, left, torch.ones_like(left)),
                                torch.zeros_like(left))
            kept = kept * scale
        w2[r] = kept
    return w2.view_as(weights), i2.view_as(ids)


class RouterTaps:
    """Forward hooks on the routers; ``handler(ordinal, logits, weights, ids)`` returns None (keep
    the output) or new (weights, ids)."""

    def __init__(self, routers: dict[int, object], n_experts: int, handler):
        self.routers = routers
        self.n_experts = n_experts
        self.handler = handler
        self.handles: list = []

    def __enter__(self):
        for ordinal, layer in enumerate(sorted(self.routers)):
            self.handles.append(self.routers[layer].register_forward_hook(self._hook(ordinal)))
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles = []
        return False

    def _hook(self, ordinal: int):
        def hook(module, args, output):
            logits, weights, ids = split_output(output, self.n_experts)
            new = self.handler(ordinal, logits, weights, ids)
            if new is None:
                return None
            return (logits, *new) if isinstance(output, tuple) else [logits, *new]
        return hook
