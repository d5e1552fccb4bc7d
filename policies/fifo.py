"""FIFO: evict the expert inserted longest ago; uses do not reorder it."""

from moesim.policies import lists

NAME = "fifo"
LIBCACHESIM = "FIFO"  # the libCacheSim 0.3.5 class with the same semantics under fetch-all (the tests' oracle)
DOC = "first in, first out (insertion order only)"
IN_DEFAULT_GRID = True

hit = lists.stay
insert = lists.insert_front
