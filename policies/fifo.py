"""FIFO: evict the expert inserted longest ago; uses do not reorder it."""

from moesim.policies import lists

NAME = "fifo"
DOC = "first in, first out (insertion order only)"
IN_DEFAULT_GRID = True

hit = lists.stay
insert = lists.insert_front
