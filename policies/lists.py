"""Hooks shared by the policies kept in one recency- or insertion-ordered list (list 0 of the
pool): insertion at the head, eviction at the tail."""

from numba import njit

from moesim.policies.structures import CAP, HEAD, RES, SIZE, TAIL, list_move_front, list_push_front, list_unlink


@njit(inline="always")
def insert_front(ob, fo, po, heap, prm, pool, o, tick):
    """Link o at the head; when the pool is full, evict the tail first. Returns the victim or -1."""
    v = -1
    if po[pool, SIZE] >= po[pool, CAP]:
        v = po[pool, TAIL]
        list_unlink(ob, po, pool, v, 0)
        ob[v, RES] = 0
    else:
        po[pool, SIZE] += 1
    list_push_front(ob, po, pool, o, 0)
    ob[o, RES] = 1
    return v


@njit(inline="always")
def move_to_front(ob, fo, po, heap, prm, pool, o, tick, requested):
    if po[pool, HEAD] != o:
        list_move_front(ob, po, pool, o, 0)


@njit(inline="always")
def stay(ob, fo, po, heap, prm, pool, o, tick, requested):
    pass
