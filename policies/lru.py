"""LRU: evict the resident expert whose last use is oldest.

A use is a hit, a fetch (insertion), a background admission or running as a
substitute. Kept in an index-linked list (O(1) per access)."""

from moesim.policies import lists

NAME = "lru"
LIBCACHESIM = "LRU"  # the libCacheSim 0.3.5 class with the same semantics under fetch-all (the tests' oracle)
DOC = "least recently used (hits, fetches, admissions and substitute runs refresh recency)"
IN_DEFAULT_GRID = True

hit = lists.move_to_front
insert = lists.insert_front
