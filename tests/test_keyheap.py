"""Belady's one-integer key (policies/keyheap.py) orders experts exactly as the reference's
(minus next request, last use) pair: far next requests first, never requested again before all of
them by last use (warm-start ticks are negative), and a pinned key above every unpinned one."""

import numpy as np
from replay_helpers import seeded_rng

from moesim.policies import belady, keyheap
from moesim.ticks import NEVER


def test_belady_key_orders_like_the_reference_pair():
    n = 4000
    with seeded_rng("keyheap-belady-order") as rng:  # next requests are unique (a tick is one request), ticks too
        ticks = rng.choice(1 << 40, n, replace=False) - 2_000
        nexts = np.where(rng.random(n) < 0.3, NEVER, rng.choice(1 << 50, n, replace=False) + (1 << 40))
        nexts[:4] = [NEVER, NEVER, (1 << 52) - 1, 1]  # never vs the farthest and the nearest next request
        ticks[:4] = [-2_001, (1 << 52) - 2, -2_002, -2_003]
        keys = [int(belady.key(np.zeros(4), np.int64(x), np.int64(t))) for x, t in zip(nexts, ticks)]
        pairs = [(-float("inf") if x == NEVER else -int(x), int(t)) for x, t in zip(nexts, ticks)]
        assert sorted(range(n), key=keys.__getitem__) == sorted(range(n), key=pairs.__getitem__)
        assert max(keys) < keyheap.PINNED_MIN <= keyheap.PINNED - 2_003
