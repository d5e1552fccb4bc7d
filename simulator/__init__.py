"""The replay engine: one numba kernel (kernel.py) behind a validating driver (driver.py)."""

from moesim.simulator.jitcache import numba_cache_dir

with numba_cache_dir():
    from moesim.simulator import kernel  # noqa: F401  (decorated under the source-hashed cache dir)

from moesim.simulator.config import SimConfig
from moesim.simulator.driver import simulate
from moesim.simulator.result import SimResult

__all__ = ["SimConfig", "SimResult", "simulate"]
