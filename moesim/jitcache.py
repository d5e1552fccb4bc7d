"""numba's on-disk cache, one directory per component, and functions specialized by binding globals.

numba's ``cache=True`` stamps a cached function with its own source file only: an edit to a jitted
function it calls in another file goes unnoticed (a cached kernel kept calling an old policy hook).
So every cached function is compiled into a directory named by its *component*: a hash of the
normalized source (docstrings and comments left out) of its module and of every moesim module that
module imports, transitively. Editing a report, a test, a doc string or another component's module
keeps the cache; editing a policy recompiles only the kernels bound to it.

- ``cached_njit(...)``: ``njit(cache=True, ...)`` under the component directory of the function's module.
- ``specialize(template, name, bindings, modules[, sig])``: a copy of ``template`` (same code) whose globals
  ``bindings`` replace (a policy's hooks, compile-time feature constants), jitted and cached under
  ``name`` in the component of ``modules`` and the template's module.
- ``compile_notice()``: around code that may compile, one stderr line when that takes longer than ~2 s,
  and its elapsed time when done; nothing when the kernels come from the cache.

Nothing is ever cached under the source tree: without a writable cache directory, functions compile
in memory only (numba would otherwise write next to the sources).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import sys
import threading
import time
import types
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

NOTICE_AFTER = 2.0  # seconds of compiling before the user is told


def cache_root() -> Path:
    """~/.cache/moesim/numba (or under $XDG_CACHE_HOME); a user's NUMBA_CACHE_DIR wins."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return Path(os.environ["NUMBA_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "moesim" / "numba"


@functools.cache
def module_file(name: str) -> Path | None:
    """The source file of moesim module ``name``, found without importing it (nor its package)."""
    parts = name.split(".")
    if parts[0] != "moesim":
        return None
    if len(parts) == 1:
        return Path(sys.modules["moesim"].__file__ or "")
    top = ".".join(parts[:2])
    pkg = sys.modules.get(top)
    if pkg is not None and hasattr(pkg, "__path__"):
        dirs = list(pkg.__path__)
    else:
        spec = importlib.util.find_spec(top)  # imports only the parent, moesim
        if spec is None:
            return None
        if spec.submodule_search_locations is None:  # a module: moesim.errors is one, moesim.errors.X a name in it
            return Path(spec.origin) if spec.origin and len(parts) == 2 else None
        dirs = list(spec.submodule_search_locations)
    base = Path(dirs[0]).joinpath(*parts[2:])
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None


class _Normalize(ast.NodeTransformer):
    """Drop what cannot change compiled code: docstrings, and a policy module's DOC line."""

    def _body(self, node):
        self.generic_visit(node)
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            body = body[1:] or [ast.Pass()]
        node.body = [s for s in body if not (isinstance(s, ast.Assign) and len(s.targets) == 1
                                             and isinstance(s.targets[0], ast.Name) and s.targets[0].id == "DOC")]
        return node

    visit_Module = visit_FunctionDef = visit_ClassDef = _body


def _parse(path: Path) -> tuple[str, tuple[str, ...], bool]:
    """(hash of the normalized source, the moesim names it imports, whether it holds jitted code) of one file. An
    imported name is ``moesim.a`` or ``moesim.a.b`` for ``from moesim.a import b`` (a module, or a name of
    moesim.a: ``_imported`` tells)."""
    text = path.read_bytes()
    tree = ast.parse(text)
    imports: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imports += [a.name for a in node.names if a.name.split(".")[0] == "moesim"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "moesim":
            imports += [f"{node.module}.{a.name}" for a in node.names]
    digest = hashlib.blake2b(ast.dump(_Normalize().visit(tree)).encode(), digest_size=8).hexdigest()
    return digest, tuple(dict.fromkeys(imports)), b"numba" in text or b"cached_njit" in text


def _imported(name: str) -> str:
    """The module an imported name is: itself when it is a module, else the module it is a name of."""
    return name if module_file(name) is not None else name.rsplit(".", 1)[0]


_MEMO_NAME = "sources-v2.json"  # normalized-source hashes by (path, size, mtime): parsing costs ~20 ms a file


@functools.cache
def _memo() -> dict:
    try:
        return json.loads((cache_root() / _MEMO_NAME).read_text())
    except (OSError, ValueError):
        return {}


def _parsed(path: Path) -> tuple[str, tuple[str, ...], bool]:
    st = path.stat()
    stamp = [st.st_size, st.st_mtime_ns]
    memo = _memo()
    entry = memo.get(str(path))
    if entry is None or entry[0] != stamp:
        digest, imports, jit = _parse(path)
        entry = memo[str(path)] = [stamp, digest, list(imports), jit]
        try:  # a unique temporary name, then a rename: concurrent processes never read half a file
            root = cache_root()
            root.mkdir(parents=True, exist_ok=True)
            tmp = root / f".{_MEMO_NAME}.{os.getpid()}-{threading.get_ident()}"
            tmp.write_text(json.dumps(memo))
            os.replace(tmp, root / _MEMO_NAME)
        except OSError:
            pass
    return entry[1], tuple(entry[2]), bool(entry[3])


def component_modules(modules: Iterable[str]) -> dict[str, str]:
    """The moesim modules a component's compiled code depends on, with their normalized-source hashes: ``modules``
    and what they import, transitively through modules that hold jitted code (what they compile), one level into
    the others (their constants)."""
    roots = set(modules)
    seen: dict[str, str] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen or name == __name__:  # this module compiles nothing itself
            continue
        f = module_file(name)
        if f is None:
            continue
        digest, imports, jit = _parsed(f)
        seen[name] = digest
        if jit or name in roots:
            todo += [_imported(m) for m in imports]
    return seen


def component_hash(modules: Iterable[str]) -> str:
    h = hashlib.blake2b(digest_size=8)
    for name, digest in sorted(component_modules(modules).items()):
        h.update(f"{name}:{digest};".encode())
    return h.hexdigest()


def component_dir(label: str, modules: Iterable[str]) -> Path | None:
    """The writable cache directory of a component (None: caching off)."""
    d = cache_root() / f"{label}-{component_hash(modules)}"
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe = d / f".probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError:
        return None
    return d


@contextlib.contextmanager
def _numba_cache_dir(d: Path):
    """numba reads its cache location when a function is decorated."""
    import numba

    cfg: Any = numba.config  # its settings are set at import time: invisible to a type checker
    old = cfg.CACHE_DIR
    cfg.CACHE_DIR = str(d)
    try:
        yield
    finally:
        cfg.CACHE_DIR = old


def _jit(fn, label: str, modules: Iterable[str], kw: dict, sig=None):
    """njit(fn), cached in the component directory; with ``sig``, compiled (or loaded) for it right away."""
    from numba import njit

    args: tuple = () if sig is None else (sig,)
    d = component_dir(label, modules)
    with quiet_numba():
        if d is None:
            return njit(*args, **kw)(fn)
        with _numba_cache_dir(d):
            return njit(*args, cache=True, **kw)(fn)  # type: ignore[call-overload]


@contextlib.contextmanager
def quiet_numba():
    """numba's notices about its own features (the first-class function types the kernels' rare paths take are
    "experimental") are not the user's business: a compile prints nothing but compile_notice's line."""
    from numba.core.errors import NumbaExperimentalFeatureWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumbaExperimentalFeatureWarning)
        yield


def cached_njit(**kw):
    """``@cached_njit(nogil=True)``: njit with numba's cache, in the component directory of the module."""

    def deco(fn):
        mod = fn.__module__
        return _jit(fn, mod.rsplit(".", 1)[-1], (mod,), kw)

    return deco


def specialize(template: Callable[..., Any], name: str, bindings: dict, modules: Iterable[str], sig=None, **kw):
    """``template`` compiled with the globals in ``bindings`` replaced (frozen into the code as constants), as
    the function ``name`` (for signature ``sig`` right away, if given); cached in the component of ``modules``
    and the template's module."""
    g = dict(template.__globals__)
    g.update(bindings)
    fn = types.FunctionType(template.__code__, g, name, template.__defaults__, template.__closure__)
    fn.__qualname__ = name  # numba's cache files are named by it
    fn.__module__ = template.__module__
    fn.__doc__ = template.__doc__
    return _jit(fn, name, (template.__module__, *modules), kw, sig)


class _Notice:
    def __init__(self, what: str):
        self.what = what
        self.said = False
        self.t0 = time.perf_counter()
        self.timer = threading.Timer(NOTICE_AFTER, self._say)
        self.timer.daemon = True

    def _say(self):
        self.said = True
        print(f"moesim: compiling {self.what} once for this install (cached in {cache_root()})", file=sys.stderr,
              flush=True)


_notice_depth = threading.local()


@contextlib.contextmanager
def compile_notice(what: str = "the replay kernel"):
    """Tell the user (stderr) about a compile that takes longer than NOTICE_AFTER seconds; nested notices
    are one."""
    if getattr(_notice_depth, "n", 0):
        yield
        return
    _notice_depth.n = 1
    n = _Notice(what)
    n.timer.start()
    try:
        yield
    finally:
        n.timer.cancel()
        _notice_depth.n = 0
        if n.said:
            print(f"moesim: compiled in {time.perf_counter() - n.t0:.1f} s", file=sys.stderr, flush=True)
