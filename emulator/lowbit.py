"""Model side of lowbit:Q: run the requests the replay served at low bit on Q-quantized copies of their experts.

Every supported transformers 5 family keeps a MoE layer's routed experts as one ``experts`` module beside its
router, with stacked [E, out, in] weight tensors, called as ``experts(h, ids, weights)``. A forward hook on it
replaces its output by ``experts(h, ids, w·keep) + experts_Q(h, ids, w·low)``: the full-precision experts weighted
by the requests that run at full precision, plus the same module with its weights swapped for their quantized
copies (emulator/quantize.py) weighted by the low-bit requests only. A layer without low-bit requests is left
bit for bit."""

from __future__ import annotations

from typing import Any

from moesim.emulator.quantize import quantize, tensor_type
from moesim.errors import MoesimError


def experts_of(model, routers: dict[int, Any]) -> dict[int, Any]:
    """{layer: the experts module beside its router} (the router's parent module's ``experts``)."""
    names = {id(m): n for n, m in model.named_modules()}
    out = {}
    for layer, router in routers.items():
        parent = model.get_submodule(names[id(router)].rpartition(".")[0])
        experts = getattr(parent, "experts", None)
        params = [] if experts is None else [p for p in experts.parameters(recurse=False) if p.ndim == 3]
        if not params:
            raise MoesimError("lowbit:Q needs MoE layers whose experts are one module with stacked [E, out, in] "
                              "weights beside the router (the transformers 5 families)")
        out[layer] = experts
    return out


class LowbitExperts:
    """Quantized copies of every layer's expert weights (made once per quantization) and the hooks that use them.
    ``masks[ordinal]``: a bool tensor [tokens, k] in the router's column order (True: run at low bit), set by the
    router handler before the layer's experts run."""

    def __init__(self, torch, model, routers: dict[int, Any]):
        self.torch = torch
        self.experts = experts_of(model, routers)
        self.layers = sorted(self.experts)
        self.copies: dict[tuple[int, str], dict[str, object]] = {}
        self.quant: str | None = None
        self.masks: dict[int, object] = {}
        self.handles: list = []

    def _copy(self, ordinal: int, quant: str) -> dict[str, object]:
        key = (ordinal, quant)
        if key not in self.copies:
            mod = self.experts[self.layers[ordinal]]
            self.copies[key] = {
                name: quantize(self.torch, p, tensor_type(quant, "down" if "down" in name else "gate_up", ordinal,
                                                          len(self.layers)))
                for name, p in mod.named_parameters(recurse=False) if p.ndim == 3}
        return self.copies[key]

    def __call__(self, quant: str | None):
        self.quant = quant
        if quant is not None:
            for i in range(len(self.layers)):
                self._copy(i, quant)
        return self

    def __enter__(self):
        if self.quant is not None:
            for ordinal, layer in enumerate(self.layers):
                self.handles.append(self.experts[layer].register_forward_hook(self._hook(ordinal)))
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles = []
        self.masks = {}
        return False

    def _hook(self, ordinal: int):
        def hook(module, args, output):
            mask = self.masks.pop(ordinal, None)
            if mask is None or not bool(mask.any()) or len(args) != 3:
                return None
            h, ids, weights = args
            low = mask.to(weights.device).view_as(weights)
            zero = self.torch.zeros_like(weights)
            full = module.forward(h, ids, self.torch.where(low, zero, weights))
            saved = {}
            params = dict(module.named_parameters(recurse=False))
            try:
                for name, q in self._copy(ordinal, self.quant).items():
                    saved[name] = params[name].data
                    params[name].data = q
                quantized = module.forward(h, ids, self.torch.where(low, weights, zero))
            finally:
                for name, data in saved.items():
                    params[name].data = data
            return full + quantized
        return hook
