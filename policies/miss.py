"""Miss policies: what happens to a selected expert that is not resident. One record per policy is
the single source of its name, code, parameter, documentation and default-grid entries; ``decide``
is the kernel's rule."""

from __future__ import annotations

from dataclasses import dataclass

from numba import njit

from moesim.errors import MoesimError

# a request's outcome (the replay's decision record, moesim.simulator.simulate(record=True))
OUTCOME_HIT, OUTCOME_FETCH, OUTCOME_SUBSTITUTE, OUTCOME_DROP, OUTCOME_CPU, OUTCOME_LOWBIT = range(6)
OUTCOMES = ("hit", "fetch", "substitute", "drop", "cpu", "lowbit")
# the actions a miss policy chooses (substitute falls back to drop when no candidate is resident); HYBRID is a CPU
# run (its outcome) that also uploads the expert in the background
FETCH, SUBSTITUTE, DROP, CPU, LOWBIT = OUTCOME_FETCH, OUTCOME_SUBSTITUTE, OUTCOME_DROP, OUTCOME_CPU, OUTCOME_LOWBIT
HYBRID = len(OUTCOMES)

# miss policy codes (plain ints for the kernel)
FETCH_ALL, THRESHOLD, FIRST_CHOICE, SUBSTITUTE_ALL, DROP_ALL, CPU_ALL, LOWBIT_ALL, HYBRID_ALL = range(8)


@dataclass(frozen=True)
class MissPolicy:
    name: str
    code: int
    doc: str
    grid: tuple[str, ...]  # its entries in the sweep's default miss axis
    substitutes: bool  # may substitute (so background admission can act)
    keeps_first: bool  # always runs the router's first choice (fetch or CPU): mass compares within this class
    takes_theta: bool = False
    takes_quant: bool = False  # lowbit:Q: the parameter is a quantization name (simulator/config.py checks it)


MISS_POLICIES: dict[str, MissPolicy] = {p.name: p for p in (
    MissPolicy("fetch-all", FETCH_ALL, "fetch every miss synchronously and admit it", ("fetch-all",), False, True),
    MissPolicy("threshold", THRESHOLD, "fetch if rank 0 or w >= θ, else substitute "
               "(threshold:0.15 is the 0.15 rule)", ("threshold:0.15",), True, True, takes_theta=True),
    MissPolicy("first-choice", FIRST_CHOICE, "fetch the router's first choice, substitute the rest",
               ("first-choice",), True, True),
    MissPolicy("substitute", SUBSTITUTE_ALL, "never fetch: run the best-scored resident expert instead "
               "(drop if none)", ("substitute",), True, False),
    MissPolicy("drop", DROP_ALL, "skip the missing expert (the rest are renormalized)", (), True, False),
    MissPolicy("cpu", CPU_ALL, "compute the missing expert on the CPU from host memory; cache unchanged",
               ("cpu",), False, True),
    MissPolicy("lowbit", LOWBIT_ALL, "fetch a Q-quantized copy of the missing expert (lowbit:q4_k_m, lowbit:q2_k) "
               "and run it from VRAM; not admitted", (), True, False, takes_quant=True),
    MissPolicy("hybrid", HYBRID_ALL, "compute the missing expert on the CPU for this use and upload it into the "
               "cache in the background (llama.cpp's expert caches)", (), False, True),
)}


def default_misses() -> list[str]:
    return [spec for p in MISS_POLICIES.values() for spec in p.grid]


def get(name: str) -> MissPolicy:
    try:
        return MISS_POLICIES[name]
    except KeyError:
        raise MoesimError(f"unknown miss policy {name!r} (known: {', '.join(MISS_POLICIES)})") from None


def parse_miss(spec: str) -> tuple[str, float]:
    """'threshold:0.15' -> ('threshold', 0.15); the others carry θ = 0 (lowbit's quantization: ``miss_quant``)."""
    name, _, arg = str(spec).strip().partition(":")
    p = get(name)
    if p.takes_quant:
        miss_quant(spec)
        return name, 0.0
    if not p.takes_theta:
        if arg:
            raise MoesimError(f"miss policy {name!r} takes no parameter (got {spec!r})")
        return name, 0.0
    if not arg:
        raise MoesimError(f"the {name} miss policy needs θ, e.g. {name}:0.15")
    try:
        theta = float(arg)
    except ValueError:
        raise MoesimError(f"bad threshold in {spec!r}: expected a number in [0, 1]") from None
    if not (0.0 <= theta <= 1.0):
        raise MoesimError(f"bad threshold in {spec!r}: expected a number in [0, 1]")
    return name, theta


def miss_quant(spec: str) -> str | None:
    """'lowbit:Q4_K_M' -> 'q4_k_m' (the spelling of the quantization names); None for the other policies."""
    name, _, arg = str(spec).strip().partition(":")
    if not get(name).takes_quant:
        return None
    q = arg.strip().lower()
    if not q:
        raise MoesimError(f"the {name} miss policy needs a quantization, e.g. {name}:q4_k_m")
    if not q.replace("_", "").isalnum():
        raise MoesimError(f"bad quantization in {spec!r}: expected a name such as q4_k_m or q2_k")
    return q


def spec_of(p: MissPolicy) -> str:
    return f"{p.name}:θ" if p.takes_theta else (f"{p.name}:Q" if p.takes_quant else p.name)


def help_text() -> str:
    return ("Miss policy: " + ", ".join(spec_of(p) for p in MISS_POLICIES.values())
            + " (threshold:0.15 is the 0.15 rule; lowbit:Q fetches a Q-quantized copy, e.g. lowbit:q4_k_m).")


@njit(inline="always")
def decide(code, rank, w, theta):
    if code == FETCH_ALL:
        return FETCH
    if code == THRESHOLD:
        return FETCH if (rank == 0 or w >= theta) else SUBSTITUTE
    if code == FIRST_CHOICE:
        return FETCH if rank == 0 else SUBSTITUTE
    if code == SUBSTITUTE_ALL:
        return SUBSTITUTE
    if code == DROP_ALL:
        return DROP
    if code == LOWBIT_ALL:
        return LOWBIT
    if code == HYBRID_ALL:
        return HYBRID
    return CPU
