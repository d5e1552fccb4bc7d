"""The three hooks an eviction policy gives the replay kernels, how the kernels get them, and what a pinned
placement gives instead.

``hit(ob, fo, po, heap, prm, pool, o, tick, requested)``: resident ``o`` is used (a request hit when
``requested``, else a run as a substitute); ``insert(ob, fo, po, heap, prm, pool, o, tick)``: make ``o``
resident, returning the victim, -1 when nothing left the pool, or NOT_ADMITTED when the policy refuses
``o``; ``rekey(ob, fo, po, heap, prm, pool, o)``: recompute a resident expert's priority after every
score was rescaled (heap policies). A policy module writes them ``@njit(inline="always")``.

The kernels take them two ways (simulator/kernels.py): the plain kernels, compiled per policy, inline them
where requests are handled; the generic ext kernel, compiled once, calls them through function pointers
(``compiled``: each hook compiled as a function of its own, cached per policy, typed HIT_T, INSERT_T,
REKEY_T). So a policy's hook bodies are compiled a few times, never once per feature or call site.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from numba import njit, types

NOT_ADMITTED = -2  # an insert hook's answer when the policy does not admit the object

# the kernels' state arrays (simulator/args.py State): objs, objf, pools, heap, and the parameter vector
_ARRAYS = (types.Array(types.int32, 2, "C"), types.Array(types.float64, 2, "C"), types.Array(types.int64, 2, "C"),
           types.Array(types.float64, 2, "C"), types.Array(types.float64, 1, "C"))
HIT_SIG = types.none(*_ARRAYS, types.int64, types.int64, types.int64, types.boolean)
INSERT_SIG = types.int64(*_ARRAYS, types.int64, types.int64, types.int64)
REKEY_SIG = types.none(*_ARRAYS, types.int64, types.int64)
HIT_T, INSERT_T, REKEY_T = (types.FunctionType(s) for s in (HIT_SIG, INSERT_SIG, REKEY_SIG))


@njit(inline="always")
def no_hit(ob, fo, po, heap, prm, pool, o, tick, requested):
    pass


@njit(inline="always")
def no_insert(ob, fo, po, heap, prm, pool, o, tick):
    return NOT_ADMITTED


@njit(inline="always")
def no_rekey(ob, fo, po, heap, prm, pool, o):
    pass


class Hooks(NamedTuple):
    hit: Any
    insert: Any
    rekey: Any


# Templates of the compiled hooks: HOOK is bound to a policy's inlinable hook (moesim.jitcache.specialize).
HOOK: Any = None


def _hit(ob, fo, po, heap, prm, pool, o, tick, requested):
    HOOK(ob, fo, po, heap, prm, pool, o, tick, requested)


def _insert(ob, fo, po, heap, prm, pool, o, tick):
    return HOOK(ob, fo, po, heap, prm, pool, o, tick)


def _rekey(ob, fo, po, heap, prm, pool, o):
    HOOK(ob, fo, po, heap, prm, pool, o)


def compiled(name: str, inline: Hooks, modules: tuple[str, ...]) -> Hooks:
    """A policy's hooks each compiled (or loaded from numba's cache) as a function of its own, for the kernels
    that call them through function pointers; ``name`` names the cache files, ``modules`` the policy's
    source (its component)."""
    from moesim.jitcache import specialize

    out = []
    for kind, template, sig, hook in (("hit", _hit, HIT_SIG, inline.hit),
                                      ("insert", _insert, INSERT_SIG, inline.insert),
                                      ("rekey", _rekey, REKEY_SIG, inline.rekey)):
        out.append(specialize(template, f"{kind}_{name}", {"HOOK": hook}, modules, sig=sig, _nrt=False))
    return Hooks(*out)
