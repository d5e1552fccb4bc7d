"""The host-RAM tier in front of NVMe: one LRU list of experts over all layers (the last row of the pools
table, list links RPRV/RNXT, resident flag RRES), for engines whose experts do not all fit in host RAM."""

from numba import njit

from moesim.jitcache import cached_njit
from moesim.policies.structures import CAP, HEAD, RNXT, RPRV, RRES, SIZE, TAIL


@cached_njit(_nrt=False)
def from_nvme(o, ram, ob, po):
    """Read o from host memory: True when it must first come from NVMe (a host-RAM tier miss, which then
    caches it, evicting the least recently used)."""
    if po[ram, CAP] < 0:
        return False  # every expert fits in host RAM
    if po[ram, CAP] == 0:
        return True  # no host RAM to spare: every read streams from NVMe
    if ob[o, RRES] != 0:
        if po[ram, HEAD] != o:
            _unlink(ob, po, ram, o)
            _push_front(ob, po, ram, o)
        return False
    if po[ram, SIZE] >= po[ram, CAP]:
        v = po[ram, TAIL]
        _unlink(ob, po, ram, v)
        ob[v, RRES] = 0
    else:
        po[ram, SIZE] += 1
    ob[o, RRES] = 1
    _push_front(ob, po, ram, o)
    return True


@njit(inline="always")
def _push_front(ob, po, ram, o):
    h = po[ram, HEAD]
    ob[o, RPRV] = -1
    ob[o, RNXT] = h
    if h != -1:
        ob[h, RPRV] = o
    else:
        po[ram, TAIL] = o
    po[ram, HEAD] = o


@njit(inline="always")
def _unlink(ob, po, ram, o):
    p = ob[o, RPRV]
    n = ob[o, RNXT]
    if p != -1:
        ob[p, RNXT] = n
    else:
        po[ram, HEAD] = n
    if n != -1:
        ob[n, RPRV] = p
    else:
        po[ram, TAIL] = p
