"""Keep numba's on-disk cache honest.

``cache=True`` does not notice edits to a jitted function defined in another
file (a cached kernel kept calling an old policy hook), so the kernel modules are
compiled into a cache directory named by a hash of the engine's source files.
A second process with the same sources starts instantly."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

_ENGINE_DIRS = ("simulator", "policies")


def source_hash() -> str:
    """Hash of the engine files that hold jitted code (they import numba): editing a sweep
    or report module keeps the compiled kernel."""
    here = Path(__file__).resolve().parent
    h = hashlib.blake2b(digest_size=8)
    for d in (here.parent / name for name in _ENGINE_DIRS):
        for f in sorted(d.glob("*.py")):
            text = f.read_bytes()
            if b"from numba import" in text or b"import numba" in text:
                h.update(f.name.encode())
                h.update(text)
    return h.hexdigest()


@contextlib.contextmanager
def numba_cache_dir():
    """Point numba's cache at ~/.cache/moesim/numba/<source hash> while the kernel
    modules are imported (numba picks the cache location when a function is
    decorated). A user's NUMBA_CACHE_DIR is respected."""
    import numba

    if os.environ.get("NUMBA_CACHE_DIR"):
        yield
        return
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "moesim" / "numba" / source_hash()
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError:
        yield  # unwritable home: numba falls back to __pycache__ or no cache
        return
    old = numba.config.CACHE_DIR
    numba.config.CACHE_DIR = str(base)
    try:
        yield
    finally:
        numba.config.CACHE_DIR = old
