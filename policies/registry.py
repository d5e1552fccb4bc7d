"""The eviction policy table and the kernel's only dispatch on policy codes.

Adding an eviction policy: write its module (NAME, STRUCTURE, DOC and, for a
"heap" policy, an inlined ``priority(count, score, next_req)``: the resident
expert with the lowest (priority, last-use tick) is evicted; USES_SCORE or
USES_NEXT_REQUEST = True when it reads the score or the next request), add one row to
EVICTIONS, one branch to ``priority`` below, and its reference implementation
in tests/reference_replay.py.

A "none" policy pins a fixed set instead: its module defines ``pinned(counts,
slots, allocation)`` returning the pinned object ids (layer * E + expert).

Structures: "list" — recency/insertion-ordered linked list (MOVE_ON_ACCESS says
whether a use moves the expert to the front); "heap" — indexed min-heap on
(priority, last-use tick); "none" — a fixed pinned set.
"""

from numba import njit

from moesim.policies import belady, fifo, freq, lfu, lru, static, static_layers

# code -> module; codes are what the numba kernel sees (plain ints)
EVICTIONS = {0: lru, 1: fifo, 2: lfu, 3: freq, 4: belady, 5: static, 6: static_layers}

STRUCTURES = {"list": 0, "heap": 1, "none": 2}
BY_NAME = {m.NAME: code for code, m in EVICTIONS.items()}


@njit(inline="always")
def priority(code, count, score, next_req):
    if code == 2:
        return lfu.priority(count, score, next_req)
    if code == 3:
        return freq.priority(count, score, next_req)
    if code == 4:
        return belady.priority(count, score, next_req)
    return 0.0


def eviction_code(name: str) -> int:
    return BY_NAME[name]


def structure_code(code: int) -> int:
    return STRUCTURES[EVICTIONS[code].STRUCTURE]


def module(code: int):
    return EVICTIONS[code]


def uses(code: int, what: str) -> bool:
    """Does the policy read ``what`` (SCORE or NEXT_REQUEST)? The kernel skips upkeep it does not need."""
    return bool(getattr(EVICTIONS[code], f"USES_{what}", False))


def move_on_access(code: int) -> bool:
    return bool(getattr(EVICTIONS[code], "MOVE_ON_ACCESS", False))
