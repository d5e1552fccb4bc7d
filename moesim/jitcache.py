"""Keep numba's on-disk cache honest.

``cache=True`` does not notice edits to a jitted function defined in another
file (a cached kernel kept calling an old policy hook), so modules with jitted
code are compiled into a cache directory named by a hash of every source file
that holds jitted code. A second process with the same sources starts instantly.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
from pathlib import Path

# folders (relative to the repository root, i.e. the moesim namespace's sources) holding jitted code;
# every file of policies/ counts, since the registry compiles the set of policy modules into the kernel
_JIT_DIRS = ("simulator", "policies", "traces")


def source_hash() -> str:
    """Hash of the files that hold jitted code (they import numba) and of every policy module:
    editing a sweep or report module keeps the compiled kernel."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.blake2b(digest_size=8)
    for d in (root / name for name in _JIT_DIRS):
        for f in sorted(d.glob("*.py")):
            text = f.read_bytes()
            if d.name == "policies" or b"from numba import" in text or b"import numba" in text:
                h.update(f"{d.name}/{f.name}".encode())
                h.update(text)
    return h.hexdigest()


@contextlib.contextmanager
def numba_cache_dir():
    """Point numba's cache at ~/.cache/moesim/numba/<source hash> while jitted modules are
    imported (numba picks the cache location when a function is decorated). A user's
    NUMBA_CACHE_DIR is respected."""
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


def jitted(module: str):
    """Import a module with cached jitted functions under the hashed cache directory."""
    import sys

    if module in sys.modules:
        return sys.modules[module]
    with numba_cache_dir():
        return importlib.import_module(module)
