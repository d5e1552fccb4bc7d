"""Predicted against realized: replay the policy an engine ran, with the engine's step semantics, on the trace
of the same run, and compare the hit rate with what the engine's cache counted (docs/verify.md).

The replay is ``moesim.simulator.simulate``; what the engine counted comes from its log
(reports/engine_logs.py). The difference is broken down: the plain stream replay, then each step
semantics the engine has (``step_pin``: a step's hits first and its experts not evicted by its own
misses; ``max_uploads``: at most N experts admitted per layer per step), then what is left, which the
replay does not model (listed per engine).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from moesim.errors import MoesimError
from moesim.jsonable import plain
from moesim.reports.engine_logs import Realized, read_engine_log, windows
from moesim.simulator import SimConfig, simulate
from moesim.simulator.counters import COUNTER_NAMES
from moesim.traces.meta import PHASES
from moesim.traces.routing import Routing, load_routing

HITS, REQ = COUNTER_NAMES.index("hits"), COUNTER_NAMES.index("requests")
MOE_L2_SLOTS = 96  # moe_l2/cache.py DEFAULT_SLOTS_PER_LAYER (0.14.1)
LLAMA_INSERTS = 2  # PR #27861: --moe-expert-cache-inserts defaults to 2
WINDOW = 512       # steps per window when a CSV gives per-step counts (llama.cpp's own interval)
ENGINES = {
    "llama.cpp": "llama.cpp expert cache, ggml-org/llama.cpp PR #27861",
    "moe-l2": "moe-l2 L2 cache, moe_l2/cache.py",
    "csv": "engine counts from a CSV",
}
UNMODELLED = {
    "llama.cpp": [
        "uploads are asynchronous: a miss at decode step t is queued at the end of step t and published at the "
        "end of step t+1, so the expert is resident from step t+2; the replay admits it at once",
        "a victim is chosen when its upload is queued, among slots with no upload in flight",
        "only layers whose experts are in host memory are cached (the engine's 'N layers' at start)",
        "prefill batches neither count nor fill the cache (the replay keeps decode tokens only)",
    ],
    "moe-l2": [
        "a miss is loaded by a background thread: the expert is resident once its load lands, which may be after "
        "later requests; the replay admits it at once",
        "domain pins and preloads (the prompt-domain predictor) are not in the trace",
    ],
    "csv": [],
}


@dataclass
class Verification:
    trace: str
    log: Realized
    engine: str
    config: SimConfig
    tokens: str
    steps: int
    layers: list[int]
    predicted: dict
    realized: dict
    breakdown: list[dict]
    per_layer: list[dict] = field(default_factory=list)
    per_window: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unmodelled: list[str] = field(default_factory=list)

    @property
    def difference(self) -> float:
        return self.realized["hit_rate"] - self.predicted["hit_rate"]

    def document(self) -> dict:
        return plain({"trace": self.trace, "log": self.log.path, "log_format": self.log.format, "engine": self.engine,
                      "engine_config": self.log.engine, "replayed": self.config.label(), "tokens": self.tokens,
                      "steps": self.steps, "layers": self.layers, "predicted": self.predicted,
                      "realized": self.realized, "difference": self.difference, "breakdown": self.breakdown,
                      "per_layer": self.per_layer, "per_window": self.per_window, "notes": self.notes,
                      "not_modelled": self.unmodelled})

    def text(self) -> str:
        p, r = self.predicted, self.realized
        out = [f"verify {self.trace} against {self.log.path} ({self.engine})",
               f"replayed: {self.config.label()}; {self.steps} {'decode ' if self.tokens == 'decode' else ''}steps x "
               f"{len(self.layers)} layers",
               "",
               f"{'':12}{'hit rate':>10}{'hits':>12}{'requests':>12}",
               f"{'realized':12}{_pct(r['hit_rate']):>10}{r['hits']:>12}{r['requests']:>12}",
               f"{'predicted':12}{_pct(p['hit_rate']):>10}{p['hits']:>12}{p['requests']:>12}",
               f"difference  {_pts(self.difference)} (realized - predicted)",
               "",
               "where the difference comes from (replay of each step semantics, then what is left):"]
        prev = None
        width = max(len(b["label"]) for b in self.breakdown) + 2
        for b in self.breakdown:
            delta = "" if prev is None else f"  ({_pts(b['hit_rate'] - prev)})"
            out.append(f"  {b['label']:<{width}}{_pct(b['hit_rate']):>8}{delta}")
            prev = b["hit_rate"]
        out.append(f"  {'engine (realized)':<{width}}{_pct(r['hit_rate']):>8}  ({_pts(self.difference)}: not modelled)")
        for u in self.unmodelled:
            out.append(f"    - {u}")
        if self.per_window:
            out += ["", f"{'steps':>15}{'predicted':>11}{'realized':>10}{'diff':>9}"]
            for w in self.per_window:
                out.append(f"{w['first_step']:>7}..{w['end_step'] - 1:<6}{_pct(w['predicted']):>11}"
                           f"{_pct(w['realized']):>10}{_d(w['difference']):>9}")
        if self.per_layer:
            out += ["", f"{'layer':>6}{'predicted':>11}{'realized':>10}{'diff':>9}"]
            for row in self.per_layer:
                real = row.get("realized")
                out.append(f"{row['layer']:>6}{_pct(row['predicted']):>11}{_pct(real) if real is not None else '-':>10}"
                           f"{_d(row['difference']) if real is not None else '-':>9}")
            if not any(row.get("realized") is not None for row in self.per_layer):
                out.append("(the log gives totals only: realized per layer is not known)")
        for n in self.notes:
            out.append(f"note: {n}")
        return "\n".join(out) + "\n"


def verify(trace, log, *, log_format: str = "auto", eviction: str | None = None, slots: int | None = None,
           budget: float | None = None, step_pin: bool | None = None, max_uploads: int | None = None,
           tokens: str = "auto", layers: str | None = None, allocation: str = "per-layer") -> Verification:
    """Replay ``trace`` (a path or a Routing) the way the engine that wrote ``log`` ran and compare."""
    realized = read_engine_log(log, log_format) if not isinstance(log, Realized) else log
    fmt = realized.format
    notes: list[str] = []
    eng = realized.engine
    eviction = eviction or "lru"
    if slots is None and budget is None:
        if fmt == "llama.cpp" and eng.get("slots"):
            slots = int(eng["slots"])
        elif fmt == "moe-l2":
            slots = MOE_L2_SLOTS
            notes.append(f"slots per layer: moe-l2's default {MOE_L2_SLOTS} (give --slots if the cache had others)")
        else:
            raise MoesimError("give the engine's cache size with --slots N (per layer) or --budget F")
    if step_pin is None:
        step_pin = fmt in ("llama.cpp", "moe-l2")
    if max_uploads is None and fmt == "llama.cpp":
        max_uploads = int(eng.get("max_uploads") or LLAMA_INSERTS)
        if "max_uploads" not in eng:
            notes.append(f"uploads per layer per step: the PR's default {LLAMA_INSERTS} (no 'MoE expert cache enabled' "
                         "line in the log; give --max-uploads if it ran with another)")
    if tokens not in ("auto", "all", "decode"):
        raise MoesimError(f"--tokens must be auto, all or decode, got {tokens!r}")
    if tokens == "auto":
        tokens = "decode" if fmt == "llama.cpp" else "all"
    routing = trace if isinstance(trace, Routing) else load_routing(trace)
    name = str(trace) if not isinstance(trace, Routing) else str(routing.path or routing.meta.model_id)
    keep_layers = _layer_ordinals(routing, layers)
    tok = np.flatnonzero(routing.phase == PHASES.index("decode")) if tokens == "decode" else np.arange(routing.n_tokens)
    if len(tok) == 0:
        raise MoesimError(f"{name}: the trace has no decode tokens (the engine counts decode steps only; --tokens all "
                          "replays every token)")
    steps = realized.steps if realized.steps is not None else len(tok)
    if steps > len(tok):
        kind = "decode " if tokens == "decode" else ""
        raise MoesimError(f"{name}: the log covers {steps} {kind}steps, the trace has {len(tok)}: is it the trace of "
                          "the same run?")
    sub = _subset(routing, tok[:steps], keep_layers)
    def config(pin: bool, cap: int | None) -> SimConfig:
        return SimConfig(eviction=eviction, slots=slots, budget=budget, allocation=allocation, step_pin=pin,
                         max_uploads=cap)

    stages = [("stream replay (a cache simulator's order)", config(False, None))]
    if step_pin:
        stages.append(("+ engine steps (--step-pin)", config(True, None)))
    if max_uploads:
        stages.append((f"+ at most {max_uploads} uploads per layer per step (--max-uploads)",
                       config(bool(step_pin), max_uploads)))
    results = [(label, cfg, simulate(sub, cfg)) for label, cfg in stages]
    label, replayed, res = results[-1]
    hits, req = int(res.counts[:, HITS].sum()), int(res.counts[:, REQ].sum())
    predicted = {"hits": hits, "misses": req - hits, "requests": req, "hit_rate": hits / req if req else math.nan}
    real = {"hits": realized.hits, "misses": realized.misses, "requests": realized.requests,
            "hit_rate": realized.hit_rate}
    breakdown = [{"label": lab, "replayed": cfg.label(), "hit_rate": _rate(r.counts)} for lab, cfg, r in results]
    if realized.requests != req:
        per = realized.requests / (steps * sub.top_k) if steps else math.nan
        notes.append(f"the engine counted {realized.requests} requests, the replay {req} ({steps} steps x "
                     f"{sub.n_layers} layers x top-{sub.top_k}): the engine counted {per:.3g} layers' worth per step"
                     + (f" (it caches {eng['cached_layers']} layers: give those with --layers)"
                        if eng.get("cached_layers") and eng["cached_layers"] != sub.n_layers else "")
                     + "; the rates are compared, not the counts")
    ids = [int(sub.meta.moe_layers[i]) for i in range(sub.n_layers)]
    per_layer = []
    for i, layer in enumerate(ids):
        pr = _rate(res.counts[i:i + 1])
        row: dict[str, Any] = {"layer": layer, "predicted": pr}
        if realized.per_layer is not None:
            h, m = realized.per_layer.get(layer, (0, 0))
            rr = h / (h + m) if h + m else math.nan
            row.update(realized=rr, difference=rr - pr)
        per_layer.append(row)
    if realized.per_layer is not None:
        extra = sorted(set(realized.per_layer) - set(ids))
        if extra:
            notes.append(f"the log counts layer {extra[0]}, which the replay does not have")
    per_window = []
    marks = realized.checkpoints or _csv_checkpoints(realized, steps)
    for a, b, h, m in windows(marks):
        pr = _rate(res.token_counts[a:b])
        rr = h / (h + m) if h + m else math.nan
        per_window.append({"first_step": a, "end_step": b, "predicted": pr, "realized": rr, "difference": rr - pr})
    return Verification(trace=name, log=realized, engine=ENGINES[fmt], config=replayed, tokens=tokens, steps=steps,
                        layers=ids, predicted=predicted, realized=real, breakdown=breakdown, per_layer=per_layer,
                        per_window=per_window if len(per_window) > 1 else [], notes=notes,
                        unmodelled=UNMODELLED[fmt])


def _rate(counts: np.ndarray) -> float:
    req = int(counts[..., REQ].sum())
    return int(counts[..., HITS].sum()) / req if req else math.nan


def _csv_checkpoints(realized: Realized, steps: int) -> list[tuple[int, int, int]]:
    if not realized.per_step:
        return []
    by = np.zeros((steps, 2), np.int64)
    for step, _, h, m in realized.per_step:
        if step >= steps:
            continue
        by[step] += (h, m)
    cum = by.cumsum(axis=0)
    ends = list(range(WINDOW, steps, WINDOW)) + [steps]
    return [(e, int(cum[e - 1, 0]), int(cum[e - 1, 1])) for e in ends]


def _layer_ordinals(routing: Routing, spec: str | None) -> list[int]:
    if spec is None:
        return list(range(routing.n_layers))
    from moesim.traces.importers.moe_infinity import parse_layers

    want: list[int] = []
    for part in spec.split(","):
        a, dash, b = part.strip().partition("-")
        if dash and a.strip().isdigit() and b.strip().isdigit():
            want.extend(range(int(a), int(b) + 1))
        elif part.strip():
            want.append(int(part) if part.strip().isdigit() else -1)
    parse_layers(spec, len(want))  # the syntax errors
    layers = list(routing.meta.moe_layers)
    bad = [x for x in want if x not in layers]
    if bad:
        raise MoesimError(f"--layers names layer {bad[0]}, which is not one of the trace's MoE layers")
    return sorted(layers.index(x) for x in set(want))


def _subset(r: Routing, tok: np.ndarray, lay: list[int]) -> Routing:
    """The routing of some tokens and MoE layers (a replay sees nothing else)."""
    meta = r.meta
    if len(lay) < r.n_layers:
        bias = meta.selection_bias
        meta = meta.replace(moe_layers=tuple(meta.moe_layers[i] for i in lay),
                            selection_bias=None if bias is None else tuple(bias[i] for i in lay))
    take = np.asarray(tok)
    return dataclasses.replace(
        r, meta=meta, seq=r.seq[take], pos=r.pos[take], phase=r.phase[take], domain=r.domain[take],
        token=None if r.token is None else r.token[take], sel=r.sel[take][:, lay], w=r.w[take][:, lay],
        cand=r.cand[take][:, lay], lookahead=None, digest=f"{r.digest}:verify:{len(take)}:{lay}", _memo={})


def _pct(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.2f}%"


def _pts(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{100 * x:+.2f} points"


def _d(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{100 * x:+.2f}"
