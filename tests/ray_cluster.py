"""A real multi-process Ray cluster on this machine: `ray start --head` plus worker nodes, each its own
raylet and object store, all on a loopback address. Used by the multi-node test and benchmarks/ray_cluster.py.

Every node runs `ray start --block` in its own session, so stopping it is a SIGTERM to a process this
helper started (Ray then drains and stops that node's processes); `ray stop` is never used, since it
would stop every Ray process on the machine, other people's clusters included."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# 127.0.0.1 is rewritten by Ray to the machine's outward address; any other loopback address is kept,
# so all cluster traffic stays on the loopback interface
HOST = "127.0.0.2"
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_exe() -> str:
    exe = Path(sys.executable).with_name("ray")
    return str(exe) if exe.exists() else "ray"


def _node_args(temp_dir: str, cpus: int) -> list[str]:
    # every port chosen free, so parallel test runs and other clusters on the machine do not collide
    return [f"--temp-dir={temp_dir}", f"--num-cpus={cpus}", f"--node-ip-address={HOST}", "--block",
            "--disable-usage-stats", f"--node-manager-port={_free_port()}",
            f"--object-manager-port={_free_port()}", f"--dashboard-agent-listen-port={_free_port()}",
            f"--dashboard-agent-grpc-port={_free_port()}", f"--runtime-env-agent-port={_free_port()}",
            f"--metrics-export-port={_free_port()}", "--min-worker-port=0", "--max-worker-port=0",
            "--object-store-memory=200000000"]


def _wait_for(log: Path, proc: subprocess.Popen, text: str, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"ray node exited ({proc.returncode}):\n{log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.25)
    raise TimeoutError(f"ray node not up after {timeout} s:\n{log.read_text(errors='replace')[-2000:]}")


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    end = time.monotonic() + 45
    for p in procs:
        try:
            p.wait(max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # the session this helper created for that node
            p.wait()


@contextlib.contextmanager
def local_cluster(nodes: int = 2, cpus_per_node: int = 1, timeout: float = 90):
    """Start a head and ``nodes - 1`` worker nodes; yield the address (for RAY_ADDRESS). Every node is
    stopped on exit, also when the body or the start fails."""
    env = {**os.environ, **RAY_ENV}
    env.pop("RAY_ADDRESS", None)
    dirs: list[str] = []
    procs: list[subprocess.Popen] = []
    try:
        port = _free_port()
        address = f"{HOST}:{port}"
        for i in range(nodes):
            d = tempfile.mkdtemp(prefix="mray")  # short: Ray's unix socket paths are length-limited
            dirs.append(d)
            log = Path(d) / "node.log"
            if i == 0:
                args = ["start", "--head", f"--port={port}", "--include-dashboard=false",
                        f"--dashboard-port={_free_port()}"]
            else:
                args = ["start", f"--address={address}"]
            with open(log, "wb") as out:
                procs.append(subprocess.Popen([_ray_exe(), *args, *_node_args(d, cpus_per_node)], env=env,
                                              stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              start_new_session=True))
            _wait_for(log, procs[-1], "Ray runtime started", timeout)
        yield address
    finally:
        _stop(procs[::-1])
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


def wait_for_nodes(n: int, timeout: float = 60) -> None:
    """Block until ``n`` nodes are alive in the cluster this process is connected to."""
    import ray

    end = time.monotonic() + timeout
    while sum(1 for node in ray.nodes() if node["Alive"]) < n:
        if time.monotonic() > end:
            raise TimeoutError(f"fewer than {n} Ray nodes alive after {timeout} s")
        time.sleep(0.25)
