"""Tracers: record router logits from real models into moesim traces.

- ``record_router(model, path, ...)``: a context manager that hooks a PyTorch model's
  router modules (transformers families or modules you name) and writes a trace;
- ``trace_hf(model_dir, texts, out)``: teacher-forced passes of a local transformers
  checkpoint (``moesim trace hf``);
- ``trace_llama(gguf, texts, out)``: the same through llama.cpp (``moesim trace llama``).

torch/transformers and llama-cpp-python are optional extras, imported only when a
tracer runs.
"""

from __future__ import annotations


def __getattr__(name):
    if name == "record_router":
        from moesim.traces.tracers.torch_hooks import record_router
        return record_router
    if name == "trace_hf":
        from moesim.traces.tracers.hf import trace_hf
        return trace_hf
    if name == "trace_llama":
        from moesim.traces.tracers.llama import trace_llama
        return trace_llama
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["record_router", "trace_hf", "trace_llama"]
