"""The replay engine: numba kernels compiled per eviction policy and feature family (kernels.py, from the
templates kernel_plain.py and kernel_ext.py) fed by one argument builder (args.py) behind a validating
driver (driver.py)."""

from moesim.simulator.config import SimConfig
from moesim.simulator.driver import simulate
from moesim.simulator.result import SimResult

__all__ = ["SimConfig", "SimResult", "simulate"]
