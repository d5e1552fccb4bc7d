"""The replay kernels and which one a replay runs.

- ``lean`` and ``plain`` (simulator/kernel_plain.py): fetch-all without engine features, compiled per
  eviction policy with its hooks inlined where requests are handled (``lean`` also without a clock, a
  host-RAM tier or a decision record: the loop with the fewest live values, the replay benchmark's).
- ``ext`` (simulator/kernel_ext.py): every miss policy and engine feature, compiled once for all
  policies; a policy's hooks arrive as function pointers (policies/hooks.py ``compiled``).

Sweeps run every config on the ext kernel (``generic=True``): one compile serves the whole grid. Each
kernel and each policy's compiled hooks are cached on disk in their component's directory
(moesim/jitcache.py) and load in well under a second afterwards.
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

from moesim.jitcache import compile_notice, specialize
from moesim.policies import registry
from moesim.policies.hooks import HIT_T, INSERT_T, REKEY_T
from moesim.simulator import kernel_ext, kernel_plain

FAMILIES = ("lean", "plain", "ext")


class Variant(NamedTuple):
    family: str    # one of FAMILIES
    hook_set: str  # policies.registry Eviction.hook_set: the policy whose hooks it runs ("pinned": none)

    @property
    def name(self) -> str:
        return "_".join(("replay", self.family, re.sub(r"\W", "_", self.hook_set)))


def variant(eviction: str, ext: bool, lean: bool, generic: bool = False) -> Variant:
    """The kernel a replay of ``eviction`` runs: ext (any engine feature or miss policy but fetch-all, or
    ``generic``: a sweep's one kernel for every config), else lean (no clock, no host-RAM tier, no decision
    record) or plain."""
    return Variant("ext" if ext or generic else ("lean" if lean else "plain"), registry.get(eviction).hook_set)


def _policy_of(hook_set: str) -> registry.Eviction:
    return next(e for e in registry.EVICTIONS if e.hook_set == hook_set)


@functools.cache
def _ext():
    """The ext kernel, typed with the real argument groups and the hooks' function-pointer types."""
    import numba

    from moesim.simulator.args import tiny_args

    groups = tuple(numba.typeof(g) for g in tiny_args("lru", "ext"))
    return specialize(kernel_ext.replay, "replay_ext", {}, (), sig=numba.types.none(*groups, HIT_T, INSERT_T, REKEY_T),
                      _nrt=False)


@functools.cache
def _plain(v: Variant):
    ev = _policy_of(v.hook_set)
    h, called = ev.hooks(), ev.compiled_hooks()
    bindings = dict(HIT=h.hit, INSERT=h.insert, INSERT_CALL=called.insert, REKEY_CALL=called.rekey,
                    USES_NEXT=ev.uses_next_request, USES_SCORE=ev.uses_score, ADMITS=not ev.pinned,
                    LEAN=v.family == "lean")
    return specialize(kernel_plain.replay, v.name, bindings, ev.hook_modules, _nrt=False)


_ready: set[Variant] = set()


def ensure(variants) -> None:
    """Compile (or load from the on-disk cache) the kernels of ``variants`` with the real argument types, so
    that replay timings never include compilation; the user is told when that takes a while."""
    todo = [v for v in dict.fromkeys(variants) if v not in _ready]
    if not todo:
        return
    from moesim.simulator.args import tiny_args

    with compile_notice("the replay kernels" if len(todo) > 1 else "the replay kernel"):
        for v in todo:
            run(v, tiny_args(_policy_of(v.hook_set).name, v.family), check=False)
            _ready.add(v)


def run(v: Variant, args, check: bool = True) -> None:
    """Run the kernel of ``v`` on a replay's arguments (simulator/args.py KernelArgs)."""
    if check and v not in _ready:
        ensure((v,))
    if v.family == "ext":
        _ext()(*args, *_policy_of(v.hook_set).compiled_hooks())
    else:
        _plain(v)(*args)


def kernel(v: Variant):
    """A callable running the kernel of ``v`` on a replay's arguments (compiled already: for timing loops)."""
    if v.family != "ext":
        return _plain(v)
    fn, hooks = _ext(), _policy_of(v.hook_set).compiled_hooks()
    return lambda *args: fn(*args, *hooks)
