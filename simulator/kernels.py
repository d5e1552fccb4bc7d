"""The replay kernels and which one a replay runs.

- ``plain`` (simulator/kernel_plain.py): fetch-all without engine features, compiled per eviction policy
  with its hooks inlined where requests are handled.
- ``ext`` and ``engine`` (simulator/kernel_ext.py): every miss policy, admission, prefetch, the step seam and
  the overlapped clock; ``engine`` also --step-pin, --max-uploads and the low-bit paths. One kernel serves
  every policy kept in a shared structure (lists, heaps, keyed heaps; pinned placements: policies/kinds.py),
  each structure inlined where requests hit, a list's insertion inlined and the other structures' called
  (policies/kinds.py kernel_insert); a custom policy (arc, s3fifo, sieve, clock, ...) gets an ext kernel of
  its own with its hooks inlined. The rarer paths (simulator/paths.py: the step rule, prefetch,
  substitution, copies, resets) are compiled once for every kernel and passed in as function pointers, as
  are the hooks they call (policies/hooks.py ``compiled``: a call through a pointer costs ~40 ns, so the
  hit path never makes one).

Sweeps run every config on the ext kernels (``generic=True``): the default grid needs one kernel.
Each kernel and each policy's compiled hooks are cached on disk in their component's directory
(moesim/jitcache.py) and load in well under a second afterwards.
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

from moesim.jitcache import compile_notice, quiet_numba, specialize
from moesim.policies import kinds, registry
from moesim.policies.hooks import HIT_T, INSERT_T, REKEY_T
from moesim.simulator import kernel_ext, kernel_plain, paths

FAMILIES = ("plain", "ext", "engine")


class Variant(NamedTuple):
    family: str    # one of FAMILIES
    hook_set: str  # policies.registry Eviction.hook_set: the policy whose hooks it runs ("pinned": none)
    step: str = "none"  # the step rule an ext or engine kernel is given (simulator/paths.py STEP_RULES)

    @property
    def name(self) -> str:
        return "_".join(("replay", self.family, re.sub(r"\W", "_", self.hook_set)))


def variant(eviction: str, family: str, step: str = "none") -> Variant:
    """The kernel of ``family`` (simulator/args.py family_of) that replays ``eviction`` (with the step rule
    ``step``: an ext or engine kernel's)."""
    ev = registry.get(eviction)
    if family in ("ext", "engine"):
        return Variant(family, ev.ext_hook_set, step)
    return Variant(family, ev.hook_set)


def every_variant() -> list[Variant]:
    """Every kernel of every eviction policy (what a test session or a warm-up compiles)."""
    every = [variant(e.name, f) for e in registry.EVICTIONS for f in FAMILIES]
    every += [Variant("ext", registry.GENERIC, step) for step in paths.STEP_RULES]  # each step rule compiled
    return list(dict.fromkeys(every))


def _policy_of(hook_set: str) -> registry.Eviction:
    """A policy of the hook set (the first structure kind for the generic one): its arguments type the kernel."""
    if hook_set == registry.GENERIC:
        return next(e for e in registry.EVICTIONS if e.ext_hook_set == registry.GENERIC)
    # (a re-pinning placement's schedule needs its parameter or a trace with domains: a fixed one types the kernel)
    return next(e for e in registry.EVICTIONS if e.hook_set == hook_set and not e.schedules)


@functools.cache
def _signature():
    """The ext kernels' signature: the real argument groups, then the hooks' function-pointer types."""
    import numba

    from moesim.simulator.args import tiny_args

    return numba.types.none(*(numba.typeof(g) for g in tiny_args("lru", "ext")), HIT_T, INSERT_T, REKEY_T,
                            *paths.pointer_types())


@functools.cache
def _ext(family: str, hook_set: str):
    if hook_set == registry.GENERIC:
        h, modules = registry.generic_hooks(), registry.generic_modules()
        insert = kinds.kernel_insert(registry.compiled_hooks(hook_set).insert)
    else:
        ev = _policy_of(hook_set)
        h, modules = ev.hooks(), ev.hook_modules
        insert = h.insert
    bindings = dict(HIT=h.hit, INSERT=insert, ENGINE=family == "engine")
    return specialize(kernel_ext.replay, Variant(family, hook_set).name, bindings, modules, sig=_signature(),
                      _nrt=False)


@functools.cache
def _plain(v: Variant):
    ev = _policy_of(v.hook_set)
    h, called = ev.hooks(), registry.compiled_hooks(ev.hook_set)
    bindings = dict(HIT=h.hit, INSERT=h.insert, INSERT_CALL=called.insert, REKEY_CALL=called.rekey,
                    USES_NEXT=ev.uses_next_request, USES_SCORE=ev.uses_score, ADMITS=not ev.pinned,
                    EXTRA=ev.extra_evictions)
    return specialize(kernel_plain.replay, v.name, bindings, ev.hook_modules, _nrt=False)


_ready: set[Variant] = set()


def ensure(variants) -> None:
    """Compile (or load from the on-disk cache) the kernels of ``variants`` with the real argument types, so
    that replay timings never include compilation; the user is told when that takes a while."""
    todo = [v for v in dict.fromkeys(variants) if v not in _ready]
    if not todo:
        return
    from moesim.simulator.args import tiny_args

    with compile_notice("the replay kernels" if len(todo) > 1 else "the replay kernel"), quiet_numba():
        for v in todo:
            # compiles the kernel and v's step rule (the one-token replay never calls the rule)
            run(v, tiny_args(_policy_of(v.hook_set).name, v.family), check=False)
            _ready.add(v)


def run(v: Variant, args, check: bool = True) -> None:
    """Run the kernel of ``v`` on a replay's arguments (simulator/args.py KernelArgs)."""
    if check and v not in _ready:
        ensure((v,))
    if v.family in ("ext", "engine"):
        _ext(v.family, v.hook_set)(*args, *registry.compiled_hooks(v.hook_set), *paths.pointers(v.step))
    else:
        _plain(v)(*args)


def kernel(v: Variant):
    """A callable running the kernel of ``v`` on a replay's arguments (compiled already: for timing loops)."""
    if v.family not in ("ext", "engine"):
        return _plain(v)
    fn, pointers = _ext(v.family, v.hook_set), (*registry.compiled_hooks(v.hook_set), *paths.pointers(v.step))
    return lambda *args: fn(*args, *pointers)
