"""moesim: replay MoE router traces through simulated expert caches.

The Python API (moesim/api.py) loads lazily, so ``import moesim`` and the CLI start fast:
``moesim.load_trace``, ``moesim.simulate``, ``moesim.sweep``, ``moesim.mrc``.
"""

from importlib.metadata import PackageNotFoundError, version

from moesim.errors import MoesimError

try:
    __version__ = version("moesim")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

_API = ("load_trace", "simulate", "sweep", "mrc")

__all__ = ["MoesimError", "__version__", *_API]


def __dir__():
    # the lazily loaded API is part of the module: dir(moesim) and tab completion list it
    return sorted(__all__)


def __getattr__(name):
    if name in _API:
        from moesim import api

        return getattr(api, name)
    raise AttributeError(f"module 'moesim' has no attribute {name!r}")
