"""moesim: replay MoE router traces through simulated expert caches."""

from importlib.metadata import PackageNotFoundError, version

from moesim.errors import MoesimError

try:
    __version__ = version("moesim")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = ["MoesimError", "__version__"]
