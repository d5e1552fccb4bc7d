"""Re-pinning: a pinned hot set re-estimated along the trace (``repin:N[,G]``), as engines that pin experts and
re-choose them as the workload drifts do (colibri's REPIN=N re-pin pass every N emitted tokens, which swaps the
coldest pinned expert for a hotter one when the gain clears a hysteresis: github.com/JustVugg/colibri ``c/tier.h``
``tier_pick_swap``).

The set starts empty. At every N-th token (N, 2N, ...) each pool counts its experts' router requests over the
last N tokens (the trailing window) and swaps, one pair at a time, its coldest pinned expert (the fewest
requests in the window; ties: the higher layer, then expert id) for its hottest unpinned one (the most; ties: the
lower) while the hottest has at least G more requests than the coldest (G = 1 by default); an empty slot counts
as 0 requests, so the first re-estimation fills the pool with experts requested at least G times. Misses are
never admitted (the placement is fixed between re-estimations). The swapped-in experts are uploaded at the start
of the token: copies over the link, one after another, which the token waits for (priced by the clock like a
fetch: host RAM or NVMe); the swapped-out ones are evictions. Counted as copies and admissions, and evictions."""

import numpy as np

from moesim.policies.params import Param

NAME = "repin"
DOC = ("re-pinned hot set: every N tokens, swap the coldest pinned expert for the hottest unpinned one while "
       "the trailing N tokens' requests gain >= G (default 1); uploads priced")
PARAM = Param("every_tokens", "N", "a positive whole number of tokens N and a gain G >= 0 requests",
              integer=True, default=0.0,
              extra=(Param("gain", "G", "a gain G >= 0 requests", default=1.0, zero=True),))
PARAM_REQUIRED = True


def pinned(counts: np.ndarray, slots: int, allocation: str) -> np.ndarray:
    """Nothing is pinned at the start: the first re-estimation fills the pools."""
    return np.zeros(0, np.int64)


def swaps(window: np.ndarray, pinned: set, cap: int, gain: float) -> tuple[list[int], list[int]]:
    """(out, in): the swaps of one pool, ``window`` its objects' requests (index = object id within the pool)."""
    outs: list[int] = []
    ins: list[int] = []
    free = sorted(set(range(len(window))) - pinned, key=lambda o: (-window[o], o))  # hottest first
    held = sorted(pinned, key=lambda o: (window[o], -o))  # coldest first
    fi = 0
    while fi < len(free):
        hot = free[fi]
        if len(held) < cap:
            if window[hot] <= 0 or window[hot] < gain:
                break
            held.append(hot)
        else:
            if not held:
                break
            cold = held[0]
            g = window[hot] - window[cold]
            if g <= 0 or g < gain:
                break
            held.pop(0)
            outs.append(cold)
            held.append(hot)
        ins.append(hot)
        fi += 1
        held.sort(key=lambda o: (window[o], -o))
    return outs, ins


def schedule(source, values, slots: int, allocation: str):
    """The initial pinned objects and the pin events [(token, object, -1 out | +1 in)] of a replay of ``source``
    (a Routing), outs before ins at each token, each by object id."""
    every, gain = int(values[0]), float(values[1])
    sel = np.asarray(source.sel)
    T, L, _ = sel.shape
    E = source.n_experts
    pools = [(np.arange(l * E, (l + 1) * E), slots) for l in range(L)] if allocation == "per-layer" \
        else [(np.arange(L * E), slots * L)]
    held: list[set] = [set() for _ in pools]
    events: list[tuple[int, int, int]] = []
    objs = sel.astype(np.int64) + (np.arange(L, dtype=np.int64) * E)[None, :, None]
    for t in range(every, T, every):
        part = objs[t - every:t].reshape(-1)
        counts = np.bincount(part[sel[t - every:t].reshape(-1) >= 0], minlength=L * E)  # (-1 pads a row)
        for p, (ids, cap) in enumerate(pools):
            base = int(ids[0])
            outs, ins = swaps(counts[ids], {o - base for o in held[p]}, cap, gain)
            for o in sorted(outs):
                held[p].discard(o + base)
                events.append((t, o + base, -1))
            for o in sorted(ins):
                held[p].add(o + base)
                events.append((t, o + base, 1))
    return np.zeros(0, np.int64), _events(events)


def _events(events) -> np.ndarray:
    ev = np.array(events, np.int64).reshape(-1, 3)
    if len(ev):  # by token, outs first, then by object
        ev = ev[np.lexsort((ev[:, 1], ev[:, 2], ev[:, 0]))]
    return ev
