"""The eviction registry: the single source of every eviction policy's name, code, parameter,
state needs, documentation line and default-grid membership, and of the kernel's dispatch.

Adding an eviction policy = writing its module in this folder, its reference implementation in
tests/reference_policies.py and its row in docs/replay-semantics.md (generated: python -m
moesim.policies.doc). A module is an eviction policy when it defines ``NAME`` and either

- hooks the replay kernel calls (``@njit(inline="always")``, state arrays in policies/structures.py):
  ``hit(ob, fo, po, heap, prm, pool, o, tick, requested)`` when resident ``o`` is used (a request hit
  when ``requested``, else a run as a substitute) and ``insert(ob, fo, po, heap, prm, pool, o, tick)``
  making ``o`` resident (returns the victim, -1 when nothing left the pool, NOT_ADMITTED when the policy
  refuses ``o``); a heap policy writes ``priority(count, score, next_req)`` and takes
  ``hit, insert, rekey = heap.hooks(priority)`` (policies/heap.py); a policy whose order is one int64
  key unique among a pool's residents writes ``key(next_req, tick)`` and takes ``hit, insert =
  keyheap.hooks(key)`` (policies/keyheap.py: single-compare sifts);
- or ``pinned(counts, slots, allocation)``: a fixed set resident from the start, never evicted, and
  nothing admitted (static placements).

Optional module attributes: ``DOC`` (one line for tables and help), ``PARAM`` (a ``Param``: the
policy takes ``name:value``, passed to the kernel in slot 0 of its parameter vector), ``PARAMS``
(fixed named parameters with their defaults, in the following slots), ``USES_SCORE`` (the kernel
keeps a decayed router-request score per expert; half-life = slot 0), ``USES_NEXT_REQUEST`` (the
kernel keeps each expert's next request), ``IN_DEFAULT_GRID`` (the sweep's default eviction axis),
``LIBCACHESIM`` (the libCacheSim 0.3.5 class with the same semantics under fetch-all: the tests then
check the kernel against it, per layer and with a global pool, on random and real routing), ``INLINE``
(default True; False: the kernel calls the hooks instead of inlining them, for larger hooks).

Codes are positions in name order; they exist only inside one process's kernel calls (results are
keyed by names).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from types import ModuleType

import numpy as np
from numba import njit

from moesim.errors import MoesimError
from moesim.policies import lists as lists_hooks
from moesim.policies.params import Param

NOT_ADMITTED = -2  # an insert hook's answer when the policy does not admit the object
N_PRM = 4  # width of the kernel's per-policy parameter vector
# columns of FLAGS: what the kernel must do for a policy code
ADMITS, USES_SCORE, USES_NEXT_REQUEST = range(3)


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

    @property
    def pinned(self) -> bool:
        return self.kind == "pinned"

    @property
    def spec(self) -> str:
        """How a user writes it: ``freq[:H]``."""
        return f"{self.name}[:{self.param.symbol}]" if self.param else self.name

    def kernel_params(self, value: float | None) -> np.ndarray:
        vals = ([self.param.default if value is None else float(value)] if self.param else [])
        vals += [v for _, v in self.fixed]
        if len(vals) > N_PRM:
            raise MoesimError(f"eviction {self.name} has {len(vals)} parameters; the kernel takes {N_PRM}")
        return np.array(vals + [0.0] * (N_PRM - len(vals)), np.float64)


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
                            libcachesim=getattr(m, "LIBCACHESIM", None)))
    return tuple(out)


EVICTIONS: tuple[Eviction, ...] = _discover()
BY_NAME: dict[str, Eviction] = {e.name: e for e in EVICTIONS}
FLAGS = np.array([[not e.pinned, e.uses_score, e.uses_next_request] for e in EVICTIONS], np.bool_)


def _list_code(hit) -> int:
    """The code of the policy kept in one list by lists.insert_front and the given hit hook (-1: none)."""
    return next((e.code for e in EVICTIONS if e.kind == "hooks" and getattr(e.module, "INLINE", True)
                 and e.module.hit is hit and e.module.insert is lists_hooks.insert_front
                 and not (e.uses_score or e.uses_next_request)), -1)


def _keyed() -> tuple[int, ModuleType]:
    """The code and module of the one inlined keyed-heap policy (-1 and the list module when there is not
    exactly one: its loop then never runs)."""
    keyed = [e for e in EVICTIONS if e.kind == "keyheap" and getattr(e.module, "INLINE", True)]
    return (keyed[0].code, keyed[0].module) if len(keyed) == 1 else (-1, lists_hooks)


# LRU, FIFO and the keyed heap (Belady): the plain kernel variant runs their requests in loops of their own
# calling these hooks directly (simulator/kernel.py _own_requests)
LIST_MOVE, LIST_STAY = _list_code(lists_hooks.move_to_front), _list_code(lists_hooks.stay)
KEYED, _keyed_module = _keyed()
KEYED_HIT = _keyed_module.move_to_front if _keyed_module is lists_hooks else _keyed_module.hit
KEYED_INSERT = _keyed_module.insert_front if _keyed_module is lists_hooks else _keyed_module.insert


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
    """'lru' -> ('lru', None); 'freq:64' -> ('freq', 64.0); 'static:500' -> ('static', 500.0)."""
    name, _, arg = str(spec).strip().partition(":")
    ev = get(name)
    if not arg:
        return name, None
    if ev.param is None:
        raise MoesimError(f"eviction policy {name!r} takes no parameter (got {spec!r})")
    return name, ev.param.parse(spec, arg)


def help_text() -> str:
    """The -e/--eviction help line of every command."""
    return ("Eviction policy: " + ", ".join(e.spec for e in EVICTIONS)
            + " (moesim policies describes each; docs/replay-semantics.md states the rules).")


# ------------------------------------------------------------------------------------- kernel dispatch


@njit(inline="always")
def _no_hit(ob, fo, po, heap, prm, pool, o, tick, requested):
    pass


@njit(inline="always")
def _no_insert(ob, fo, po, heap, prm, pool, o, tick):
    return NOT_ADMITTED


@njit(inline="always")
def _no_rekey(ob, fo, po, heap, prm, pool, o):
    pass


# Each hook is dispatched by one flat if-chain of inlined calls on a plain int code, the only dispatch
# on policy codes (a plain int code compiles best and caches across processes:
# shared/notes/numba-kernels.md). The chain is written as source and exec'd because numba cannot
# inline a closure called with *args, and a chain of nested inlined closures (one per policy) compiles
# superlinearly in its depth: with 11 policies the kernel's cold compile took 103 s of CPU nested,
# 38 s flat (37 s nested with 7).


def _out_of_line(kind: str, fn, args: str, ret: bool):
    """``fn`` (an inlinable hook) compiled as a function of its own, which the kernel calls."""
    ns = {"f": fn}
    exec(f"def {kind}({args}):\n    {'return ' if ret else ''}f({args})", ns)
    return njit(_nrt=False)(ns[kind])  # type: ignore[call-overload]  # numba's NRT switch is not in its stubs


# A module with INLINE = False has its hooks called rather than inlined into the kernel's loop. Inlined,
# the larger hooks (ARC, Clock, S3-FIFO, Sieve) slowed every policy's replay, their own included: out of
# line, LRU, FIFO, Belady, ARC, S3-FIFO and Sieve replayed 3-14% faster in one process (A/B, same stream;
# README "## Speed"). LFU's heap hooks called instead ran 0.59x: the heap policies stay inlined.
def _hooks(name: str, default, args: str, ret: bool):
    fns = []
    for e in EVICTIONS:
        fn = getattr(e.module, name, default) if not e.pinned else default
        if fn is not default and not getattr(e.module, "INLINE", True):
            fn = _out_of_line(name, fn, args, ret)
        fns.append(fn)
    return fns


def _flat(kind: str, fns: list, args: str, ret: bool):
    """An inlined function ``kind(c, *args)`` calling ``fns[c](*args)``."""
    ns = {f"f{i}": f for i, f in enumerate(fns)} | {"njit": njit}
    kw = "return " if ret else ""
    lines = [f"def {kind}(c, {args}):"]
    for i in range(len(fns) - 1):
        lines.append(f"    {'if' if i == 0 else 'elif'} c == {i}:\n        {kw}f{i}({args})")
    lines.append(f"    {'else:' if len(fns) > 1 else 'if True:'}\n        {kw}f{len(fns) - 1}({args})")
    exec("\n".join(lines), ns)
    return njit(inline="always")(ns[kind])


_HIT_ARGS = "ob, fo, po, heap, prm, pool, o, tick, requested"
_INSERT_ARGS = "ob, fo, po, heap, prm, pool, o, tick"
_REKEY_ARGS = "ob, fo, po, heap, prm, pool, o"
hit = _flat("hit", _hooks("hit", _no_hit, _HIT_ARGS, False), _HIT_ARGS, False)
insert = _flat("insert", _hooks("insert", _no_insert, _INSERT_ARGS, True), _INSERT_ARGS, True)
rekey = _flat("rekey", _hooks("rekey", _no_rekey, _REKEY_ARGS, False), _REKEY_ARGS, False)
