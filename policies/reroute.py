"""Step policies: rerouting, the router biased towards experts already in fast memory before a step's requests
are handled (docs/replay-semantics.md, "Rerouting"). One record per policy is the single source of its name,
code, parameter and documentation, as policies/miss.py is for miss policies; the kernel's rule is
simulator/reroute.py."""

from __future__ import annotations

import math
from dataclasses import dataclass

from moesim.errors import MoesimError

# step policy codes (plain ints for the kernel); NONE leaves every step as the router made it
NONE, BIAS, KEEP = range(3)
# what counts as resident (--reroute-resident)
RESIDENT_CACHE, RESIDENT_RECENT = range(2)
WEIGHTS = ("original", "biased")
NEVER_USED = -(1 << 62)  # the kernels' State.last_req of an expert not requested since the last reset


@dataclass(frozen=True)
class StepPolicy:
    name: str
    code: int
    symbol: str  # its parameter, as a user writes it
    doc: str


STEP_POLICIES: dict[str, StepPolicy] = {p.name: p for p in (
    StepPolicy("bias", BIAS, "λ", "add λ x the step's score range over its candidates to every resident candidate's "
               "score and re-take the top k (bias:0 is the plain replay)"),
    StepPolicy("keep", KEEP, "J", "keep the router's first J experts, fill the other k - J with resident candidates in "
               "score order (keep:k is the plain replay)"),
)}


def parse_reroute(spec: str) -> tuple[str, float]:
    """'bias:0.25' -> ('bias', 0.25); 'keep:2' -> ('keep', 2.0). J is checked against k by the replay."""
    name, _, arg = str(spec).strip().partition(":")
    if name not in STEP_POLICIES:
        raise MoesimError(f"unknown reroute policy {spec!r} (known: " + ", ".join(
            f"{p.name}:{p.symbol}" for p in STEP_POLICIES.values()) + ")")
    try:
        value = float(arg)
    except ValueError:
        value = float("nan")
    if name == "bias" and not (math.isfinite(value) and value >= 0.0):
        raise MoesimError(f"bad reroute {spec!r}: bias:λ takes a finite λ >= 0, e.g. bias:0.25")
    if name == "keep" and not (math.isfinite(value) and value >= 0 and value == int(value)):
        raise MoesimError(f"bad reroute {spec!r}: keep:J takes a whole number J from 0 to k, e.g. keep:2")
    return name, value


def parse_resident(spec: str) -> tuple[int, int]:
    """'cache' -> (RESIDENT_CACHE, 0); 'recent:16' -> (RESIDENT_RECENT, 16)."""
    name, _, arg = str(spec).strip().partition(":")
    if name == "cache" and not arg:
        return RESIDENT_CACHE, 0
    if name == "recent":
        try:
            w = int(arg)
        except ValueError:
            w = 0
        if w >= 1 and str(w) == arg.strip():
            return RESIDENT_RECENT, w
        raise MoesimError(f"bad --reroute-resident {spec!r}: recent:W takes a whole number of tokens W >= 1")
    raise MoesimError(f"unknown --reroute-resident {spec!r} (known: cache, recent:W)")


def help_text() -> str:
    return "Reroute: " + "; ".join(f"{p.name}:{p.symbol} = {p.doc}" for p in STEP_POLICIES.values()) + \
        " (docs/replay-semantics.md, 'Rerouting')."
