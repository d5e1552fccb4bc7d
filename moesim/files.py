"""Writing tables and text to files atomically: the file appears whole or not at all."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from moesim.errors import MoesimError

SUFFIXES = (".csv", ".parquet", ".json")


def atomic_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.partial")


@contextlib.contextmanager
def atomic(path: str | os.PathLike):
    """Yield a temporary path beside ``path``; on success rename it into place, else remove it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = atomic_path(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_table(frame, path: str | os.PathLike) -> Path:
    """Write a polars DataFrame as CSV, Parquet or JSON, chosen by the suffix."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise MoesimError(f"{path}: unknown table format (use one of {', '.join(SUFFIXES)})")
    writer = {".csv": frame.write_csv, ".parquet": frame.write_parquet, ".json": frame.write_json}[path.suffix]
    with atomic(path) as tmp:
        writer(tmp)
    return path


def write_text(text: str, path: str | os.PathLike) -> Path:
    with atomic(path) as tmp:
        tmp.write_text(text)
    return Path(path)
