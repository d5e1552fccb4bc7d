"""One pool's eviction policy run over a request stream, request by request, three ways: libCacheSim
0.3.5 (the oracle), the reference classes (reference_policies.py) and the numba hooks (policies/*.py)
driven by a small jitted loop, plus the request streams the tests feed them."""

from __future__ import annotations

import numpy as np
from numba import njit
from reference_policies import NOT_ADMITTED, make_policy
from replay_helpers import fast_random_routing, libcachesim_cache

from moesim.policies import registry
from moesim.policies.structures import (
    EXTRA_EVICTIONS,
    HEAD,
    HPOS,
    LEN,
    LST,
    N_FO,
    N_LISTS,
    N_OB,
    NXT,
    NXT2,
    PRV,
    PRV2,
    RES,
    SIZE,
    TAIL,
    new_pools,
)

LIBCACHESIM = registry.libcachesim_twins()  # eviction -> its libCacheSim class, from the policy modules
# event kinds of a stream: a request whose miss is fetched (inserted), a request whose miss is not
# (substituted, dropped or run on the CPU: the policy never hears of it), a run as a substitute
FETCH, NO_FETCH, SUBSTITUTE = 0, 1, 2


def first_divergence(a: np.ndarray, b: np.ndarray) -> int:
    d = np.nonzero(np.asarray(a) != np.asarray(b))[0]
    return int(d[0]) if len(d) else -1


def libcachesim_hits(name: str, capacity: int, stream: np.ndarray, params: dict | None = None) -> np.ndarray:
    """libCacheSim's hit (True) or miss per request of a fetch-all stream (object size 1)."""
    import libcachesim as lcs

    cache = libcachesim_cache(name, capacity, **(params or {}))
    req = lcs.Request(obj_size=1)
    get = cache.get
    out = np.zeros(len(stream), np.bool_)
    for i, o in enumerate(stream.tolist()):
        req.obj_id = o + 1  # keep id 0 out, as replay_helpers.oracle_trace does
        out[i] = get(req)
    return out


def reference_run(name: str, capacity: int, stream: np.ndarray, params: dict | None = None, kinds=None,
                  policy=None, start: int = 0):
    """Hits and victims per event (-1: nothing evicted, -2: not admitted), and the policy object (pass
    it back in, with ``start`` = events so far, to continue a stream)."""
    policy = make_policy(name, capacity, params) if policy is None else policy
    n = len(stream)
    kinds = np.zeros(n, np.int8) if kinds is None else kinds
    hits = np.zeros(n, np.bool_)
    victims = np.full(n, -1, np.int64)
    for i, (o, kind) in enumerate(zip(stream.tolist(), kinds.tolist())):
        if o in policy:
            if kind != SUBSTITUTE:
                hits[i] = True
            policy.hit(o, start + i, request=kind != SUBSTITUTE)
        elif kind == FETCH:
            v = policy.insert(o, start + i)
            victims[i] = -2 if v is NOT_ADMITTED else (-1 if v is None else v)
    return hits, victims, policy


_DRIVERS: dict = {}


def _driver(name: str):
    """A jitted loop over one pool (pool 0) calling the policy's own hooks (compiled per policy)."""
    if name not in _DRIVERS:
        mod = registry.get(name).module
        hit, insert = mod.hit, mod.insert

        @njit
        def run(objs, kinds, ob, fo, po, heap, prm, hits, victims, start):
            for i in range(objs.shape[0]):
                o = objs[i]
                tick = start + i
                if ob[o, RES] != 0:
                    if kinds[i] != SUBSTITUTE:
                        hits[i] = True
                    hit(ob, fo, po, heap, prm, 0, o, tick, kinds[i] != SUBSTITUTE)
                elif kinds[i] == FETCH:
                    victims[i] = insert(ob, fo, po, heap, prm, 0, o, tick)

        _DRIVERS[name] = run
    return _DRIVERS[name]


def fresh_state(capacity: int, n_obj: int):
    """One pool's arrays as the kernel's reset leaves them."""
    ob = np.zeros((n_obj, N_OB), np.int64)
    ob[:, LST] = -1
    ob[:, HPOS] = -1
    po = new_pools(np.array([capacity], np.int64))
    for q in range(N_LISTS):
        po[:, HEAD + 3 * q] = -1
        po[:, TAIL + 3 * q] = -1
    return ob, np.zeros((n_obj, N_FO)), po, np.zeros((capacity, 3))


def hooks_run(name: str, capacity: int, stream: np.ndarray, params: dict | None = None, kinds=None,
              state=None, start: int = 0):
    """Hits and victims per event through the numba hooks; returns them and the state arrays (pass
    ``state`` back in, with ``start`` = events so far, to continue a stream)."""
    ev = registry.get(name)
    prm = ev.kernel_params(params.get(ev.param.key) if params and ev.param else None)
    for i, (key, _) in enumerate(ev.fixed):
        if params and key in params:
            prm[i + (1 if ev.param else 0)] = params[key]
    n = len(stream)
    state = fresh_state(capacity, int(stream.max()) + 1) if state is None else state
    kinds = np.zeros(n, np.int8) if kinds is None else kinds
    hits = np.zeros(n, np.bool_)
    victims = np.full(n, -1, np.int64)
    _driver(name)(stream.astype(np.int64), kinds.astype(np.int8), *state, prm, hits, victims, start)
    return hits, victims, state


def hook_lists(ob: np.ndarray, po: np.ndarray, pool: int = 0, second: tuple = ()) -> list[list]:
    """The pool's lists walked head to tail, checking their links, lengths and list ids; the lists in
    ``second`` are linked through the second link pair (PRV2/NXT2, no list id)."""
    out = []
    for q in range(N_LISTS):
        items = []
        prv, nxt = (PRV2, NXT2) if q in second else (PRV, NXT)
        o, prev = po[pool, HEAD + 3 * q], -1
        while o != -1:
            assert ob[o, prv] == prev and (q in second or ob[o, LST] == q), f"list {q}: broken link at object {o}"
            items.append(int(o))
            prev, o = o, ob[o, nxt]
            assert len(items) <= ob.shape[0], f"list {q} has a cycle"
        assert po[pool, TAIL + 3 * q] == prev and po[pool, LEN + 3 * q] == len(items), f"list {q}: tail or length"
        out.append(items)
    return out


def check_same_state(ob: np.ndarray, po: np.ndarray, policy) -> None:
    """The hooks' arrays hold what the reference object holds: the same lists in the same order,
    the same resident set, an exact resident count, and as many evictions beyond the insertions'
    victims (EXTRA_EVICTIONS: a policy that evicts on a hit)."""
    try:
        want = policy.lists()
    except NotImplementedError:  # a policy kept in a heap: hits, victims and the resident set say it all
        want = None
    if want is not None:
        lists = hook_lists(ob, po, second=getattr(registry.get(policy.name).module, "SECOND_LINKS", ()))
        assert lists[:len(want)] == want and not any(lists[len(want):]), "lists differ from the reference"
    resident = {int(o) for o in np.nonzero(ob[:, RES])[0]}
    assert resident == {o for o in range(ob.shape[0]) if o in policy}, "resident sets differ"
    assert po[0, SIZE] == len(resident) == len(policy)
    assert po[0, EXTRA_EVICTIONS] == len(getattr(policy, "extra_victims", ())), "evictions beyond the victims"


def streams(rng: np.random.Generator, E: int, n: int) -> dict[str, np.ndarray]:
    """Streams over E objects: uniform, Zipf (a = 1.2) and one layer of a routing with locality."""
    L = 1
    k = min(8, max(1, E // 4))
    routing = fast_random_routing(rng, -(-n // k), L, E, k)
    return {"uniform": rng.integers(0, E, n),
            "zipf": rng.permutation(E)[(rng.zipf(1.2, n) - 1) % E],
            "routing": routing.sel[:, 0, :].reshape(-1)[:n].astype(np.int64)}
