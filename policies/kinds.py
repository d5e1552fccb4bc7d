"""Structure kinds: one set of hooks for every policy whose order is one of the shared structures.

Most policies keep their order in a structure of this folder and differ only in a small rule: the list
policies (lists.py: lru moves a used expert to the head, fifo does not), the heap policies (heap.py: lfu
and freq, each a ``priority``) and the keyed heap policies (keyheap.py: belady, a ``key``); a pinned
placement has no hooks at all. For them the ext kernel is compiled once (simulator/kernels.py): its hooks
are the ``generic_hooks`` below, which read the policy's kind and variant from two slots of the parameter
vector (``PRM_KIND``, ``PRM_VARIANT``; policies/registry.py ``Eviction.kernel_params`` fills them) and
inline each structure once. Any other policy (a ``custom`` kind: arc, s3fifo, sieve, clock, ...) gets an ext
kernel of its own with its hooks inlined.
"""

from __future__ import annotations

from numba import njit

from moesim.policies import heap, keyheap, lists
from moesim.policies.hooks import NOT_ADMITTED, Hooks

KIND_CUSTOM, KIND_LIST, KIND_HEAP, KIND_KEYHEAP, KIND_PINNED = range(5)
KINDS = ("custom", "list", "heap", "keyheap", "pinned")
N_OWN = 4  # slots of the parameter vector a policy's own parameters may use
PRM_KIND, PRM_VARIANT = N_OWN, N_OWN + 1  # then its kind and its variant (the move flag, the rule's index)
N_PRM = N_OWN + 2


def _chain(name: str, fns: list, args: str):
    """An inlinable ``name(prm, ...)`` calling ``fns[int(prm[PRM_VARIANT])](prm, ...)`` (an if-chain: numba cannot
    index a list of functions)."""
    if not fns:
        fns = [_never]
    ns = {f"f{i}": f for i, f in enumerate(fns)}
    lines = [f"def {name}(prm, {args}):", f"    v = int(prm[{PRM_VARIANT}])"]
    for i in range(len(fns) - 1):
        lines.append(f"    if v == {i}:\n        return f{i}(prm, {args})")
    lines.append(f"    return f{len(fns) - 1}(prm, {args})")
    exec("\n".join(lines), ns)
    return njit(inline="always")(ns[name])


@njit(inline="always")
def _never(prm, a, b, c=0):
    return 0


def generic_hooks(priorities: list, keys: list) -> Hooks:
    """The hooks of every structure kind: ``priorities`` are the heap policies' priority functions (variant i:
    the i-th), ``keys`` the keyed heap policies' key functions."""
    hh, hi, hr = heap.hooks(_chain("priority", priorities, "count, score, next_req"))
    key = _chain("key", keys, "next_req, tick")
    kh, ki = keyheap.hooks(key)
    kr = keyheap.rekey_hook(key)

    @njit(inline="always")
    def hit(ob, fo, po, hp, prm, pool, o, tick, requested):
        kind = prm[PRM_KIND]
        if kind == KIND_LIST:
            if prm[PRM_VARIANT] != 0.0:
                lists.move_to_front(ob, fo, po, hp, prm, pool, o, tick, requested)
        elif kind == KIND_HEAP:
            hh(ob, fo, po, hp, prm, pool, o, tick, requested)
        elif kind == KIND_KEYHEAP:
            kh(ob, fo, po, hp, prm, pool, o, tick, requested)

    @njit(inline="always")
    def insert(ob, fo, po, hp, prm, pool, o, tick):
        kind = prm[PRM_KIND]
        if kind == KIND_LIST:
            return lists.insert_front(ob, fo, po, hp, prm, pool, o, tick)
        if kind == KIND_HEAP:
            return hi(ob, fo, po, hp, prm, pool, o, tick)
        if kind == KIND_KEYHEAP:
            return ki(ob, fo, po, hp, prm, pool, o, tick)
        return NOT_ADMITTED

    @njit(inline="always")
    def rekey(ob, fo, po, hp, prm, pool, o):
        if prm[PRM_KIND] == KIND_HEAP:
            hr(ob, fo, po, hp, prm, pool, o)
        elif prm[PRM_KIND] == KIND_KEYHEAP:
            kr(ob, fo, po, hp, prm, pool, o)

    return Hooks(hit, insert, rekey)


def kernel_insert(called):
    """The generic ext kernel's insert hook: a list policy's insertion inlined (small, and per miss of the most
    common policies), any other kind's a call to the compiled ``called`` (inlining the heap and keyed heap
    insertions cost ~1.5 s of the kernel's compile and gained nothing measurable on a sweep)."""

    @njit(inline="always")
    def insert(ob, fo, po, hp, prm, pool, o, tick):
        if prm[PRM_KIND] == KIND_LIST:
            return lists.insert_front(ob, fo, po, hp, prm, pool, o, tick)
        return called(ob, fo, po, hp, prm, pool, o, tick)

    return insert
