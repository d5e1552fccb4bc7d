"""The eviction registry: the single source of every eviction policy's name, code, parameter,
state needs, documentation line and default-grid membership, and of the kernel's dispatch.

Adding an eviction policy = writing its module in this folder, its reference implementation in
tests/reference_policies.py and its row in docs/replay-semantics.md (generated: python -m
moesim.policies.doc); docs/extending.md is the recipe. A module is an eviction policy when it defines
``NAME`` and either

- the hooks the replay kernels call (policies/hooks.py: ``@njit(inline="always")``, state arrays in
  policies/structures.py): ``hit(ob, fo, po, heap, prm, pool, o, tick, requested)`` when resident ``o``
  is used (a request hit when ``requested``, else a run as a substitute) and ``insert(ob, fo, po, heap,
  prm, pool, o, tick)`` making ``o`` resident (returns the victim, -1 when nothing left the pool,
  NOT_ADMITTED when the policy refuses ``o``); a heap policy writes ``priority(prm, count, score, next_req)``
  and takes ``hit, insert, rekey = heap.hooks(priority)`` (policies/heap.py); a policy whose order is one
  int64 key unique among a pool's residents writes ``key(prm, next_req, tick)`` and takes ``hit, insert =
  keyheap.hooks(key)`` (policies/keyheap.py: single-compare sifts);
- or ``pinned(counts, slots, allocation)``: a fixed set resident from the start, never evicted, and
  nothing admitted (static placements).

The kernels are compiled per policy (simulator/kernels.py): a policy's hooks are inlined into the
kernels that replay it and nowhere else, so adding one costs the others nothing.

Optional module attributes: ``DOC`` (one line for tables and help), ``PARAM`` (a ``Param``: the
policy takes ``name:value``, passed to the kernel in slot 0 of its parameter vector), ``PARAMS``
(fixed named parameters with their defaults, in the following slots), ``USES_SCORE`` (the kernel
keeps a decayed router-request score per expert; half-life = slot 0), ``USES_NEXT_REQUEST`` (the
kernel keeps each expert's next request), ``IN_DEFAULT_GRID`` (the sweep's default eviction axis),
``LIBCACHESIM`` (the libCacheSim 0.3.5 class with the same semantics under fetch-all: the tests then
check the kernel against it, per layer and with a global pool, on random and real routing), ``USES_TOKEN``
(the policy's time is in tokens: the replay puts the ticks of one token, L x (E + k), in the last slot of
its own parameters, TOKEN_SLOT, so that a hook's token is tick // that, -1 for the warm set's ticks),
``EXTRA_EVICTIONS_USED`` (the policy evicts beyond its insertions' victims, in its pool's EXTRA_EVICTIONS: the plain
kernel adds them only for such a policy), ``PARAM_REQUIRED`` (no default for its parameter), ``LEARNS`` (a placement
learned from the trace's counts: sweeps/holdout.py), ``schedule(source, values, slots, allocation)`` (a pinned
placement that re-pins along the trace: its initial set and pin events, simulator/pin_events.py).

Codes are positions in name order; they exist only inside one process's kernel calls (results are
keyed by names).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from moesim.errors import MoesimError
from moesim.policies import hooks as hooks_mod
from moesim.policies import kinds, lists
from moesim.policies.params import Param

N_PRM = kinds.N_OWN  # parameters a policy may have (the kernels' vector also holds its structure kind)
TOKEN_SLOT = N_PRM - 1  # a USES_TOKEN policy's slot for the ticks of one token
GENERIC = "generic"  # the hook set of every structure kind (policies/kinds.py)
# --step-pin's modes (simulator/step_pin.py MODE_*): how a policy keeps the step's experts
PIN_NONE, PIN_LIST, PIN_HEAP, PIN_FIXED, PIN_KEYHEAP = range(5)


@dataclass(frozen=True)
class Eviction:
    code: int
    name: str
    module: ModuleType
    kind: str  # "hooks" | "heap" | "keyheap" | "pinned"
    doc: str
    param: Param | None
    fixed: tuple[tuple[str, float], ...]  # PARAMS: fixed named parameters and their defaults
    uses_score: bool
    uses_next_request: bool
    in_default_grid: bool
    libcachesim: str | None = None  # the libCacheSim class with the same semantics under fetch-all (test oracle)
    uses_token: bool = False  # reads the ticks of one token in prm[TOKEN_SLOT]

    @property
    def pinned(self) -> bool:
        return self.kind == "pinned"

    @property
    def pin_mode(self) -> int:
        """How --step-pin keeps the step's experts from its misses' victims (simulator/step_pin.py)."""
        if self.pinned:
            return PIN_FIXED
        if self.kind == "heap":
            return PIN_HEAP
        if self.kind == "keyheap":
            return PIN_KEYHEAP
        return PIN_LIST if getattr(self.module, "insert", None) is lists.insert_front else PIN_NONE

    @property
    def structure(self) -> tuple[int, int]:
        """(kind, variant) of policies/kinds.py: which shared structure keeps the policy's order and which rule
        of it (list: moves on a hit; heap: its priority; keyed heap: its key), or KIND_CUSTOM."""
        if self.pinned:
            return kinds.KIND_PINNED, 0
        if self.kind == "heap":
            return kinds.KIND_HEAP, [e.name for e in EVICTIONS if e.kind == "heap"].index(self.name)
        if self.kind == "keyheap":
            return kinds.KIND_KEYHEAP, [e.name for e in EVICTIONS if e.kind == "keyheap"].index(self.name)
        m = self.module
        if m.insert is lists.insert_front and m.hit in (lists.move_to_front, lists.stay) \
                and not (self.uses_score or self.uses_next_request):
            return kinds.KIND_LIST, int(m.hit is lists.move_to_front)
        return kinds.KIND_CUSTOM, 0

    @property
    def hook_set(self) -> str:
        """The name the kernels compiled for this policy's own hooks go by (pinned placements share one)."""
        return "pinned" if self.pinned else self.name

    @property
    def ext_hook_set(self) -> str:
        """The hook set of its ext kernel: the structure kinds share one (GENERIC), a custom policy has its own."""
        return self.name if self.structure[0] == kinds.KIND_CUSTOM else GENERIC

    def hooks(self) -> hooks_mod.Hooks:
        """The policy's inlinable hooks (no-ops for a pinned placement)."""
        if self.pinned:
            return hooks_mod.Hooks(hooks_mod.no_hit, hooks_mod.no_insert, hooks_mod.no_rekey)
        return hooks_mod.Hooks(self.module.hit, self.module.insert, getattr(self.module, "rekey", hooks_mod.no_rekey))

    @property
    def hook_modules(self) -> tuple[str, ...]:
        """The modules the hooks' compiled code comes from (for numba's cache per component)."""
        return ("moesim.policies.hooks",) if self.pinned else (self.module.__name__,)

    @property
    def spec(self) -> str:
        """How a user writes it: ``freq[:H]``, ``repin:N[,G]``."""
        if not self.param:
            return self.name
        extra = "".join(f"[,{p.symbol}]" for p in self.param.extra)
        if self.param_required:
            return f"{self.name}:{self.param.symbol}{extra}"
        return f"{self.name}[:{self.param.symbol}{extra}]"

    @property
    def param_required(self) -> bool:
        """The eviction is not defined without its parameter (a module's PARAM_REQUIRED: repin:N)."""
        return bool(getattr(self.module, "PARAM_REQUIRED", False))

    @property
    def extra_evictions(self) -> bool:
        """The policy evicts beyond its insertions' victims (a module's EXTRA_EVICTIONS_USED: slru on a hit, lirs),
        counted in its pool's EXTRA_EVICTIONS for the kernels to add."""
        return bool(getattr(self.module, "EXTRA_EVICTIONS_USED", False))

    @property
    def learns(self) -> bool:
        """A placement learned from the trace's request counts (a module's LEARNS: static, static-domain): a sweep
        learns it from a holdout prefix it does not count (sweeps/holdout.py) unless given its own prefix."""
        return bool(getattr(self.module, "LEARNS", False))

    @property
    def schedules(self) -> bool:
        """A pinned placement whose pinned set changes during the replay (a module's ``schedule``: repin,
        static-domain): simulator/args.py turns it into the kernels' pin events."""
        return self.pinned and hasattr(self.module, "schedule")

    def kernel_params(self, value: float | None, ticks_per_token: int = 1) -> np.ndarray:
        """The kernels' parameter vector; ``ticks_per_token``: L x (E + k) of the replay (USES_TOKEN policies)."""
        vals = ([self.param.default if value is None else float(value)] if self.param else [])
        vals += [v for _, v in self.fixed]
        if len(vals) > (TOKEN_SLOT if self.uses_token else N_PRM):
            raise MoesimError(f"eviction {self.name} has {len(vals)} parameters; the kernel takes {N_PRM}")
        vals += [0.0] * (N_PRM - len(vals))
        if self.uses_token:
            vals[TOKEN_SLOT] = float(ticks_per_token)
        return np.array(vals + [float(x) for x in self.structure], np.float64)


def _discover() -> tuple[Eviction, ...]:
    import moesim.policies as pkg

    mods = []
    for info in pkgutil.iter_modules(pkg.__path__):
        m = importlib.import_module(f"moesim.policies.{info.name}")
        if isinstance(getattr(m, "NAME", None), str) and (hasattr(m, "insert") or hasattr(m, "pinned")):
            mods.append(m)
    mods.sort(key=lambda m: m.NAME)
    out = []
    for code, m in enumerate(mods):
        kind = ("pinned" if hasattr(m, "pinned") else "heap" if hasattr(m, "priority")
                else "keyheap" if hasattr(m, "key") else "hooks")
        if kind != "pinned" and not hasattr(m, "hit"):
            raise ImportError(f"eviction module {m.__name__} defines insert but no hit hook")
        out.append(Eviction(code=code, name=m.NAME, module=m, kind=kind, doc=getattr(m, "DOC", "").strip(),
                            param=getattr(m, "PARAM", None), fixed=tuple(getattr(m, "PARAMS", ())),
                            uses_score=bool(getattr(m, "USES_SCORE", False)),
                            uses_next_request=bool(getattr(m, "USES_NEXT_REQUEST", False)),
                            in_default_grid=bool(getattr(m, "IN_DEFAULT_GRID", False)),
                            libcachesim=getattr(m, "LIBCACHESIM", None),
                            uses_token=bool(getattr(m, "USES_TOKEN", False))))
    return tuple(out)


EVICTIONS: tuple[Eviction, ...] = _discover()
BY_NAME: dict[str, Eviction] = {e.name: e for e in EVICTIONS}


def generic_hooks() -> hooks_mod.Hooks:
    """The structure kinds' hooks (policies/kinds.py), over every heap and keyed heap policy's rule."""
    return _generic()


def generic_modules() -> tuple[str, ...]:
    """What the structure kinds' compiled hooks are made of (numba's cache per component)."""
    return ("moesim.policies.kinds",) + tuple(e.module.__name__ for e in EVICTIONS if e.kind in ("heap", "keyheap"))


@functools.cache
def _generic() -> hooks_mod.Hooks:
    return kinds.generic_hooks([e.module.priority for e in EVICTIONS if e.kind == "heap"],
                               [e.module.key for e in EVICTIONS if e.kind == "keyheap"])


def compiled_hooks(hook_set: str) -> hooks_mod.Hooks:
    """A hook set's hooks compiled as functions of their own (kernels call them through function pointers, or
    directly on their rarer paths), compiled or loaded once per process."""
    return _compiled(hook_set)


@functools.cache
def _compiled(hook_set: str) -> hooks_mod.Hooks:
    if hook_set == GENERIC:
        return hooks_mod.compiled(GENERIC, generic_hooks(), generic_modules())
    ev = next(e for e in EVICTIONS if e.hook_set == hook_set)
    return hooks_mod.compiled(hook_set.replace("-", "_"), ev.hooks(), ev.hook_modules)


def names() -> list[str]:
    return [e.name for e in EVICTIONS]


def libcachesim_twins() -> dict[str, str]:
    """Eviction name -> the libCacheSim class the tests check it against."""
    return {e.name: e.libcachesim for e in EVICTIONS if e.libcachesim}


def default_evictions() -> list[str]:
    return [e.name for e in EVICTIONS if e.in_default_grid]


def get(name: str) -> Eviction:
    try:
        return BY_NAME[name]
    except KeyError:
        raise MoesimError(f"unknown eviction policy {name!r} (known: {', '.join(names())})") from None


def parse_eviction(spec: str) -> tuple[str, float | None]:
    """'lru' -> ('lru', None); 'freq:64' -> ('freq', 64.0); 'static:500' -> ('static', 500.0); 'repin:64,8' ->
    ('repin', 64.0) (eviction_values has the rest)."""
    name, values = _values(spec)
    return name, None if values is None else values[0]


def eviction_values(spec: str) -> tuple[float, ...] | None:
    """Every value of the eviction's parameter, its extra ones' defaults filled in ('repin:64' -> (64.0, 1.0));
    None without a parameter."""
    return _values(spec)[1]


def canonical_eviction(spec: str) -> str:
    """The one spelling of an eviction and its values (trailing extra values at their defaults left out), so that
    equal configs hash equally: 'repin:64.0,1' -> 'repin:64'."""
    name, values = _values(spec)
    if values is None:
        return name
    ev = get(name)
    vals = list(values)
    while len(vals) > 1 and ev.param is not None and vals[-1] == ev.param.extra[len(vals) - 2].default:
        vals.pop()
    return f"{name}:" + ",".join(f"{v:g}" for v in vals)


def _values(spec: str) -> tuple[str, tuple[float, ...] | None]:
    name, _, arg = str(spec).strip().partition(":")
    ev = get(name)
    if not arg:
        return name, None
    if ev.param is None:
        raise MoesimError(f"eviction policy {name!r} takes no parameter (got {spec!r})")
    return name, ev.param.parse_all(spec, arg)


def help_text() -> str:
    """The -e/--eviction help line of every command."""
    return ("Eviction policy: " + ", ".join(e.spec for e in EVICTIONS)
            + " (moesim policies describes each; docs/replay-semantics.md states the rules).")
