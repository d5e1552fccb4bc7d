"""Eviction policies (one module each, see registry.py) and miss policies (miss.py)."""
