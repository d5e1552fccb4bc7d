"""Where a sweep's replays run: in this process, in forked worker processes that share the decoded
arrays copy-on-write, or as Ray tasks. Workers return plain Python values (polars is not fork-safe)."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

from moesim.errors import MoesimError
from moesim.policies import registry
from moesim.simulator import SimConfig, kernels, simulate
from moesim.simulator.args import variant_of
from moesim.simulator.bootstrap import CI
from moesim.simulator.rotation import warm_unit_sums
from moesim.simulator.units import replay_units
from moesim.traces.routing import STEP_ARRAYS, TOKEN_ARRAYS
from moesim.traces.stream import DecodedStore

EXECUTORS = ("local", "ray")
# Tests slow each replay down by this many seconds to interrupt a sweep midway (never set it otherwise).
_DELAY_ENV = "MOESIM_SWEEP_TEST_DELAY"


@dataclass(frozen=True)
class Task:
    row_key: str
    trace: int      # index into the sweep's traces
    cost: int       # index into the sweep's costs
    config: SimConfig
    replay_key: str = ""  # tasks whose configs replay identically share one replay (grid.replay_twin)
    holdout: int = 0  # the sweep's holdout prefix (sweeps/holdout.py) in this trace's tokens, folded into config
    grid_key: str = ""  # the key of the grid's config before the holdout folded in (measured quality joins on it)


def replay_payload(routing, config: SimConfig, cost, ci: CI | None = None) -> dict:
    """Replay one config of a Routing or a streamed DecodedStore (which keeps no per-token series); return
    plain Python values only (workers must not touch polars: it is not fork-safe). With ``ci`` (--ci), also
    the replay's sums per resampling unit."""
    delay = float(os.environ.get(_DELAY_ENV, "0") or 0)
    if delay > 0:
        time.sleep(delay)
    res = simulate(routing, config, cost=cost, tokens=not isinstance(routing, DecodedStore), generic=True)
    return payload(res, routing=routing, config=config, cost=cost, ci=ci)


def payload(res, *, routing=None, config: SimConfig | None = None, cost=None, ci: CI | None = None) -> dict:
    """The plain values of a SimResult that a sweep row is made of; with ``ci``, its sums per unit
    (a small array: units x simulator/units.py SUM_NAMES) and the cold-start offset, counted as
    ``ci.method`` says (simulator/rotation.py: one more replay), for the parent's confidence intervals."""
    out = {"totals": res.totals(), "layers": res.layer_rows(), "timing": res.timing,
           "slots_per_layer": res.slots_per_layer, "counted_tokens": res.counted_tokens}
    if ci is not None:
        assert routing is not None and config is not None
        units = replay_units(routing, config, ci.unit)
        sums, offset, method = warm_unit_sums(routing, config, units, res, cost, ci.method)
        out["units"] = {"rule": ci.unit, "method": method, "kind": units.kind, "n": units.n,
                        "block_steps": units.block_steps, "sums": sums, "offset": offset}
    return out


_SHARED: dict = {}  # set before forking: the decoded traces and costs the workers read


def _run_task(task: Task) -> tuple[str, dict]:
    return task.replay_key, replay_payload(_SHARED["routings"][task.trace], task.config,
                                           _SHARED["costs"][task.cost], _SHARED.get("ci"))


def _worker_init() -> None:
    # The parent handles Ctrl-C (flush, then terminate the pool); a worker must not die mid-result.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:  # Linux: die with the parent, so a killed sweep leaves no orphaned workers behind
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _serial(tasks):
    for task in tasks:
        yield _run_task(task)


def _forked(tasks, jobs: int):
    import multiprocessing as mp

    pool = mp.get_context("fork").Pool(jobs, initializer=_worker_init)
    try:
        yield from pool.imap_unordered(_run_task, tasks, chunksize=1)
        pool.close()
        pool.join()
    finally:
        pool.terminate()


_RAY_TRACES: dict = {}  # per Ray worker process: object ref -> the trace, its arrays in the node's object store
_ROUTING_ARRAYS = TOKEN_ARRAYS + STEP_ARRAYS  # a Routing's arrays (None where it has no such data)


class _Writable:
    """NumPy's array interface over another array's memory, flagged writable. Ray's object store hands
    out zero-copy arrays that are read-only, and numba would compile (minutes, cold) a second kernel
    signature for read-only arrays; the replay never writes to routing arrays, so a writable alias of
    the node's single copy replaces the per-process copy."""

    def __init__(self, a):
        self.base = a  # keeps the object-store buffer alive as long as the alias
        self.__array_interface__ = {"shape": a.shape, "typestr": a.dtype.str, "strides": a.strides,
                                    "data": (a.ctypes.data, False), "version": 3}


def shared_alias(a):
    """``a`` itself when writable, else a writable alias of the same memory (no copy)."""
    import numpy as np

    if not isinstance(a, np.ndarray) or a.flags.writeable or a.size == 0:
        return a
    return np.asarray(_Writable(a))


def _ray_batch(trace_ref, cost, tasks, ci=None):
    """Runs in a Ray worker. ``trace_ref`` is [ObjectRef] (wrapped so Ray does not resolve it). The
    trace moves to a node once: Ray's object manager pulls the object into that node's shared-memory
    object store the first time a task there asks for it, and every worker process on the node maps
    the same copy (zero-copy). A worker keeps its mapping for its later batches."""
    import ray

    key = trace_ref[0].hex()
    local = _RAY_TRACES.get(key)
    if local is None:
        routing = ray.get(trace_ref[0])
        local = dataclasses.replace(routing.without_derived(),
                                    **{n: shared_alias(getattr(routing, n)) for n in _ROUTING_ARRAYS})
        _RAY_TRACES.clear()  # one trace at a time per worker: bounded memory
        _RAY_TRACES[key] = local
    node = ray.get_runtime_context().get_node_id()
    return node, [(t.replay_key, replay_payload(local, t.config, cost, ci)) for t in tasks]


def routing_nbytes(routing) -> int:
    """Bytes of a decoded trace's arrays: what ray.put stores and what moves to each node once."""
    import numpy as np

    return sum(a.nbytes for n in _ROUTING_ARRAYS if isinstance(a := getattr(routing, n), np.ndarray))


def execute(work: list[Task], routings: list, costs: list, *, jobs: int | None = None, executor: str = "local",
            ci: CI | None = None, stats: dict | None = None):
    """Replay every task; yield (replay_key, payload) as they finish, in any order. Close the
    generator (or let an exception through) to stop: worker processes are terminated. ``ci``: add
    each replay's sums per resampling unit (simulator/units.py, simulator/rotation.py). On Ray,
    ``stats`` (a dict) receives what was shipped and where the tasks ran (ray_summary)."""
    if executor not in EXECUTORS:
        raise MoesimError(f"unknown executor {executor!r} (use {' or '.join(EXECUTORS)})")
    if jobs is not None and jobs < 1:
        raise MoesimError(f"--jobs must be at least 1, got {jobs}")
    if not work:
        return
    if executor == "ray":
        yield from _ray(work, jobs, routings, costs, stats if stats is not None else {}, ci)
        return
    # every kernel the grid needs, compiled or loaded once before forking, so that no worker compiles
    kernels.ensure(variant_of(t.config, costs[t.cost], generic=True) for t in work)
    for i, r in enumerate(routings):
        if isinstance(r, DecodedStore):
            if any(t.trace == i and registry.get(t.config.eviction_name).uses_next_request for t in work):
                r.first_requests()  # the reverse pass writes the next requests once, before any worker reads
        elif r is not None:
            r.next_requests()  # computed once and inherited by every worker
    n_jobs = min(jobs or os.cpu_count() or 1, len(work))
    _SHARED.update(routings=routings, costs=costs, ci=ci)
    try:
        yield from (_forked(work, n_jobs) if n_jobs > 1 else _serial(work))
    finally:
        _SHARED.clear()


def _ray(tasks, jobs: int | None, routings, costs, stats: dict, intervals: CI | None = None):
    try:
        import ray
    except ImportError:
        raise MoesimError("--executor ray needs Ray: pip install 'moesim[ray]'") from None
    started = False
    if not ray.is_initialized():
        # RAY_ADDRESS (or a running `ray start` head) is honoured; otherwise a local cluster starts here
        kwargs: dict[str, Any] = {"num_cpus": jobs} if jobs and not os.environ.get("RAY_ADDRESS") else {}
        ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR, **kwargs)
        started = True
    try:
        # SPREAD: batches go round the nodes, so every node of a cluster takes a share
        remote = ray.remote(_ray_batch).options(scheduling_strategy="SPREAD")
        trace_refs, cost_refs = {}, {}
        by_pair: dict[tuple[int, int], list[Task]] = {}
        for t in tasks:
            by_pair.setdefault((t.trace, t.cost), []).append(t)
        n_workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        stats.update(trace_bytes=0, puts=0, tasks=0, nodes={})
        pending = []
        for (ti, ci), group in by_pair.items():
            if ti not in trace_refs:
                # one put per trace: tasks get the reference, never the arrays, so the trace crosses the
                # network once per node (a node's object store holds one copy for all its workers)
                trace_refs[ti] = ray.put(routings[ti].without_derived())
                stats["trace_bytes"] += routing_nbytes(routings[ti])
                stats["puts"] += 1
            if ci not in cost_refs:
                cost_refs[ci] = ray.put(costs[ci])
            size = max(1, -(-len(group) // (4 * n_workers)))  # ~4 batches per CPU: balance vs overhead
            for i in range(0, len(group), size):
                pending.append(remote.remote([trace_refs[ti]], cost_refs[ci], group[i:i + size], intervals))
        stats["tasks"] = len(pending)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            node, results = ray.get(ready[0])
            stats["nodes"][node] = stats["nodes"].get(node, 0) + 1
            yield from results
    finally:
        if started:
            ray.shutdown()


def ray_summary(stats: dict) -> str:
    """One line: what a Ray sweep shipped and where it ran."""
    if not stats.get("tasks"):
        return "ray: nothing to run"
    mb = stats["trace_bytes"] / 1e6
    per_node = ", ".join(str(n) for n in sorted(stats["nodes"].values(), reverse=True))
    return (f"ray: {stats['tasks']} tasks on {len(stats['nodes'])} node(s) ({per_node} per node); "
            f"{stats['puts']} trace object(s), {mb:.1f} MB, put once and pulled once by each node")
