"""The replay engine: one numba kernel (kernel.py) behind a validating driver (driver.py)."""

from moesim.simulator.jitcache import numba_cache_dir

with numba_cache_dir():  # every module with cached jitted functions is decorated under the hashed dir
    from moesim.simulator import batch, kernel, stack_distance  # noqa: F401

from moesim.simulator.config import SimConfig
from moesim.simulator.driver import simulate
from moesim.simulator.result import SimResult

__all__ = ["SimConfig", "SimResult", "simulate"]
