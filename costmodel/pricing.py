"""Which model, quantization and machine price a trace's replay."""

from __future__ import annotations

from moesim.costmodel.hardware import DEFAULT_HARDWARE
from moesim.costmodel.models import find_model
from moesim.costmodel.timing import CostParams, cost_params, load_model_any
from moesim.errors import MoesimError


def cost_for_trace(meta, hw: str | None = None, model: str | None = None, quant: str | None = None,
                   context: int = 0, engine: str | None = None) -> tuple[CostParams | None, str]:
    """Cost parameters for a trace: ``model`` (a preset name or TOML path) or the preset
    matching the trace's model id; ``quant`` or the model's native format; ``hw`` or the
    default machine. Returns (None, why) when no model preset fits the trace."""
    m = load_model_any(model) if model else find_model(meta.model_id)
    if m is None:
        return None, (f"no model preset for {meta.model_id!r}: pass --model NAME|FILE.toml to price the replay "
                      "(moesim models list)")
    if (m.n_experts, m.top_k, len(m.moe_layers)) != (meta.n_experts, meta.top_k, meta.n_layers):
        raise MoesimError(f"model preset {m.name} ({len(m.moe_layers)} MoE layers x {m.n_experts} experts, "
                          f"top-{m.top_k}) does not match the trace ({meta.n_layers} x {meta.n_experts}, "
                          f"top-{meta.top_k})")
    p = cost_params(m, quant, hw or DEFAULT_HARDWARE, context=context, engine=engine)
    return p, f"{p.model} {p.quant} on {p.hw}" + (f" ({p.engine})" if p.engine != "ideal" else "")
