"""FIFO: evict the expert inserted longest ago; uses do not reorder it."""

NAME = "fifo"
STRUCTURE = "list"
MOVE_ON_ACCESS = False
DOC = "first in, first out (insertion order only)"
