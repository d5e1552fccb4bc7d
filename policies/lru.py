"""LRU: evict the resident expert whose last use is oldest.

A use is a hit, a fetch (insertion), a background admission or running as a
substitute. Kept in an index-linked list (O(1) per access)."""

NAME = "lru"
STRUCTURE = "list"
MOVE_ON_ACCESS = True
DOC = "least recently used (hits, fetches, admissions and substitute runs refresh recency)"
