"""Miss policies: what happens to a selected expert that is not resident."""

from numba import njit

# actions
FETCH = 0
SUBSTITUTE = 1
DROP = 2
CPU = 3

# decision record codes (simulate(..., record=True).decisions.outcome; -1 = padding)
OUTCOME_HIT = 0
OUTCOME_FETCH = 1
OUTCOME_SUBSTITUTE = 2
OUTCOME_DROP = 3
OUTCOME_CPU = 4

# miss policy codes (plain ints for the kernel)
FETCH_ALL = 0
THRESHOLD = 1
FIRST_CHOICE = 2
SUBSTITUTE_ALL = 3
DROP_ALL = 4
CPU_ALL = 5

MISS_POLICIES = {
    "fetch-all": (FETCH_ALL, "fetch every miss synchronously and admit it"),
    "threshold": (THRESHOLD, "threshold:θ — fetch if rank 0 or w >= θ, else substitute (threshold:0.15 is the 0.15 rule)"),
    "first-choice": (FIRST_CHOICE, "fetch the router's first choice, substitute the rest"),
    "substitute": (SUBSTITUTE_ALL, "never fetch: run the best-scored resident expert instead (drop if none)"),
    "drop": (DROP_ALL, "skip the missing expert (the rest are renormalized)"),
    "cpu": (CPU_ALL, "compute the missing expert on the CPU from host memory; cache unchanged"),
}


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
    return CPU
