"""Shared by the sweep, mrc and API tests: a small synthetic trace file and a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from moesim.cli import cli

# qwen3-30b-a3b geometry (48 MoE layers x 128 experts, top-8), short: every replay takes milliseconds
TOKENS = 200


def small_trace(dirpath: Path, seqs: int = 2) -> Path:
    from moesim.traces.synthetic import synthesize

    return synthesize("qwen3-30b-a3b", TOKENS, seqs=seqs, seed=3, path=dirpath / "small.parquet")


def run_cli(*args: str, ok: bool = True):
    res = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    if ok:
        assert res.exit_code == 0, res.output + (res.stderr if hasattr(res, "stderr") else "")
    return res


MOESIM = [sys.executable, "-c", "import sys; from moesim.cli import main; sys.argv[0] = 'moesim'; main()"]


def spawn(*args: str, env: dict | None = None) -> subprocess.Popen:
    """``moesim ARGS`` in a child process (its own session, so a signal reaches it alone)."""
    return subprocess.Popen(MOESIM + [str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **(env or {})})
