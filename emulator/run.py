"""Run a model teacher-forced under cache policies: the baseline pass, closed-loop passes, the
open-loop replay, perplexities and counters."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from moesim.emulator import policy
from moesim.emulator.hooks import DROP_MODES, RouterTaps, apply_decisions
from moesim.emulator.layer_routing import Tokens, layer_rows, routing_of, trace_meta
from moesim.emulator.lowbit import LowbitExperts
from moesim.emulator.perplexity import dppl_pct, perplexity, token_divergence, token_nll
from moesim.emulator.rerouted import changed_rows, model_scale, set_weights
from moesim.errors import MoesimError
from moesim.policies import miss as miss_mod
from moesim.policies.miss import OUTCOME_LOWBIT
from moesim.simulator import SimConfig, SimResult


def always_fetches_first(config: SimConfig) -> bool:
    """The policy always runs the router's first choice (its miss policy fetches or computes it, and no
    reroute may replace it: bias:λ can, keep:J with J >= 1 keeps it): the class in which the gate mass
    a policy loses predicts the perplexity increase (docs/emulator.md; the sweep's rule too)."""
    if config.reroute is not None and not (config.reroute.startswith("keep:")
                                           and float(config.reroute.partition(":")[2]) >= 1):
        return False
    return miss_mod.get(config.miss_name).keeps_first


@dataclass
class EmulationSetup:
    """What a run's numbers depend on besides the policy; ``key`` names it in quality results."""

    model_id: str
    family: str
    model_dir: str | None
    dtype: str
    device: str
    window: int
    layout: str
    candidates: int
    drop: str
    windows: int
    tokens: int
    scored_tokens: int
    text_digest: str
    texts: list[str] = field(default_factory=list)
    domains: list[str | None] = field(default_factory=list)

    @property
    def key(self) -> str:
        doc = json.dumps([self.model_id, self.text_digest, self.dtype, self.window, self.layout, self.candidates,
                          self.drop], separators=(",", ":"))
        return hashlib.blake2b(doc.encode(), digest_size=8).hexdigest()

    def to_dict(self) -> dict:
        return {"model_id": self.model_id, "family": self.family, "model_dir": self.model_dir, "dtype": self.dtype,
                "device": self.device, "window": self.window, "layout": self.layout, "candidates": self.candidates,
                "drop": self.drop, "windows": self.windows, "tokens": self.tokens,
                "scored_tokens": self.scored_tokens, "text_digest": self.text_digest, "texts": self.texts,
                "domains": self.domains, "setup_key": self.key}


@dataclass
class PolicyRun:
    """One policy emulated: closed-loop perplexity and counters, and the open-loop replay."""

    config: SimConfig
    ppl: float
    ppl_baseline: float
    nll: np.ndarray                # per scored token, window after window
    result: SimResult              # closed loop: the policy inside the forward pass
    open_loop: SimResult           # the policy replayed on the unmodified model's routing
    routing: object                # the closed-loop Routing
    drift: float                   # fraction of (token, layer) steps whose selected set differs from the open loop
    emulated: str                  # "forward" or "exact: no substitution, drop or low-bit run in the open loop"
    seconds: float
    kl_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0))   # KL(P_base || P) per scored token
    top1_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))  # argmax P == argmax P_base
    outcome: np.ndarray | None = None      # [T, L, k] rank order (policy.OUTCOME_*); None for the shortcut
    substitute: np.ndarray | None = None   # [T, L, k] the expert run instead of a substituted one, else -1
    selected: np.ndarray | None = None     # [T, L, k] the row each step ran (rank order), with --reroute only
    logits: object = None

    @property
    def dppl_pct(self) -> float:
        return dppl_pct(self.ppl, self.ppl_baseline)

    @property
    def kl(self) -> float:
        """Mean KL divergence (nats) of the next-token distribution from the unmodified model's."""
        return float(np.mean(self.kl_tokens)) if len(self.kl_tokens) else float("nan")

    @property
    def top1_agreement(self) -> float:
        """Share of scored positions whose most likely next token is the unmodified model's."""
        return float(np.mean(self.top1_tokens)) if len(self.top1_tokens) else float("nan")

    def to_dict(self, setup: EmulationSetup | None = None) -> dict:
        c = self.config
        t, o = self.result.totals(), self.open_loop.totals()
        doc = {
            "config": {**c.to_dict(), "key": c.key(), "label": c.label()},
            "ppl": self.ppl, "ppl_baseline": self.ppl_baseline, "dppl_pct": self.dppl_pct,
            "kl": self.kl, "top1_agreement": self.top1_agreement,
            "tokens": int(len(self.nll)), "mass_per_step": t["mass_per_step"],
            "always_fetches_first": always_fetches_first(c),
            "totals": t, "layers": self.result.layer_rows(),
            "open_loop": {"mass_per_step": o["mass_per_step"], "hit_rate": o["hit_rate"],
                          "substitution_rate": o["substitution_rate"], "totals": o,
                          "routing_drift": self.drift,
                          "mass_per_step_error": o["mass_per_step"] - t["mass_per_step"]},
            "emulated": self.emulated, "seconds": self.seconds,
        }
        if setup is not None:
            doc["setup"] = setup.to_dict()
        return doc


def _digest(arrays) -> str:
    h = hashlib.blake2b(digest_size=8)
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
        h.update(b"|")
    return h.hexdigest()


class Emulator:
    """A model and a text, ready to be run under policies. Build it from a loaded transformers model
    and tokenizer (``emulate`` loads them from a directory).

    ``window``: tokens per teacher-forced window (default: the model's context); ``candidates``/
    ``dense``: the scored experts a substitute is chosen from, as in a trace (default: the tracer's
    M); ``drop``: "renormalize" (a dropped expert's weight is spread over the step's other experts,
    as docs/replay-semantics.md says of the drop policy) or "zero" (it is just missing)."""

    def __init__(self, model, tokenizer, texts, domains=None, *, window: int | None = None,
                 max_tokens: int | None = None, candidates: int | None = None, dense: bool = False,
                 drop: str = "renormalize", model_dir: str | os.PathLike | None = None, model_id: str | None = None):
        from moesim.traces.tracers.hf import check_model_dir, hf_model_id, hf_sequences, import_transformers
        from moesim.traces.tracers.texts import source_meta
        from moesim.traces.tracers.torch_hooks import find_routers, trace_fields

        self.torch, _ = import_transformers()
        torch = self.torch
        if drop not in DROP_MODES:
            raise MoesimError(f"unknown drop mode {drop!r} (use {' or '.join(DROP_MODES)})")
        if dense and candidates is not None:
            raise MoesimError("--candidates and --dense exclude each other")
        self.model, self.tokenizer, self.drop = model, tokenizer, drop
        cfg = model.config
        context = int(getattr(cfg, "max_position_embeddings", 0) or 0)
        window = int(window if window is not None else context or 2048)
        if window < 2:
            raise MoesimError(f"--window must be at least 2 tokens, got {window}")
        if context and window > context:
            raise MoesimError(f"--window {window} exceeds the model's context of {context} tokens")
        self.routers = find_routers(model)
        if not self.routers:
            raise MoesimError("found no MoE router modules in the model")
        seqs = hf_sequences(tokenizer, [str(t) for t in texts], domains, window, max_tokens)
        self.seqs = seqs
        if model_id is None:
            # as `moesim trace hf` names it, so quality rows join the sweeps of its traces
            model_id = hf_model_id(model_dir, check_model_dir(model_dir)) if model_dir is not None else None
        src = source_meta([str(t) for t in texts], domains, window, max_tokens, seqs)
        if model_dir is not None:
            src["model_dir"] = str(Path(model_dir).resolve())
        src["dtype"] = str(next(model.parameters()).dtype).replace("torch.", "")
        self.source = src
        fields, bias = trace_fields(model, self.routers, model_id=model_id, source=src)
        self.layout = "dense" if dense else "sparse"
        self.candidates = candidates
        self.meta = trace_meta(fields, bias, layout=self.layout, candidates=candidates)
        self.L = self.meta.n_layers

        lengths = [len(s.tokens) for s in seqs]
        B, S = len(seqs), max(lengths)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
        ids = np.full((B, S), pad, dtype=np.int64)
        mask = np.zeros((B, S), dtype=np.int64)
        for b, s in enumerate(seqs):
            ids[b, : len(s.tokens)] = s.tokens
            mask[b, : len(s.tokens)] = 1
        self.lengths = lengths
        self.device = model.device
        self.input_ids = torch.as_tensor(ids, device=self.device)
        self.attention_mask = torch.as_tensor(mask, device=self.device)
        valid = mask.reshape(-1).astype(bool)
        self.rows = torch.as_tensor(np.flatnonzero(valid), device=self.device)
        labels = [s.domain for s in seqs]
        self.domain_names = sorted({d for d in labels if d is not None})
        dom = np.array([self.domain_names.index(d) if d is not None else -1 for d in labels], dtype=np.int16)
        self.tokens = Tokens(
            seq=np.repeat(np.arange(B, dtype=np.int32), lengths),
            pos=np.concatenate([np.arange(n, dtype=np.int32) for n in lengths]),
            domain=np.repeat(dom, lengths), domain_names=self.domain_names,
            token=ids.reshape(-1)[valid].astype(np.int32))
        self.token_domains = None if not self.domain_names else np.repeat(
            np.array([d or "" for d in labels], dtype=object), lengths)
        self.setup = EmulationSetup(
            model_id=self.meta.model_id, family=self.meta.family,
            model_dir=str(model_dir) if model_dir is not None else None, dtype=src["dtype"],
            device=str(self.device), window=window, layout=self.layout, candidates=self.meta.n_candidates,
            drop=drop, windows=B, tokens=int(sum(lengths)), scored_tokens=int(sum(max(n - 1, 0) for n in lengths)),
            text_digest=_digest([ids.reshape(-1)[valid], np.asarray(lengths), np.asarray(dom)]),
            texts=[str(t) for t in texts], domains=list(src["domains"]))
        if self.setup.scored_tokens == 0:
            raise MoesimError("the text has fewer than 2 tokens: nothing to score")
        self._baseline = None
        self._lowbit: LowbitExperts | None = None

    # ------------------------------------------------------------------------------------ forward passes
    def _forward(self, config: SimConfig | None, trace_out=None, keep_logits: bool = False, compare=None):
        """One teacher-forced pass. config None: the unmodified model. Returns (nll, layer rows,
        per-layer decisions, logits or None, seconds, (KL, top-1 agreement) per scored token against
        ``compare``'s logits or None)."""
        torch = self.torch
        rows_by_layer: list = [None] * self.L
        decided: list = [None] * self.L

        def handler(ordinal, logits, weights, ids):
            k = ids.shape[-1]
            r = self.rows
            lg = logits.detach().reshape(-1, logits.shape[-1])[r].float().cpu().numpy()
            sel = ids.detach().reshape(-1, k)[r].cpu().numpy()
            w = weights.detach().reshape(-1, k)[r].float().cpu().numpy()
            rows = layer_rows(self.meta, ordinal, lg, sel, w)
            rows_by_layer[ordinal] = rows
            if config is None:
                return None
            d = policy.decide_layer(routing_of(self.meta, self.tokens, [rows], [ordinal]), config)
            decided[ordinal] = d
            out_cols = np.empty_like(d.outcome)
            sub_cols = np.empty_like(d.substitute)
            np.put_along_axis(out_cols, rows.perm, d.outcome, axis=1)
            np.put_along_axis(sub_cols, rows.perm, d.substitute, axis=1)
            if d.selected is not None:   # rerouted steps run the replay's row, rank r in column r
                ch = changed_rows(d.selected, rows.sel)
                if ch.size:
                    new = d.selected[ch].astype(np.int64)
                    nw = set_weights(rows.cand[ch], rows.logits[ch], new, self.meta.gating) * model_scale(
                        w[ch], lg[ch], new, self.meta.gating, self.meta.norm_topk_prob)
                    out_cols[ch], sub_cols[ch] = d.outcome[ch], d.substitute[ch]
                    at = r[torch.as_tensor(ch, device=r.device)].to(ids.device)
                    weights = weights.reshape(-1, k).clone()
                    ids = ids.reshape(-1, k).clone()
                    weights[at] = torch.as_tensor(nw, device=ids.device).to(weights.dtype)
                    ids[at] = torch.as_tensor(new, device=ids.device).to(ids.dtype)
            if quant is not None:  # the layer's experts run these requests on their Q-quantized copies
                low = out_cols == OUTCOME_LOWBIT
                mask = torch.zeros(ids.reshape(-1, k).shape, dtype=torch.bool, device=ids.device)
                if low.any():
                    t, c = np.nonzero(low)
                    mask[r[torch.as_tensor(t, device=r.device)].to(ids.device), torch.as_tensor(c, device=ids.device)] \
                        = True
                lowbit.masks[ordinal] = mask
            return apply_decisions(torch, weights, ids, r, out_cols, sub_cols, self.drop)

        quant = config.low_quant if config is not None else None
        lowbit = self._lowbit_experts() if quant is not None else None
        t0 = time.perf_counter()
        with torch.inference_mode(), (lowbit(quant) if lowbit is not None else contextlib.nullcontext()):
            if trace_out is not None:
                out = self._recorded_forward(trace_out, config, handler)
            else:
                with RouterTaps(self.routers, self.meta.n_experts, handler):
                    out = self.model(input_ids=self.input_ids, attention_mask=self.attention_mask, use_cache=False)
            nll = token_nll(torch, out.logits, self.input_ids, self.lengths)
            div = token_divergence(torch, out.logits, compare, self.lengths) if compare is not None else None
        seconds = time.perf_counter() - t0
        if any(x is None for x in rows_by_layer):
            raise MoesimError("a MoE router did not run in the forward pass")
        return nll, rows_by_layer, decided, (out.logits if keep_logits else None), seconds, div

    def _lowbit_experts(self) -> LowbitExperts:
        if self._lowbit is None:
            self._lowbit = LowbitExperts(self.torch, self.model, self.routers)
        return self._lowbit

    def _recorded_forward(self, path, config, handler):
        from moesim.traces.tracers.torch_hooks import record_router

        src = dict(self.source)
        if config is not None:
            src["emulator"] = {"closed_loop": True, "config": config.to_dict(), "config_key": config.key(),
                               "policy": config.label(), "drop": self.drop}
        # the recorder's hooks are registered before the taps, so they see the router's own output
        with record_router(self.model, path, model_id=self.meta.model_id, layout=self.layout,
                           candidates=self.candidates, domains=self.domain_names or None, source=src) as rec:
            rec.domain = self.token_domains
            with RouterTaps(self.routers, self.meta.n_experts, handler):
                return self.model(input_ids=self.input_ids, attention_mask=self.attention_mask, use_cache=False)

    def baseline(self):
        """(nll, full Routing, logits) of the unmodified model on the run's tokens (computed once)."""
        if self._baseline is None:
            nll, rows, _, logits, secs, _ = self._forward(None, keep_logits=True)
            routing = routing_of(self.meta, self.tokens, rows, list(range(self.L)))
            self._baseline = (nll, routing, logits, secs)
        return self._baseline

    @property
    def baseline_ppl(self) -> float:
        return perplexity(self.baseline()[0])

    def run(self, config: SimConfig, *, trace_out=None, shortcut: bool = True, keep_logits: bool = False) -> PolicyRun:
        """Emulate ``config``. ``trace_out``: also write the closed-loop routing as a trace.
        ``shortcut``: when the policy's open-loop replay substitutes and drops nothing, the closed
        loop is the open loop exactly (no output ever changes), so no pass is run."""
        policy.check_config(config)
        config.slots_per_layer(self.meta.n_experts)
        base_nll, base_routing, base_logits, _ = self.baseline()
        t0 = time.perf_counter()
        open_loop = policy.replay(base_routing, config)
        ot = open_loop.totals()
        if shortcut and trace_out is None and ot["substitutions"] == 0 and ot["drops"] == 0 and ot["lowbit"] == 0 \
                and ot["rerouted"] == 0:
            return PolicyRun(config, perplexity(base_nll), perplexity(base_nll), base_nll, open_loop, open_loop,
                             base_routing, 0.0, "exact: no substitution, drop, low-bit run or reroute in the open "
                             "loop",
                             time.perf_counter() - t0, kl_tokens=np.zeros(len(base_nll)),
                             top1_tokens=np.ones(len(base_nll), dtype=bool),
                             logits=base_logits if keep_logits else None)
        nll, rows, decided, logits, _, div = self._forward(config, trace_out=trace_out, keep_logits=keep_logits,
                                                           compare=base_logits)
        assert div is not None
        routing = routing_of(self.meta, self.tokens, rows, list(range(self.L)))
        closed = policy.combine([d.result for d in decided], self.meta.moe_layers)
        drift = float(np.mean(np.any(np.sort(routing.sel, axis=2) != np.sort(base_routing.sel, axis=2), axis=2)))
        return PolicyRun(config, perplexity(nll), perplexity(base_nll), nll, closed, open_loop, routing, drift,
                         "forward", time.perf_counter() - t0, kl_tokens=div[0], top1_tokens=div[1],
                         outcome=np.stack([d.outcome for d in decided], axis=1),
                         substitute=np.stack([d.substitute for d in decided], axis=1), logits=logits,
                         selected=None if config.reroute is None else np.stack([d.selected for d in decided], axis=1))

def load_emulator(model_dir: str | os.PathLike, texts, *, domains=None, dtype: str = "float32",
                  device: str | None = None, window: int | None = None, max_tokens: int | None = None,
                  candidates: int | None = None, dense: bool = False, drop: str = "renormalize",
                  model_id: str | None = None) -> Emulator:
    """An Emulator of a local checkpoint (loaded once; run it under as many policies as needed)."""
    from moesim.traces.tracers.hf import load_local

    model, tok = load_local(model_dir, dtype, device)
    return Emulator(model, tok, texts, domains, window=window, max_tokens=max_tokens, candidates=candidates,
                    dense=dense, drop=drop, model_dir=model_dir, model_id=model_id)


def emulate(model_dir: str | os.PathLike, texts, configs, *, trace_out=None, progress=None, **options):
    """Load a local checkpoint once and emulate each config; returns (Emulator, [PolicyRun]).
    ``trace_out`` (one config only): also write its closed-loop routing as a trace. ``options``:
    load_emulator's."""
    configs = list(configs)
    for c in configs:
        policy.check_config(c)
    if trace_out is not None and len(configs) != 1:
        raise MoesimError("a closed-loop trace is written for one policy at a time")
    em = load_emulator(model_dir, texts, **options)
    runs = []
    for i, c in enumerate(configs):
        runs.append(em.run(c, trace_out=trace_out))
        if progress is not None:
            progress(i + 1, len(configs))
    return em, runs
