"""PyTorch tracer: forward hooks on a model's router modules, keyed by the true layer index.

``record_router(model, path)`` works on the transformers families in
``families.FAMILIES`` out of the box and on any other PyTorch model when told which
modules are its routers. A hooked module may return the logits alone or, as the
transformers 5 routers do, ``(logits, gate weights, selected ids)``.
"""

from __future__ import annotations

import os
import re
import sys
from contextlib import contextmanager
from typing import Any

import numpy as np

from moesim.errors import MoesimError
from moesim.traces.tracers import families
from moesim.traces.tracers.recorder import Capture, RouterRecorder

TRACER_NAME = "moesim.torch"
TRACER_VERSION = "1"

# mlp.gate / mlp.router (transformers 5); block_sparse_moe.gate (Mixtral in transformers 4)
_ROUTER_NAME = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:mlp|block_sparse_moe)\.(?:gate|router)$")


def _torch():
    try:
        import torch
    except ImportError:
        raise MoesimError("PyTorch is not installed: pip install 'moesim[torch]'") from None
    return torch


def find_routers(model) -> dict[int, Any]:
    """{layer index: router module} for the decoder layers' ``mlp.gate`` / ``mlp.router``.
    A dense layer's MLP has no such child (its projections are ``gate_proj``...)."""
    found = {}
    for name, mod in model.named_modules():
        m = _ROUTER_NAME.search(name)
        if m is None:
            continue
        w = getattr(mod, "weight", None)
        if w is None or w.ndim != 2 or w.shape[0] < 2:
            continue
        layer = int(m.group(1))
        if layer in found:
            raise MoesimError(f"two router modules for layer {layer} (give modules= explicitly)")
        found[layer] = mod
    return found


def _layer_of(name: str, fallback: int) -> int:
    m = (re.search(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)(?:\.|$)", name)
         or re.search(r"(?:^|\.)(\d+)(?:\.|$)", name))
    return int(m.group(1)) if m else fallback


def resolve_modules(model, modules) -> dict[int, Any]:
    """``modules``: None (auto), a list of module names (layer = the index in the name),
    or a dict {layer index: module or module name}."""
    if modules is None:
        found = find_routers(model)
        if not found:
            raise MoesimError("found no router modules (layers.<i>.mlp.gate / mlp.router); name them with modules=")
        return found
    named = dict(model.named_modules())

    def get(x):
        if isinstance(x, str):
            if x not in named:
                raise MoesimError(f"the model has no module named {x!r}")
            return named[x]
        return x

    if isinstance(modules, dict):
        return {int(k): get(v) for k, v in sorted(modules.items())}
    out = {}
    for i, x in enumerate(modules):
        layer = _layer_of(x, i) if isinstance(x, str) else i
        if layer in out:
            raise MoesimError(f"two modules map to layer {layer}; pass a dict {{layer: module}}")
        out[layer] = get(x)
    return dict(sorted(out.items()))


def model_meta(model, routers: dict[int, Any]) -> tuple[dict, dict[int, np.ndarray]]:
    """TraceMeta fields and per-layer selection bias for a known transformers family
    (empty for other models)."""
    config = getattr(model, "config", None)
    fam = families.FAMILIES.get(str(getattr(config, "model_type", "")))
    if fam is None or config is None:
        return {}, {}
    fields = families.gating_meta(config, fam)
    moe_cfg, dense_cfg = families.moe_layer_indices(config, fam)
    n_layers = int(config.num_hidden_layers)
    fields.update(
        family=fam.name,
        dense_layers=[i for i in range(n_layers) if i not in routers],
        bytes_per_expert=families.bytes_per_expert(config, fam),
    )
    if sorted(routers) != moe_cfg:
        fields.setdefault("source", {})["config_moe_layers"] = moe_cfg
    bias = {}
    names = {id(m): n for n, m in model.named_modules()}
    parents = dict(model.named_modules())
    for layer, mod in routers.items():
        b = getattr(mod, "e_score_correction_bias", None)
        if b is None:   # MiniMax-M2 keeps it on the MoE block and passes it to the router
            parent = parents.get(names.get(id(mod), "").rpartition(".")[0])
            b = getattr(parent, "e_score_correction_bias", None)
        if b is not None:
            bias[layer] = b.detach().float().cpu().numpy().astype(np.float64)
    return fields, bias


def _model_id(model) -> str:
    config = getattr(model, "config", None)
    name = getattr(config, "_name_or_path", "") or ""
    return os.path.basename(os.path.normpath(name)) if name else type(model).__name__


class TorchRecorder:
    """Handle yielded by ``record_router``. Set ``domain`` before a forward pass to label
    its tokens; ``tokens``/``sequences`` count what was recorded so far."""

    def __init__(self, model, rec: RouterRecorder, routers: dict[int, Any], token_ids: bool,
                 lookahead: bool = False):
        self.model = model
        self.recorder = rec
        self.routers = routers
        self.domain: str | None = None
        self.phase: str | None = None     # None: prefill for a new sequence, decode when continuing from a cache
        self._token_ids = token_ids
        self._handles: list[Any] = []
        self._pending: dict | None = None
        self._caps: dict[int, Capture] = {}
        self._next_seq = 0
        self._open_seqs: list[int] = []
        self._seen: list[int] = []        # tokens already recorded per open sequence
        order = sorted(routers)
        # lookahead: each MoE layer's next MoE layer's router, run on this layer's router input
        self._next = {a: routers[b] for a, b in zip(order, order[1:])} if lookahead else {}
        self._ahead_running = False

    @property
    def tokens(self) -> int:
        return self.recorder.tokens

    @property
    def sequences(self) -> int:
        return len(self.recorder.sequences)

    @property
    def meta(self):
        return self.recorder.meta

    # -- hooks ----------------------------------------------------------------------------------------
    def attach(self) -> None:
        self._handles.append(self.model.register_forward_pre_hook(self._pre, with_kwargs=True))
        self._handles.append(self.model.register_forward_hook(self._post, with_kwargs=True))
        for layer, mod in self.routers.items():
            self._handles.append(mod.register_forward_hook(self._router_hook(layer)))

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _pre(self, module, args, kwargs):
        torch = _torch()
        ids = kwargs.get("input_ids")
        if ids is None and args and torch.is_tensor(args[0]) and not args[0].is_floating_point():
            ids = args[0]
        embeds = kwargs.get("inputs_embeds")
        if ids is None and embeds is None:
            raise MoesimError("the traced forward pass got neither input_ids nor inputs_embeds")
        shape = tuple(ids.shape if ids is not None else embeds.shape[:2])
        if len(shape) == 1:
            shape = (1, shape[0])
        mask = kwargs.get("attention_mask")
        if mask is not None and mask.ndim == 2:
            mask = mask[:, -shape[1]:].detach().cpu().numpy().astype(bool)
        else:
            mask = np.ones(shape, dtype=bool)
        past = kwargs.get("past_key_values", kwargs.get("cache"))   # renamed "cache" in transformers 5.2x
        past_len = 0
        if past is not None and hasattr(past, "get_seq_length"):
            past_len = int(past.get_seq_length())
        self._pending = {"shape": shape, "mask": mask, "past": past_len,
                         "ids": None if ids is None else ids.reshape(shape).detach().cpu().numpy()}
        self._caps = {}

    def _router_hook(self, layer: int):
        def hook(module, args, output):
            if self._pending is None or self._ahead_running:
                return  # outside a forward pass of the traced model, or our own lookahead call
            logits, sel, w = _router_output(output)
            cap = Capture(logits, sel, w)
            nxt = self._next.get(layer)
            if nxt is not None:
                self._ahead_running = True
                try:
                    a_logits, a_sel, a_w = _router_output(nxt(*args))
                finally:
                    self._ahead_running = False
                cap.ahead_logits, cap.ahead_selected, cap.ahead_weights = a_logits, a_sel, a_w
            self._caps[layer] = cap
        return hook

    def _post(self, module, args, kwargs, output):
        pending, caps = self._pending, self._caps
        self._pending, self._caps = None, {}
        if pending is None:
            return
        B, S = pending["shape"]
        mask = pending["mask"]
        if pending["past"] > 0 and len(self._open_seqs) == B:
            seqs, phase = self._open_seqs, "decode"
        else:
            seqs = list(range(self._next_seq, self._next_seq + B))
            self._next_seq += B
            self._open_seqs, self._seen, phase = seqs, [0] * B, "prefill"
        phase = self.phase or phase
        pos = np.cumsum(mask, axis=1) - 1 + np.asarray(self._seen)[:, None]
        keep = mask.reshape(-1)
        for b in range(B):
            self._seen[b] += int(mask[b].sum())
        for layer, cap in caps.items():
            if cap.logits.shape[0] != B * S:
                raise MoesimError(f"layer {layer}: the router saw {cap.logits.shape[0]} rows for a batch of "
                                  f"{B}x{S} tokens")
            caps[layer] = Capture(*(None if a is None else a[keep] for a in (
                cap.logits, cap.selected, cap.weights, cap.ahead_logits, cap.ahead_selected, cap.ahead_weights)))
        seq = np.repeat(np.asarray(seqs, dtype=np.int32), S)[keep]
        token = pending["ids"].reshape(-1)[keep] if self._token_ids and pending["ids"] is not None else None
        if self._token_ids and token is None:
            token = np.full(int(keep.sum()), -1, dtype=np.int32)
        self.recorder.add(seq=seq, pos=pos.reshape(-1)[keep], captures=caps, token=token, phase=phase,
                          domain=self.domain)


def _router_output(output) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(logits [n, E], selected [n, k] or None, their weights or None) of a router module's output:
    the logits alone, or (logits, gate weights, selected ids) as the transformers 5 routers return."""
    torch = _torch()
    if isinstance(output, (tuple, list)):
        logits = output[0]
        rest = [o for o in output[1:] if torch.is_tensor(o)]
    else:
        logits, rest = output, []
    logits = logits.detach().float().reshape(-1, logits.shape[-1])
    sel = w = None
    ints = [o for o in rest if not o.is_floating_point()]
    floats = [o for o in rest if o.is_floating_point()]
    if ints:
        sel = ints[0].detach().reshape(logits.shape[0], -1).long()
    if floats and sel is not None:
        w = floats[0].detach().float().reshape(logits.shape[0], -1)
        if w.shape[1] == logits.shape[1] and sel.shape[1] != logits.shape[1]:
            w = w.gather(1, sel)   # a router that scatters its weights over all E experts
    return (logits.cpu().numpy(), None if sel is None else sel.cpu().numpy(),
            None if w is None else w.cpu().numpy())


# Families whose router cannot be run on another layer's input by itself: MiniMax-M2's router takes
# its own MoE block's selection bias as an argument.
NO_LOOKAHEAD = {"minimax_m2": "its router takes its MoE block's selection bias as an argument"}


def check_lookahead(model) -> None:
    """Refuse ``lookahead`` for a family where the next layer's router cannot run on this layer's input."""
    fam = str(getattr(getattr(model, "config", None), "model_type", ""))
    if fam in NO_LOOKAHEAD:
        raise MoesimError(f"--lookahead is not supported for {fam}: {NO_LOOKAHEAD[fam]}")


def trace_fields(model, routers: dict[int, Any], *, model_id: str | None = None, family: str | None = None,
                 top_k: int | None = None, gating: str | None = None, source: dict | None = None,
                 **meta_overrides) -> tuple[dict, dict[int, np.ndarray]]:
    """The TraceMeta fields ``record_router`` writes for ``model`` (before the recorder adds the
    layout, M and the selection bias), and the per-layer selection bias."""
    fields, bias = model_meta(model, routers)
    fields.setdefault("family", family or getattr(getattr(model, "config", None), "model_type", None) or "custom")
    fields["model_id"] = model_id or _model_id(model)
    if family:
        fields["family"] = family
    if top_k is not None:
        fields["top_k"] = int(top_k)
    if gating is not None:
        fields["gating"] = gating
    fields["moe_layers"] = sorted(routers)
    if "dense_layers" not in fields and "dense_layers" not in meta_overrides:
        fields["dense_layers"] = []
    src = dict(fields.pop("source", {}))
    src.update(source or {})
    fields["source"] = src
    fields["tracer"] = {"name": TRACER_NAME, "version": TRACER_VERSION, "torch": _torch().__version__,
                        **_transformers_version()}
    fields["synthetic"] = False
    fields.update(meta_overrides)
    return fields, bias


@contextmanager
def record_router(model, path: str | os.PathLike, *, modules=None, model_id: str | None = None,
                  family: str | None = None, top_k: int | None = None, gating: str | None = None,
                  layout: str = "sparse", candidates: int | None = None, domains: list[str] | None = None,
                  token_ids: bool = True, source: dict | None = None, lookahead: bool = False, **meta_overrides):
    """Record the router logits of every forward pass of ``model`` inside the block into
    the trace ``path`` (published when the block exits normally; removed on an error).

    Each forward call traces new sequences (one per batch row) as prefill, unless it
    continues from a KV cache (``past_key_values``/``cache`` holding tokens, as in ``generate``),
    whose tokens are then recorded as decode steps of the same sequences. Padding
    (``attention_mask`` 0) is not recorded. ``modules``: see ``resolve_modules``.
    ``lookahead``: also record, per row, the experts the next MoE layer's router selects when run on
    this layer's router input (the ``lookahead`` column, docs/trace-format.md).
    Other keyword arguments override TraceMeta fields (e.g. ``norm_topk_prob``,
    ``bytes_per_expert``, ``n_shared_experts``).
    """
    if lookahead:
        check_lookahead(model)
    routers = resolve_modules(model, modules)
    fields, bias = trace_fields(model, routers, model_id=model_id, family=family, top_k=top_k, gating=gating,
                                source=source, **meta_overrides)
    rec = RouterRecorder(path, fields, layout=layout, candidates=candidates, domains=domains,
                         selection_bias=bias, lookahead=lookahead)
    handle = TorchRecorder(model, rec, routers, token_ids, lookahead=lookahead)
    handle.attach()
    try:
        yield handle
    except BaseException:
        handle.detach()
        rec.abort()
        raise
    handle.detach()
    rec.close()


def _transformers_version() -> dict:
    mod = sys.modules.get("transformers")   # only when loaded: importing it costs seconds
    return {"transformers": mod.__version__} if mod is not None else {}
