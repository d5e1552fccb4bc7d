"""Writing tables to files: format from the suffix, atomically (temp file + rename)."""

from __future__ import annotations

import os
from pathlib import Path

from moesim.errors import MoesimError

SUFFIXES = (".csv", ".parquet", ".json")


def atomic_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.partial")


def write_table(frame, path: str | os.PathLike) -> Path:
    """Write a polars DataFrame as CSV, Parquet or JSON (by suffix); the file appears whole or not at all."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise MoesimError(f"{path}: unknown table format (use one of {', '.join(SUFFIXES)})")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = atomic_path(path)
    try:
        if path.suffix == ".csv":
            frame.write_csv(tmp)
        elif path.suffix == ".parquet":
            frame.write_parquet(tmp)
        else:
            frame.write_json(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_text(text: str, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = atomic_path(path)
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
