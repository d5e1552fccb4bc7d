"""Shared test fixtures. ../shared (real routing data) is optional: tests that need it skip."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SHARED = Path(os.environ.get("MOESIM_SHARED", REPO.parent / "shared"))
FLAME = SHARED / "data" / "flame-moe-290m"


@pytest.fixture(scope="session", autouse=True)
def compiled_kernels():
    """Every replay kernel compiled (or loaded from numba's cache) before the first test, so that commands run
    in subprocesses find them cached: no compile notice beside the one line of an error, no compile time
    inside a test's timeout."""
    from moesim.simulator import kernels

    kernels.ensure(kernels.every_variant())


@pytest.fixture(scope="session")
def flame_dir() -> Path:
    if not FLAME.is_dir():
        pytest.skip(f"real FLAME-MoE sample not found at {FLAME} (set MOESIM_SHARED to ../shared)")
    return FLAME


@pytest.fixture(scope="session")
def shipped_trace() -> Path:
    return REPO / "traces" / "qwen3next.parquet"
