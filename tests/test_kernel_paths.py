"""The ext kernels' out-of-line paths (simulator/paths.py): the kernel takes them in PATHS' order, every path's
parameters have a conventional type, every step rule has the step rules' signature, and a kernel's compiled code does
not depend on the rerouting rule (a step rule is passed in, not linked)."""

from __future__ import annotations

import inspect

from moesim import jitcache
from moesim.policies import registry
from moesim.simulator import kernel_ext, paths


def test_the_kernel_takes_the_step_rule_then_the_paths():
    params = list(inspect.signature(kernel_ext.replay).parameters)
    tail = params[params.index("rekey") + 1:]
    assert tail[0] == "step_rule" and len(tail) == 1 + len(paths.PATHS)
    # each parameter is the path's own name, or names what it does (prefetch: issue, apply_pins: pin_events.apply)
    aliases = {"issue": "prefetch", "apply": "apply_pins"}
    assert tail[1:] == [aliases.get(fn.py_func.__name__, fn.py_func.__name__) for fn in paths.PATHS]


def test_every_path_and_step_rule_is_typed_by_its_parameter_names():
    types = paths.pointer_types()
    assert len(types) == 1 + len(paths.PATHS)
    for step in paths.STEP_RULES:
        assert len(paths.pointers(step)) == len(types)


def test_the_generic_kernel_does_not_link_rerouting():
    generic = set(jitcache.component_modules(("moesim.simulator.kernel_ext", *registry.generic_modules())))
    assert "moesim.simulator.reroute" not in generic
