"""Admission of fetched experts (``--admission``): which experts a fetch for a use also caches
(docs/replay-semantics.md, "Admission of fetched experts"). The kernels read one number, the window W
(simulator/args.py Policy.admit_window): 0 admits every fetched expert."""

from __future__ import annotations

import math

from moesim.errors import MoesimError

# (how a user writes it, what it does): `moesim policies` lists them
RULES = (
    ("always", "cache every fetched expert (the eviction picks the victim)"),
    ("second-touch[:W]", "cache a fetched expert only when its pool requested it before (within its last W "
                         "requests), else run it for this use only (libCacheSim's Bloom-filter admission without W)"),
)

# --admission second-touch without a window: every earlier request of the pool counts (what libCacheSim's
# Bloom-filter admissioner does); the kernels' window (Policy.admit_window) is then this many requests
UNBOUNDED_WINDOW = 2**62


def parse_admission(spec: str) -> int:
    """'always' -> 0; 'second-touch' -> UNBOUNDED_WINDOW; 'second-touch:W' -> W (a positive whole number of requests
    of the expert's pool): the window of requests an expert fetched for a use must have been requested in to be
    admitted (docs/replay-semantics.md, "Admission")."""
    name, sep, arg = str(spec).strip().partition(":")
    if name == "always" and not sep:
        return 0
    if name != "second-touch":
        raise MoesimError(f"unknown admission {spec!r} (known: always, second-touch[:W])")
    if not sep:
        return UNBOUNDED_WINDOW
    try:
        w = float(arg)
    except ValueError:
        w = math.nan
    if not math.isfinite(w) or w < 1 or w != int(w):
        raise MoesimError(f"bad window in {spec!r}: expected second-touch:W with W a positive whole number of "
                          "requests")
    return int(w)
