"""Static pinning: the most-requested experts (over the whole trace, or over a
warm-up prefix with static:W) are resident from the start and never evicted;
misses are never admitted. An offloading engine's fixed hot-expert set."""

import numpy as np

from moesim.policies.params import Param

NAME = "static"
DOC = "pin the most-requested experts (whole trace, or first W tokens with static:W); never evict, never admit"
IN_DEFAULT_GRID = True
PARAM = Param("prefix_tokens", "W", "a positive whole number of tokens", integer=True)
LEARNS = True  # from the trace's counts: a sweep learns it from a holdout prefix (sweeps/holdout.py)


def most_requested(counts: np.ndarray, slots: int, allocation: str) -> np.ndarray:
    """Object ids (layer * E + expert) of the most requested experts: the top ``slots``
    of each layer, or the top slots * L overall for a global pool. Equal counts: lower
    layer, then lower expert id first. Returned most popular first."""
    L, E = counts.shape
    if allocation == "global":
        return np.lexsort((np.arange(L * E), -counts.reshape(-1)))[: slots * L].astype(np.int64)
    return np.concatenate([l * E + np.lexsort((np.arange(E), -counts[l]))[:slots] for l in range(L)]).astype(np.int64)


def pinned(counts: np.ndarray, slots: int, allocation: str) -> np.ndarray:
    """The pinned objects; ``counts`` [L, E] are router requests (of the prefix for static:W)."""
    return most_requested(counts, slots, allocation)
