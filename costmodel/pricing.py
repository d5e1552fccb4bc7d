"""Which model, quantization and machine price a trace's replay."""

from __future__ import annotations

from moesim.costmodel.hardware import DEFAULT_HARDWARE
from moesim.costmodel.models import find_model, load_model
from moesim.costmodel.timing import CostParams, cost_params
from moesim.errors import MoesimError


def cost_for_trace(meta, hw: str | None = None, model: str | None = None,
                   quant: str | None = None) -> tuple[CostParams | None, str]:
    """Cost parameters for a trace: ``model`` (a preset name or TOML path) or the preset
    matching the trace's model id; ``quant`` or the model's native format; ``hw`` or the
    default machine. Returns (None, why) when no model preset fits the trace."""
    m = load_model(model) if model else find_model(meta.model_id)
    if m is None:
        return None, (f"no model preset for {meta.model_id!r}: pass --model NAME|FILE.toml to price the replay "
                      "(moesim models list)")
    if (m.n_experts, m.top_k) != (meta.n_experts, meta.top_k):
        if model:
            raise MoesimError(f"model preset {m.name} ({m.n_experts} experts, top-{m.top_k}) does not match the "
                              f"trace ({meta.n_experts} experts, top-{meta.top_k})")
        return None, (f"model preset {m.name} (found by the trace's model id) has {m.n_experts} experts, "
                      f"top-{m.top_k}, the trace {meta.n_experts}, top-{meta.top_k}: replayed unpriced")
    if meta.n_layers < m.n_moe_layers:
        # A time per token needs every MoE layer's experts; pricing a partial log would
        # time a model that does not exist, so its counters stand unpriced.
        return None, (f"the trace logs {meta.n_layers} of {m.name}'s {m.n_moe_layers} MoE layers: replayed "
                      "unpriced, since a time per token needs every layer")
    if meta.n_layers > m.n_moe_layers:
        if model:
            raise MoesimError(f"model preset {m.name} has {m.n_moe_layers} MoE layers, the trace "
                              f"{meta.n_layers}")
        return None, (f"model preset {m.name} (found by the trace's model id) has {m.n_moe_layers} MoE layers, "
                      f"the trace {meta.n_layers}: replayed unpriced")
    p = cost_params(m, quant, hw or DEFAULT_HARDWARE)
    return p, f"{p.model} {p.quant} on {p.hw}"
