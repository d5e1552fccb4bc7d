"""The replay engine: one numba kernel (kernel.py) fed by one argument builder (args.py) behind a
validating driver (driver.py)."""

from moesim.jitcache import jitted

for _name in ("batch", "kernel", "stack_distance"):  # cached jitted functions: decorated under the hashed dir
    jitted(f"moesim.simulator.{_name}")

from moesim.simulator.config import SimConfig  # noqa: E402
from moesim.simulator.driver import simulate  # noqa: E402
from moesim.simulator.result import SimResult  # noqa: E402

__all__ = ["SimConfig", "SimResult", "simulate"]
