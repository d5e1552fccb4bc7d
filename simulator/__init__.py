"""The replay engine: one numba kernel (kernel.py) fed by one argument builder (args.py) behind a
validating driver (driver.py)."""

import os

from moesim.jitcache import jitted

for _name in ("batch", "kernel", "stack_distance"):  # cached jitted functions: decorated under the hashed dir
    jitted(f"moesim.simulator.{_name}")

from moesim.simulator.config import SimConfig  # noqa: E402
from moesim.simulator.driver import simulate as _replay  # noqa: E402
from moesim.simulator.result import SimResult  # noqa: E402


def simulate(routing, config: SimConfig | None = None, *, cost=None, record: bool = False, stream: bool | None = None,
             chunk_tokens: int | None = None, tokens: bool = True, **kwargs) -> SimResult:
    """``simulator.driver.simulate`` (its docstring), with speculative steps: a config with ``speculative`` = G
    replays steps that verify G + 1 tokens per sequence (simulator/speculative.py), in memory."""
    if config is None and kwargs.get("speculative"):
        from moesim.errors import MoesimError

        try:
            config = SimConfig(**kwargs)
        except TypeError as exc:
            raise MoesimError(f"bad simulation option ({exc})") from None
        kwargs = {}
    if config is not None and config.speculative:
        from moesim.errors import MoesimError
        from moesim.simulator.speculative import simulate_speculative
        from moesim.traces.routing import Routing, load_routing

        if kwargs:
            raise MoesimError("give either a SimConfig or keyword options, not both")
        if stream or not (isinstance(routing, Routing) or isinstance(routing, (str, os.PathLike))):
            raise MoesimError("--speculative replays in memory only: use --no-stream, or a shorter trace")
        if not isinstance(routing, Routing):
            routing = load_routing(routing)
        res = simulate_speculative(routing, config, config.speculative, config.accept, cost=cost)
        if not record:
            res.decisions = None
        return res
    return _replay(routing, config, cost=cost, record=record, stream=stream, chunk_tokens=chunk_tokens,
                   tokens=tokens, **kwargs)


simulate.__doc__ = (_replay.__doc__ or "") + "\n\n    " + (simulate.__doc__ or "")

__all__ = ["SimConfig", "SimResult", "simulate"]
