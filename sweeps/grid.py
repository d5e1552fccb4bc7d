"""Sweep grids: axes (from a TOML file and/or command-line flags) -> the list of configs to replay.

The default grid (only a budget given) is the 6 evictions (all but static-layers) x 5 miss policies
{fetch-all, threshold:0.15, first-choice, substitute, cpu} x admission {none, 0.5} = 60 combinations,
of which 36 are replayed per cache size, plus the llama.cpp preset (static-layers + cpu): 37 rows.
Left out:

- admission where it cannot act (it would replay identically without it): fetch-all and cpu never
  substitute, static never admits (15 configs);
- substitute without admission under a non-static eviction (5 configs): the cold cache never receives
  an expert, so every request is dropped (substituted mass 1 per step, 0% hits) — the fastest and
  most useless row of any table. Asking for them explicitly (--miss substitute --admit none) keeps them;
- cpu under lfu, freq, fifo and belady (4 configs): nothing is ever cached, so it is one replay whatever
  the eviction ("every expert computed on the CPU", llama.cpp --cpu-moe); it is kept once, under lru,
  and labelled "no cache / cpu". static + cpu (the most requested experts pinned, the rest on the CPU)
  is kept.

The named presets and the speed-up baseline (default: the fetch-all preset) are always added, and, in the
default grid (default eviction and miss axes), three prefetch variants under fetch-all (PREFETCH_VARIANTS):
lru + oracle, lru + next-layer and belady + oracle (the lower bound on time per token of a policy that runs
every selected expert: the offline eviction with the perfect prefetcher). A prefetch axis (``prefetches``,
--prefetch) replaces them by every eviction x miss x admission x prefetch.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from dataclasses import dataclass, field
from typing import Any

from moesim.errors import MoesimError
from moesim.files import read_toml
from moesim.policies import miss as miss_mod
from moesim.policies import registry
from moesim.simulator.config import STEP_PIN_REFUSED, SimConfig

DEFAULT_ADMITS = (None, 0.5)
# The config every speed-up divides by (sweeps/ranking.py): a preset name or "EVICTION / MISS [/ admit β]".
DEFAULT_BASELINE = "fetch-all"

# The fetch-all preset uses LRU: it is what offloading engines without a policy of their own run
# (an LRU expert cache, e.g. Mixtral-offloading) and the eviction libCacheSim verifies most directly.
PRESETS: dict[str, dict] = {
    "quality-first": {"eviction": "freq", "miss": "threshold:0.15", "admit": 0.5},
    "speed-first": {"eviction": "freq", "miss": "first-choice", "admit": 0.5},
    "fetch-all": {"eviction": "lru", "miss": "fetch-all", "admit": None},
    # llama.cpp places experts per layer (--n-cpu-moe / -ot keep whole layers' stacked expert tensors on the
    # CPU), so its preset pins whole layers; per-expert pinning (static + cpu) is in the default grid.
    "llama.cpp": {"eviction": "static-layers", "miss": "cpu", "admit": None},
}

# TOML keys (singular or plural) -> axis name
_AXIS_KEYS = {
    "budget": "budgets", "budgets": "budgets",
    "slots": "slots",
    "eviction": "evictions", "evictions": "evictions",
    "miss": "misses", "misses": "misses",
    "theta": "thetas", "thetas": "thetas",
    "admit": "admits", "admits": "admits",
    "allocation": "allocations", "allocations": "allocations",
    "batch": "batches", "batches": "batches",
    "hw": "hws",
    "quant": "quants",
    "prefetch": "prefetches", "prefetches": "prefetches",
    "reroute": "reroutes", "reroutes": "reroutes",
}
_SCALAR_KEYS = ("model", "engine", "baseline", "admission", "warm", "warmup_tokens", "reset_per_sequence",
                "prefetch_depth", "holdout",
                "reroute_pool", "reroute_resident", "reroute_weights",
                "overlap", "step_pin", "max_uploads", "lowbit_share", "lowbit_quant", "context", "speculative",
                "accept")
# Prefetch variants of the default grid (eviction, prefetch), under fetch-all; belady + oracle is the bound.
PREFETCH_VARIANTS = (("lru", "oracle"), ("lru", "next-layer"), ("belady", "oracle"))
# Rerouting variants of the default grid (eviction, reroute), under fetch-all: the second study's training-free
# rerouting and the engines' cache priors (docs/replay-semantics.md, "Rerouting"); added when the trace keeps
# candidate scores.
REROUTE_VARIANTS = tuple((e, r) for e in ("lru", "freq") for r in ("bias:0.1", "bias:0.25", "bias:0.5", "keep:2"))
LOWER_BOUND = ("belady", "fetch-all", "oracle")
# The engine profile each named preset is priced with (others: the grid's engine, default ideal).
PRESET_ENGINES = {"llama.cpp": "llama.cpp"}


@dataclass
class Grid:
    """The axes of a sweep. ``None`` on a policy axis means "the default axis"."""

    budgets: list[float] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    evictions: list[str] | None = None
    misses: list[str] | None = None
    thetas: list[float] = field(default_factory=list)  # adds threshold:θ to the miss axis
    admits: list[float | None] | None = None
    allocations: list[str] = field(default_factory=lambda: ["per-layer"])
    batches: list[int] = field(default_factory=lambda: [1])
    hws: list[str | None] = field(default_factory=lambda: [None])
    model: str | None = None
    engine: str | None = None  # engine profile pricing the grid (the llama.cpp preset always uses llama.cpp's)
    context: int = 0  # tokens of context per sequence: sizes the KV cache out of VRAM and host RAM (docs/costmodel.md)
    speculative: int = 0  # drafted tokens each step verifies per sequence (every config of the grid, baseline too)
    accept: float | None = None  # the fraction of them accepted
    quants: list[str | None] = field(default_factory=lambda: [None])
    warm: bool = False
    warmup_tokens: int = 0
    reset_per_sequence: bool = False
    step_pin: bool = False  # engine step semantics (docs/replay-semantics.md)
    max_uploads: int | None = None  # at most this many fetched experts admitted per layer per step
    lowbit_share: float | None = None  # share of the slots holding low-bit copies (tiered residency)
    lowbit_quant: str | None = None  # their quantization
    presets: bool = True  # add the named presets to every group (the API's simulate turns it off)
    prefetches: list[str] | None = None  # None: no prefetch, plus PREFETCH_VARIANTS when presets are added
    prefetch_depth: int = 1
    prefetch_train: str | None = None
    overlap: str | None = None  # None: each engine profile's
    baseline: str = DEFAULT_BASELINE  # the speed-up reference, added to every group
    reroutes: list[str | None] | None = None  # None: no rerouting, plus REROUTE_VARIANTS when presets are added
    reroute_pool: int | None = None
    reroute_resident: str = "cache"
    reroute_weights: str = "original"
    scored: bool = True  # the traces keep candidate scores (the default grid's reroute rows need them)
    admission: str = "always"  # which fetched experts every row but the baseline admits (SimConfig.admission)
    # the fraction of each trace's tokens learned placements learn from, not counted (sweeps/holdout.py; None: its
    # default when the grid has one)
    holdout: float | None = None

    def override(self, **axes) -> Grid:
        """Command-line flags replace whole axes (None or an empty tuple: keep the file's)."""
        changes: dict[str, Any] = {}
        for name, value in axes.items():
            if value is None or (isinstance(value, (list, tuple)) and not value):
                continue
            if name not in {f.name for f in dataclasses.fields(self)}:
                raise MoesimError(f"unknown sweep axis {name!r}")
            changes[name] = list(value) if isinstance(value, (list, tuple)) else value
        if "budgets" in changes and "slots" not in changes:
            changes["slots"] = []  # --budget on the command line replaces a file's cache sizes
        if "slots" in changes and "budgets" not in changes:
            changes["budgets"] = []
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Planned:
    """One replay of a sweep: the config and the cost choice (hw, quant)."""

    config: SimConfig
    hw: str | None
    quant: str | None


def canonical(config: SimConfig) -> SimConfig:
    """Drop the admission threshold where it cannot act (no substitution, or no admission),
    so configs that replay identically share one key."""
    if config.admit is not None and (not config.substitutes or config.pinned):
        return dataclasses.replace(config, admit=None)
    return config


def baseline_policy(spec: str = DEFAULT_BASELINE) -> tuple[str, str, float | None]:
    """(eviction, miss, admit) of a baseline: a preset name (fetch-all, quality-first, ...) or a policy
    written as the tables print it, "EVICTION / MISS [/ admit β]" (spaces optional: lru/fetch-all), or a
    label as ``baseline_label`` writes it ("lru / fetch-all (fetch-all preset)")."""
    spec = str(spec).strip()
    if spec.endswith(" preset)") and " (" in spec:
        spec = spec[: spec.rindex(" (")]
    if spec in PRESETS:
        p = PRESETS[spec]
        return p["eviction"], p["miss"], p["admit"]
    parts = [x.strip() for x in spec.split("/")]
    if len(parts) not in (2, 3) or not all(parts):
        raise MoesimError(f"bad baseline {spec!r}: give a preset ({', '.join(PRESETS)}) or EVICTION/MISS[/admit β], "
                          "e.g. lru/fetch-all or freq/threshold:0.15/admit 0.5")
    admit = None
    if len(parts) == 3:
        a = parts[2].removeprefix("admit").strip()
        try:
            admit = float(a)
        except ValueError:
            raise MoesimError(f"bad baseline {spec!r}: the third part is the admission threshold, "
                              "e.g. 'admit 0.5'") from None
    c = canonical(SimConfig(eviction=parts[0], miss=parts[1], admit=admit, slots=1))
    return c.eviction, c.miss, c.admit


def baseline_label(spec: str = DEFAULT_BASELINE) -> str:
    """How tables and files name the baseline: 'lru / fetch-all (fetch-all preset)' or 'freq / fetch-all'
    (``baseline_policy`` reads both back)."""
    ev, miss, admit = baseline_policy(spec)
    policy = " / ".join([ev, miss] + ([f"admit {admit:g}"] if admit is not None else []))
    names = [n for n, p in PRESETS.items() if (p["eviction"], p["miss"], p["admit"]) == (ev, miss, admit)]
    return policy + (f" ({names[0]} preset)" if names else "")


def baseline_of(config: SimConfig, spec: str = DEFAULT_BASELINE) -> SimConfig:
    """The baseline policy at the config's cache size, allocation, batch, start and clock (without
    prefetch): its speed-up reference."""
    ev, miss, admit = baseline_policy(spec)
    return canonical(dataclasses.replace(config, eviction=ev, miss=miss, admit=admit, admission="always",
                                         prefetch="none",
                                         prefetch_depth=1, prefetch_train=None, reroute=None, reroute_pool=None,
                                         reroute_resident="cache", reroute_weights="original",
                                         step_pin=config.step_pin and eviction_pins(ev)))


def eviction_pins(eviction: str) -> bool:
    """Whether --step-pin is defined for this eviction (a sweep's --step-pin leaves the others unpinned; their
    labels say so)."""
    return registry.parse_eviction(eviction)[0] not in STEP_PIN_REFUSED


def tier_quant(g: Grid, miss: str) -> str | None:
    """The low-bit tier's quantization for a config of the grid: lowbit:Q misses run at their own Q, which the
    tier then takes (one quantization for every low-bit run)."""
    if g.lowbit_share is None:
        return None
    return miss_mod.miss_quant(miss) or g.lowbit_quant


def never_cached(config: SimConfig) -> bool:
    """A cold cache nothing ever enters: no pinning, and a miss policy that never fetches with no
    background admission. Every request misses whatever the eviction policy."""
    if config.pinned or config.warm or config.prefetch != "none":
        return False
    return config.miss == "cpu" or (config.miss in ("substitute", "drop") and config.admit is None)


def replay_twin(config: SimConfig) -> SimConfig:
    """A config that replays identically (same counters, same clock): never-cached configs do not
    depend on the eviction policy, so they share the LRU replay."""
    return dataclasses.replace(config, eviction="lru") if never_cached(config) else config


def expand(config_axes: Grid) -> list[Planned]:
    """Every config of the grid (deduplicated, in a stable order), the presets and the speed-up baseline."""
    g = config_axes
    if not g.budgets and not g.slots:
        raise MoesimError("give a cache size: --budget F or --slots N (or budgets/slots in the --config file)")
    misses = list(miss_mod.default_misses() if g.misses is None else g.misses) + [f"threshold:{t:g}" for t in g.thetas]
    evictions = list(registry.default_evictions() if g.evictions is None else g.evictions)
    admits = list(DEFAULT_ADMITS if g.admits is None else g.admits)
    sizes = [("budget", b) for b in g.budgets] + [("slots", s) for s in g.slots]
    out: dict[tuple, Planned] = {}
    # never-cached cpu configs replay alike under every eviction: the default grid keeps one (lru if asked for)
    unpinned = [e for e in evictions if not registry.get(registry.parse_eviction(e)[0]).pinned]
    cpu_eviction = "lru" if "lru" in unpinned else (unpinned[0] if unpinned else None)

    def add(cfg: SimConfig, hw, quant):
        cfg = canonical(cfg)
        out.setdefault((cfg.key(), hw, quant), Planned(cfg, hw, quant))

    def make(size, allocation, batch, eviction, miss, admit, prefetch="none", reroute=None) -> SimConfig:
        kind, value = size
        pf = {} if prefetch == "none" else {"prefetch": prefetch, "prefetch_depth": g.prefetch_depth,
                                            "prefetch_train": g.prefetch_train if prefetch == "next-layer" else None}
        rr = {} if reroute is None else {"reroute": reroute, "reroute_pool": g.reroute_pool,
                                         "reroute_resident": g.reroute_resident, "reroute_weights": g.reroute_weights}
        return SimConfig(eviction=eviction, miss=miss, admit=admit, admission=g.admission, allocation=allocation,
                         batch=batch,
                         warm=g.warm, warmup_tokens=g.warmup_tokens, reset_per_sequence=g.reset_per_sequence,
                         overlap=g.overlap, step_pin=g.step_pin and eviction_pins(eviction), max_uploads=g.max_uploads,
                         lowbit_share=g.lowbit_share, lowbit_quant=tier_quant(g, miss), speculative=g.speculative,
                         accept=g.accept, **pf, **rr, **{kind: value})

    prefetches = ["none"] if g.prefetches is None else list(g.prefetches)
    reroutes = [None] if g.reroutes is None else list(g.reroutes)

    for hw, quant, size, allocation, batch in itertools.product(g.hws, g.quants, sizes, g.allocations, g.batches):
        for eviction, miss, admit, prefetch, reroute in itertools.product(evictions, misses, admits, prefetches,
                                                                          reroutes):
            cfg = make(size, allocation, batch, eviction, miss, admit, prefetch, reroute)
            if g.misses is None and never_cached(cfg):
                if cfg.miss == "substitute":
                    continue  # drops every expert: not a policy anyone runs (explicit --miss keeps it)
                if cfg.miss == "cpu" and cfg.eviction != cpu_eviction:
                    continue  # nothing cached: the same replay under every eviction, kept once
            add(cfg, hw, quant)
        for p in PRESETS.values() if g.presets else ():
            add(make(size, allocation, batch, p["eviction"], p["miss"], p["admit"]), hw, quant)
        variants = g.presets and g.prefetches is None and g.evictions is None and g.misses is None
        for eviction, prefetch in PREFETCH_VARIANTS if variants else ():
            add(make(size, allocation, batch, eviction, "fetch-all", None, prefetch), hw, quant)
        for eviction, reroute in REROUTE_VARIANTS if variants and g.reroutes is None and g.scored else ():
            add(make(size, allocation, batch, eviction, "fetch-all", None, reroute=reroute), hw, quant)
        add(baseline_of(make(size, allocation, batch, "lru", "fetch-all", None), g.baseline), hw, quant)
    return list(out.values())


# ---------------------------------------------------------------------------------------------- parsing


def check_holdout(value, where: str = "--holdout") -> float:
    """A holdout fraction: 0 (learn in sample) up to, not including, 1."""
    h = float(value)
    if not (math.isfinite(h) and 0.0 <= h < 1.0):
        raise MoesimError(f"{where}: holdout must be a fraction in [0, 1), got {value!r}")
    return h


def frange(start: float, stop: float, step: float) -> list[float]:
    """start, start+step, ... up to stop inclusive (within float noise), rounded to 10 digits."""
    if not all(math.isfinite(x) for x in (start, stop, step)) or step <= 0 or stop < start:
        raise MoesimError(f"bad range start={start:g} stop={stop:g} step={step:g}: need step > 0 and stop >= start")
    n = int(math.floor((stop - start) / step + 1e-9)) + 1
    if n > 100_000:
        raise MoesimError(f"range start={start:g} stop={stop:g} step={step:g} has {n} values; too many")
    return [round(start + i * step, 10) for i in range(n)]


def _number(text, what: str, integer: bool):
    """A finite number (a whole one if ``integer``) from a flag or a TOML value; nan and inf are refused."""
    kind = "a whole number" if integer else "a finite number"
    if isinstance(text, bool):
        raise MoesimError(f"bad {what} {text!r}: expected {kind}")
    if integer and isinstance(text, int):
        return text
    try:
        v = float(text)
    except (TypeError, ValueError, OverflowError):
        raise MoesimError(f"bad {what} {text!r}: expected {kind}") from None
    if not math.isfinite(v) or (integer and v != int(v)):
        raise MoesimError(f"bad {what} {text!r}: expected {kind}")
    return int(v) if integer else v


def parse_values(values, what: str, integer: bool = False, allow_none: bool = False) -> list:
    """Axis values from flags or TOML: numbers, 'none', 'START:STOP:STEP' strings, comma lists, or a
    TOML table {start, stop, step}."""
    if values is None:
        return []
    if isinstance(values, dict):
        unknown = set(values) - {"start", "stop", "step"}
        if unknown or len(values) != 3:
            raise MoesimError(f"{what}: a range needs exactly start, stop and step (got {sorted(values)})")
        vals = frange(*(_number(values[k], what, False) for k in ("start", "stop", "step")))
        return [_number(v, what, integer) if integer else v for v in vals]
    if not isinstance(values, (list, tuple)):
        values = [values]
    out = []
    for v in values:
        if isinstance(v, str) and "," in v:
            out += parse_values(v.split(","), what, integer, allow_none)
            continue
        if isinstance(v, dict):
            out += parse_values(v, what, integer, allow_none)
            continue
        if allow_none and (v is None or (isinstance(v, str) and v.strip().lower() in ("none", "off", ""))):
            out.append(None)
            continue
        if isinstance(v, str) and v.count(":") == 2:
            a, b, c = (_number(x, what, False) for x in v.split(":"))
            vals = frange(a, b, c)
            out += [_number(x, what, integer) for x in vals] if integer else vals
            continue
        if isinstance(v, bool):
            raise MoesimError(f"bad {what} {v!r}: expected a number")
        out.append(_number(v, what, integer))
    return list(dict.fromkeys(out))  # de-duplicated, order kept


def _strings(values, what: str) -> list[str]:
    if isinstance(values, str):
        values = values.split(",")
    if not isinstance(values, (list, tuple)) or not all(isinstance(v, str) for v in values):
        raise MoesimError(f"{what}: expected a string or a list of strings")
    return list(dict.fromkeys(v.strip() for v in values if v.strip()))


def axis(name: str, values) -> list:
    """Parse one axis given by flags or a file."""
    if name == "budgets":
        return parse_values(values, "budget")
    if name == "slots":
        return parse_values(values, "slots", integer=True)
    if name == "batches":
        return parse_values(values, "batch", integer=True)
    if name == "admits":
        return parse_values(values, "admission threshold", allow_none=True)
    if name == "thetas":
        return parse_values(values, "threshold θ")
    if name == "prefetches":
        from moesim.policies import prefetch as prefetch_mod

        if isinstance(values, (list, tuple)):  # repeated flags may each hold a comma list
            values = [x for v in values for x in (v.split(",") if isinstance(v, str) else [v])]
        names = _strings(values, "prefetch")
        for n in names:
            prefetch_mod.get(n)
        return names
    if name == "reroutes":
        from moesim.policies import reroute as reroute_mod

        if isinstance(values, (list, tuple)):
            values = [x for v in values for x in (v.split(",") if isinstance(v, str) else [v])]
        out: list[str | None] = []
        for v in _strings(values, "reroute"):
            out.append(None if v == "none" else v)
            if v != "none":
                reroute_mod.parse_reroute(v)
        return out
    return _strings(values, name)


def load_toml(path: str | os.PathLike) -> Grid:
    """A grid from a TOML file (keys at top level or under [sweep]); see docs/sweep.md."""
    doc = read_toml(path, "sweep file")
    if isinstance(doc.get("sweep"), dict):
        doc = doc["sweep"]
    return grid_from_doc(doc, str(path))


def grid_from_doc(doc: dict, path: str = "sweep grid") -> Grid:
    """A grid from the keys of a sweep TOML file, as a dict."""
    grid = Grid()
    known = sorted(set(_AXIS_KEYS) | set(_SCALAR_KEYS))
    changes: dict[str, Any] = {}
    for key, value in doc.items():
        if key in _AXIS_KEYS:
            changes[_AXIS_KEYS[key]] = axis(_AXIS_KEYS[key], value)
        elif key == "prefetch_depth":
            changes[key] = _number(value, key, integer=True)
        elif key == "holdout":
            changes[key] = check_holdout(_number(value, key, integer=False), path)
        elif key in ("model", "engine", "baseline", "overlap", "lowbit_quant", "admission"):
            if not isinstance(value, str):
                raise MoesimError(f"{path}: {key} must be a string")
            changes[key] = value
        elif key in ("warm", "reset_per_sequence", "step_pin"):
            if not isinstance(value, bool):
                raise MoesimError(f"{path}: {key} must be true or false")
            changes[key] = value
        elif key in ("warmup_tokens", "max_uploads", "context", "speculative"):
            changes[key] = _number(value, key, integer=True)
        elif key in ("lowbit_share", "accept"):
            changes[key] = _number(value, key, integer=False)
        else:
            raise MoesimError(f"{path}: unknown sweep key {key!r} (known: {', '.join(known)})")
    try:
        return dataclasses.replace(grid, **changes)
    except TypeError as exc:
        raise MoesimError(f"{path}: {exc}") from None


def _values(x) -> list | None:
    """A flag's or keyword's values: None (not given) stays None; a scalar becomes a list."""
    if x is None:
        return None
    if isinstance(x, (str, int, float)):
        return [x]
    return list(x)


def grid_from_options(config=None, *, budgets=None, slots=None, evictions=None, misses=None, thetas=None,
                      admits=None, allocations=None, batches=None, warm=None, warmup_tokens=None,
                      reset_per_sequence=None, hws=None, model=None, quants=None, engine=None,
                      presets=True, baseline=None, prefetches=None, prefetch_depth=None, prefetch_train=None,
                      overlap=None, step_pin=None, max_uploads=None, lowbit_share=None, lowbit_quant=None,
                      context=None, speculative=None, accept=None, reroutes=None, reroute_pool=None,
                      reroute_resident=None, reroute_weights=None, admission=None, holdout=None) -> Grid:
    """The sweep grid of the CLI and the API alike: ``config`` (a TOML path or a dict of its keys, or
    None), then every option given (not None) replaces its axis. Axis values are scalars or lists
    (numbers, 'START:STOP:STEP' ranges, 'none' for no admission); an explicitly empty ``misses`` keeps
    only the ``thetas``."""
    if isinstance(config, dict):
        grid = grid_from_doc(config)
    else:
        grid = load_toml(config) if config else Grid()

    def ax(name, v):
        v = _values(v)
        return axis(name, v) if v else None

    misses_l = _values(misses)
    if misses_l is not None and not misses_l:
        grid = dataclasses.replace(grid, misses=[])
    admits_l = _values(admits)
    if admits_l is not None:
        admits_l = ["none" if a is None else a for a in admits_l]
    return grid.override(budgets=ax("budgets", budgets), slots=ax("slots", slots),
                         evictions=ax("evictions", evictions), misses=ax("misses", misses_l),
                         thetas=ax("thetas", thetas), admits=ax("admits", admits_l),
                         allocations=_values(allocations), batches=ax("batches", batches), warm=warm,
                         warmup_tokens=warmup_tokens, reset_per_sequence=reset_per_sequence, hws=_values(hws),
                         model=model, quants=_values(quants), engine=engine, presets=presets,
                         baseline=baseline, prefetches=ax("prefetches", prefetches), prefetch_depth=prefetch_depth,
                         prefetch_train=prefetch_train, overlap=overlap, step_pin=step_pin, max_uploads=max_uploads,
                         lowbit_share=lowbit_share, lowbit_quant=lowbit_quant, context=context,
                         speculative=speculative, accept=accept, reroutes=ax("reroutes", reroutes),
                         reroute_pool=reroute_pool, reroute_resident=reroute_resident, reroute_weights=reroute_weights,
                         admission=admission, holdout=None if holdout is None else check_holdout(holdout))
