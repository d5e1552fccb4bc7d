"""LFU exactly as libCacheSim's: the count lives while the expert is cached.

A new entry starts at 1, each router request of the cached expert adds 1, the
count resets on eviction; among equal counts the least recently used goes
first (the heap breaks ties on the last-use tick)."""

from numba import njit

from moesim.policies import heap

NAME = "lfu"
LIBCACHESIM = "LFU"  # the libCacheSim 0.3.5 class with the same semantics under fetch-all (the tests' oracle)
DOC = "least frequently used while cached (libCacheSim LFU; ties to LRU)"
IN_DEFAULT_GRID = True


@njit(inline="always")
def priority(prm, count, score, next_req):
    return float(count)


hit, insert, rekey = heap.hooks(priority)
