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


def swaps(window: np.ndarray, held: np.ndarray, cap: int, gain: float) -> tuple[np.ndarray, np.ndarray]:
    """(out, in): the swaps of one pool, ``window`` its objects' requests, ``held`` [objects] bool its pinned set.

    The rule swaps one pair at a time, the hottest unpinned expert against the coldest pinned one. The experts it
    pins have at least as many requests as every unpinned one left, so the coldest pinned expert that limits a
    later swap is never one it just pinned (that swap's gain would be <= 0 either way): the i-th swap pairs the
    i-th hottest unpinned expert with the i-th coldest originally pinned one, and the gains only fall, so the
    swaps are the longest prefix whose gains clear G. Empty slots are filled first, by the hottest experts with at
    least max(G, 1) requests (while they are, no swap happens)."""
    ids = np.arange(len(window))
    free = ids[~held]
    free = free[np.lexsort((free, -window[free]))]  # hottest first, ties to the lower id
    pinned_now = ids[held]
    pinned_now = pinned_now[np.lexsort((-pinned_now, window[pinned_now]))]  # coldest first, ties to the higher id
    n_fill = max(0, cap - len(pinned_now))
    w_free = window[free]
    fill = int(np.argmin(np.append((w_free[:n_fill] > 0) & (w_free[:n_fill] >= gain), False)))
    ins = free[:fill]
    if fill < n_fill:  # the pool is not full: no swap
        return np.zeros(0, np.int64), ins
    rest = free[fill:]
    m = min(len(rest), len(pinned_now))
    g = window[rest[:m]] - window[pinned_now[:m]]
    n = int(np.argmin(np.append((g > 0) & (g >= gain), False)))
    return pinned_now[:n], np.concatenate([ins, rest[:n]])


def schedule(source, values, slots: int, allocation: str):
    """The initial pinned objects and the pin events [(token, object, -1 out | +1 in)] of a replay of ``source``
    (a Routing), outs before ins at each token, each by object id."""
    every, gain = int(values[0]), float(values[1])
    sel = np.asarray(source.sel)
    T, L, _ = sel.shape
    E = source.n_experts
    pools = [(l * E, (l + 1) * E, slots) for l in range(L)] if allocation == "per-layer" else [(0, L * E, slots * L)]
    held = np.zeros(L * E, np.bool_)
    events: list[np.ndarray] = []
    objs = sel.astype(np.int64) + (np.arange(L, dtype=np.int64) * E)[None, :, None]
    for t in range(every, T, every):
        part = objs[t - every:t].reshape(-1)
        counts = np.bincount(part[sel[t - every:t].reshape(-1) >= 0], minlength=L * E)  # (-1 pads a row)
        for lo, hi, cap in pools:
            outs, ins = swaps(counts[lo:hi], held[lo:hi], cap, gain)
            held[lo + outs] = False
            held[lo + ins] = True
            events.append(np.stack([np.full(len(outs), t), lo + outs, np.full(len(outs), -1)], axis=1))
            events.append(np.stack([np.full(len(ins), t), lo + ins, np.full(len(ins), 1)], axis=1))
    return np.zeros(0, np.int64), _events(np.concatenate(events) if events else np.zeros((0, 3), np.int64))


def _events(events) -> np.ndarray:
    ev = np.asarray(events, np.int64).reshape(-1, 3)
    if len(ev):  # by token, outs first, then by object
        ev = ev[np.lexsort((ev[:, 1], ev[:, 2], ev[:, 0]))]
    return ev
