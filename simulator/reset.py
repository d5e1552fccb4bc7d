"""Emptying the replay's state at the first token (and at each sequence under --reset-per-sequence), and the
rescaling of decayed scores: the parts that do not depend on the eviction policy (the kernels insert the
warm set through the policy's own hook after ``reset_state``)."""

from numba import njit

from moesim.jitcache import cached_njit
from moesim.policies.structures import (
    ACC,
    CNT,
    HPOS,
    HSIZE,
    LST,
    MARK,
    N_LISTS,
    NREQ,
    QUEUED,
    RES,
    RRES,
    SCORE,
    SIZE,
    X0,
    list_clear,
)
from moesim.simulator.host_ram import from_nvme


@cached_njit(_nrt=False)
def reset_state(setup, ob, fo, po, qhl):
    """Empty every pool and copy queue, pin the static set and fill the host-RAM tier with ram_warm (least
    recently used first)."""
    pinned = setup.pinned
    for o in range(ob.shape[0]):
        ob[o, RES] = 1 if pinned[o] else 0
        ob[o, HPOS] = -1
        ob[o, CNT] = 0
        ob[o, QUEUED] = 0
        ob[o, RRES] = 0
        ob[o, LST] = -1
        fo[o, SCORE] = 0.0
        fo[o, ACC] = 0.0
    for p in range(po.shape[0]):
        po[p, SIZE] = 0
        po[p, HSIZE] = 0
        for q in range(N_LISTS):
            list_clear(po, p, q)
        for x in range(X0, po.shape[1]):
            po[p, x] = 0
    for l in range(qhl.shape[0]):
        qhl[l, 0] = 0
        qhl[l, 1] = 0
    ram = po.shape[0] - 1
    for i in range(setup.ram_warm.shape[0]):
        from_nvme(setup.ram_warm[i], ram, ob, po)


@cached_njit(_nrt=False)
def first_ticks(first_req, fo):
    """Before the first token: each expert's next request is its first, and no step has marked it."""
    for o in range(fo.shape[0]):
        fo[o, NREQ] = first_req[o]
        fo[o, MARK] = -1.0


@njit(inline="always")
def clocked(cost):
    """Whether any operation takes time (typed as a plain bool: a literal False passed on would compile the
    helpers it reaches twice, once per type)."""
    for c in range(cost.shape[0]):
        if cost[c] != 0.0:
            return True
    return False
