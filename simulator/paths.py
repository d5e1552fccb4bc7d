"""The ext kernels' out-of-line paths: compiled once, for every ext and engine kernel, and passed to them as
function pointers (simulator/kernels.py), so a kernel's compile lowers its own loop and nothing else.

A path called directly would be linked into each kernel and optimized again there with the whole loop (LLVM
re-optimizes every linked function in the caller's module): compiled as a pointer, it is optimized once, and a
kernel edit leaves it in numba's cache. A call through a pointer costs ~40 ns, so only paths off the per-request
hit path are here (a step policy once per step when one is set; the rest per miss, per copy or per reset).

The **step seam**: ``STEP_RULES`` name the step policies a replay may run before its requests are handled (the
rule of ``none`` is never called: the kernel copies the router's row itself). Only the rule a replay needs is
compiled: a replay without rerouting never compiles rerouting.

A path's argument types come from its parameter names (``_param_types``: the kernels' conventional names, typed
from the real argument groups), so a new path needs no signature written by hand; its return type is inferred.
"""

from __future__ import annotations

import functools
import inspect

from moesim.policies.hooks import HIT_T, INSERT_T, REKEY_T
from moesim.simulator import copyqueue, miss_paths, pin_events, reroute, reset
from moesim.simulator import prefetch as pfm

# the step policies' rules (simulator/args.py step_rule_of picks one per replay), all of one signature
STEP_RULES = {"none": reroute.keep_row, "reroute": reroute.select, "reroute-batched": reroute.select_union}
# the other paths, in the order the kernels take them after the step rule (kernel_ext.replay's parameters)
PATHS = (pfm.issue, pfm.late_hit, miss_paths.lose, miss_paths.cpu_run, copyqueue.land, copyqueue.upload,
         reset.reset_state, pin_events.apply)

_INT = ("o", "l", "t", "r", "i", "E", "pool", "base", "step", "tick", "tick0", "action", "ram", "tg", "ov", "m_link")
_FLOAT = ("wr", "wm", "now", "link_free", "t_r", "h", "stall", "beta", "s_vram", "s_writeback", "s_fetch_ram",
          "s_fetch_nvme", "s_cpu_ram", "s_cpu_nvme")
_BOOL = ("timed", "tiered", "copies", "counting", "record")
# array parameters: the argument group field each one is
_ARRAYS = {"ob": "state.objs", "fo": "state.objf", "po": "state.pools", "heap": "state.heap", "qhl": "state.queue_hl",
           "queue": "state.queue", "queue_t": "state.queue_t", "pf": "state.pf", "pf_t": "state.pf_t",
           "prm": "policy.prm", "cand": "steps.cand", "cost": "setup.cost", "ev": "setup.pin_events",
           "tok_counts": "out.tok_counts", "layer_counts": "out.layer_counts", "outcome": "out.outcome",
           "substituted": "out.substitute"}


@functools.cache
def _param_types() -> dict:
    import numba
    from numba import types

    from moesim.simulator.args import tiny_args

    args = tiny_args("lru", "ext")
    out: dict = {g: numba.typeof(getattr(args, g)) for g in args._fields}
    for name, field in _ARRAYS.items():
        group, attr = field.split(".")
        out[name] = numba.typeof(getattr(getattr(args, group), attr))
    out.update({n: types.int64 for n in _INT}, **{n: types.float64 for n in _FLOAT},
               **{n: types.boolean for n in _BOOL}, hit=HIT_T, insert=INSERT_T, rekey=REKEY_T)
    return out


def _arg_types(fn) -> tuple:
    known = _param_types()
    names = list(inspect.signature(fn.py_func).parameters)
    missing = [n for n in names if n not in known]
    if missing:  # a developer's error: the path's parameter names are the kernels' conventional ones
        raise TypeError(f"{fn.py_func.__qualname__}: no conventional type for parameter(s) {missing} "
                        "(simulator/paths.py)")
    return tuple(known[n] for n in names)


@functools.cache
def _compiled(fn):
    """``fn`` compiled (or loaded from numba's cache) for its parameters' types; its function-pointer type."""
    from numba import types

    sig = _arg_types(fn)
    fn.compile(sig)
    return types.FunctionType(fn.overloads[sig].signature)


def pointer_types() -> tuple:
    """The function-pointer types of the step rule and the paths, as the kernels' signature takes them (the step
    rule's from ``none``: every rule has its signature)."""
    return (_compiled(STEP_RULES["none"]), *(_compiled(fn) for fn in PATHS))


@functools.cache
def pointers(step: str = "none") -> tuple:
    """The step rule ``step`` and the paths, compiled, in the kernels' parameter order (once a process: every
    replay, and every chunk of a streamed one, passes the same tuple)."""
    rule = STEP_RULES[step]
    if _compiled(rule) != _compiled(STEP_RULES["none"]):
        raise TypeError(f"step rule {step!r} does not have the step rules' signature")
    for fn in PATHS:
        _compiled(fn)
    return (rule, *PATHS)
