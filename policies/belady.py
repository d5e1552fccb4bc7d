"""Belady (MIN): evict the resident expert whose next router request is farthest
away; never requested again counts as infinitely far. With fetch-all this is the
offline optimum (demand paging: every miss is inserted)."""

from numba import njit

from moesim.policies import keyheap
from moesim.ticks import NEVER

NAME = "belady"
LIBCACHESIM = "Belady"  # the libCacheSim 0.3.5 class with the same semantics under fetch-all (the tests' oracle)
DOC = "evict the expert the router requests farthest in the future (offline bound)"
IN_DEFAULT_GRID = True
USES_NEXT_REQUEST = True  # the kernel keeps each expert's next request tick up to date


@njit(inline="always")
def key(prm, next_req, tick):
    """Minus the next request tick (a later request = a lower key = evicted sooner); never requested again:
    below every such key (ticks are below 2^53 < NEVER), the least recently used lowest."""
    return tick - NEVER if next_req == NEVER else -next_req


hit, insert = keyheap.hooks(key)
rekey = keyheap.rekey_hook(key)
