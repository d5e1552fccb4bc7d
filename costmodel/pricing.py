"""Which model, quantization and machine price a trace's replay.

Without ``--quant`` the quantization is the one a user of the model would run on the machine: the model's
native format when it fits the machine (the replayed cache in VRAM, every expert in host RAM, as an
offloading engine keeps them), otherwise the first of the common llama.cpp formats (Q8_0, then Q4_K_M) that
fits; when none fits both, the first whose cache fits in VRAM; when no cache fits, the smallest (and the rows
say the cache does not fit). A sweep prices every cache size of a machine at one quantization, the one chosen
for its largest cache: one model file per machine, as a user runs it.

Qwen3-Next-80B-A3B on the RTX 3090 preset: bf16 (144 GiB of experts) and Q8_0 (76 GiB) exceed the ~60 GiB of
usable host RAM; Q4_K_M (44 GiB) fits, and its 25% cache needs 10.9 GiB of the 21.0 GiB of VRAM the dense
weights leave free.
"""

from __future__ import annotations

from dataclasses import dataclass

from moesim.costmodel.hardware import DEFAULT_HARDWARE, GIB
from moesim.costmodel.models import ModelPreset, find_model
from moesim.costmodel.timing import CostParams, cost_params, load_model_any
from moesim.errors import MoesimError

# The formats tried after the native one, highest precision first: llama.cpp's 8-bit and its most used 4-bit
# recipe (the GGUF quantizations offloading users run on consumer GPUs).
QUANT_LADDER = ("q8_0", "q4_k_m")


@dataclass(frozen=True)
class QuantChoice:
    quant: str
    why: str  # one sentence: given, native (fits), or which formats did not fit


def _fits(m: ModelPreset, quant: str, hw: str, cache_experts: int | None) -> tuple[bool, bool, str]:
    """(cache fits in VRAM, all experts fit in host RAM, a short account of both) for one quantization."""
    p = cost_params(m, quant, hw)
    total = m.n_moe_layers * m.n_experts
    bpe = p.bytes_per_expert
    ram_ok = p.ram_expert_capacity >= total
    vram_ok = cache_experts is None or not p.has_gpu or cache_experts <= p.vram_expert_slots
    parts = []
    if cache_experts is not None and p.has_gpu and not vram_ok:
        parts.append(f"cache {cache_experts * bpe / GIB:.1f} GiB > {p.vram_expert_slots * bpe / GIB:.1f} GiB free VRAM")
    if not ram_ok:
        parts.append(f"experts {total * bpe / GIB:.0f} GiB > {p.ram_expert_capacity * bpe / GIB:.0f} GiB host RAM")
    return vram_ok, ram_ok, ", ".join(parts)


def default_quant(m: ModelPreset, hw: str, cache_experts: int | None = None) -> QuantChoice:
    """The quantization a replay of ``cache_experts`` cached experts (all layers) is priced at when none is given."""
    native_bits = m._scheme(m.native_quant)["expert"]
    ladder = [m.native_quant] + [q for q in QUANT_LADDER
                                 if q in m.quant_names() and m._scheme(q)["expert"] < native_bits]
    checks = [(q, *_fits(m, q, hw, cache_experts)) for q in ladder]
    if checks[0][1] and checks[0][2]:
        return QuantChoice(m.native_quant, f"{m.native_quant}: the model's native format, fits the machine")
    misses = "; ".join(f"{q}: {why}" for q, _, _, why in checks if why)
    for q, vram_ok, ram_ok, _ in checks:
        if vram_ok and ram_ok:
            return QuantChoice(q, f"{q}: the first of {', '.join(ladder)} that fits the machine ({misses})")
    for q, vram_ok, _, _ in checks:
        if vram_ok:
            return QuantChoice(q, f"{q}: the first of {', '.join(ladder)} whose cache fits in VRAM; experts beyond "
                                  f"host RAM are read from NVMe ({misses})")
    return QuantChoice(ladder[-1], f"{ladder[-1]}: the smallest of {', '.join(ladder)}; no cache fits in VRAM "
                                   f"({misses})")


def cost_for_trace(meta, hw: str | None = None, model: str | None = None, quant: str | None = None,
                   engine: str | None = None, cache_experts: int | None = None, context: int = 0,
                   batch: int = 1) -> tuple[CostParams | None, str]:
    """Cost parameters for a trace: ``model`` (a preset name or TOML path) or the preset
    matching the trace's model id; ``quant`` or the default above (for a cache of ``cache_experts``
    experts in all); ``hw`` or the default machine. Returns (None, why) when no model preset fits
    the trace. ``context`` tokens per sequence and ``batch`` sequences size the KV cache that takes VRAM and host
    RAM before the expert tiers (costmodel.timing.cost_params)."""
    cost, note, _ = price_trace(meta, hw, model, quant, engine, cache_experts, context=context, batch=batch)
    return cost, note


def price_trace(meta, hw: str | None = None, model: str | None = None, quant: str | None = None,
                engine: str | None = None, cache_experts: int | None = None, *, context: int = 0, batch: int = 1
                ) -> tuple[CostParams | None, str, str]:
    """``cost_for_trace`` plus a sentence saying how the quantization was chosen ('' when unpriced)."""
    m = load_model_any(model) if model else find_model(meta.model_id)
    if m is None:
        return None, (f"no model preset for {meta.model_id!r}: pass --model NAME|FILE.toml to price the replay "
                      "(moesim models list)"), ""
    if (m.n_experts, m.top_k) != (meta.n_experts, meta.top_k):
        if model:
            raise MoesimError(f"model preset {m.name} ({m.n_experts} experts, top-{m.top_k}) does not match the "
                              f"trace ({meta.n_experts} experts, top-{meta.top_k})")
        return None, (f"model preset {m.name} (found by the trace's model id) has {m.n_experts} experts, "
                      f"top-{m.top_k}, the trace {meta.n_experts}, top-{meta.top_k}: replayed unpriced"), ""
    if meta.n_layers < m.n_moe_layers:
        # A time per token needs every MoE layer's experts; pricing a partial log would
        # time a model that does not exist, so its counters stand unpriced.
        return None, (f"the trace logs {meta.n_layers} of {m.name}'s {m.n_moe_layers} MoE layers: replayed "
                      "unpriced, since a time per token needs every layer"), ""
    if meta.n_layers > m.n_moe_layers:
        if model:
            raise MoesimError(f"model preset {m.name} has {m.n_moe_layers} MoE layers, the trace "
                              f"{meta.n_layers}")
        return None, (f"model preset {m.name} (found by the trace's model id) has {m.n_moe_layers} MoE layers, "
                      f"the trace {meta.n_layers}: replayed unpriced"), ""
    hw = hw or DEFAULT_HARDWARE
    if quant:
        why = f"{quant}: given"
    else:
        choice = default_quant(m, hw, cache_experts)
        quant, why = choice.quant, choice.why
    # the batch sizes the KV cache only: without a context it changes nothing, so one cost serves every batch
    p = cost_params(m, quant, hw, engine=engine, context=context, batch=batch if context else 1)
    note = f"{p.model} {p.quant} on {p.hw}" + (f" ({p.engine})" if p.engine != "ideal" else "")
    if context:
        note += f", {context} tokens of context x batch {batch}"
    return p, note, why
