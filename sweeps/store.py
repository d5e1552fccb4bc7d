"""The keyed result store of a sweep: results.parquet (one row per config) and results.layers.parquet
(one row per config x MoE layer), both keyed by ``row_key`` = trace digest : config key : cost key.

Rows already in the files are never recomputed; new rows are merged in and both files are rewritten
atomically (layers first, so a config present in the main file always has its layer rows). A config
counts as done only when it is in both files.
"""

from __future__ import annotations

import os
from pathlib import Path

from moesim.errors import MoesimError
from moesim.files import write_table
from moesim.sweeps.ranking import annotate
from moesim.sweeps.schema import LAYER_SCHEMA, ROW_SCHEMA, frame, polars_schema


def layers_path(path: str | os.PathLike) -> Path:
    """results.parquet -> results.layers.parquet"""
    p = Path(path)
    return p.with_name(p.stem + ".layers" + p.suffix)


def _conform(df, schema: dict[str, str]):
    """Columns in the store's order and types; unknown extra columns (a newer writer) are kept at the end."""
    import polars as pl

    types = polars_schema(schema)
    cols = []
    for name, t in types.items():
        cols.append(pl.col(name).cast(t) if name in df.columns else pl.lit(None, dtype=t).alias(name))
    extra = [c for c in df.columns if c not in types]
    return df.select(cols + extra)


def _remove_stale_partials(path: Path) -> None:
    """Temp files (.NAME.PID.partial, see moesim/files.py) left by a sweep that was killed mid-write."""
    for p in (path, layers_path(path)):
        for tmp in p.parent.glob(f".{p.name}.*.partial"):
            try:
                pid = int(tmp.name[len(p.name) + 2:].split(".")[0])
                os.kill(pid, 0)  # still running: its file, leave it
            except ProcessLookupError:
                tmp.unlink(missing_ok=True)
            except (ValueError, PermissionError, OSError):
                pass


class ResultStore:
    """Rows of one results file, plus what this process adds; ``flush`` rewrites both files."""

    def __init__(self, path: str | os.PathLike | None):
        import polars as pl

        self.path = Path(path) if path is not None else None
        if self.path is not None and self.path.suffix != ".parquet":
            raise MoesimError(f"{self.path}: sweep results are stored as Parquet (-o NAME.parquet); "
                              "use --format csv|json to print other formats")
        if self.path is not None:
            _remove_stale_partials(self.path)
        self.old_rows = frame([], ROW_SCHEMA)
        self.old_layers = frame([], LAYER_SCHEMA)
        if self.path is not None and self.path.exists():
            lp = layers_path(self.path)
            try:
                rows = _conform(pl.read_parquet(self.path), ROW_SCHEMA)
                layers = _conform(pl.read_parquet(lp), LAYER_SCHEMA) if lp.exists() else self.old_layers
            except Exception as exc:  # a foreign or damaged file: never overwrite it silently
                raise MoesimError(f"{self.path}: cannot read existing results ({exc}); move it away or pick "
                                  "another -o") from None
            done = set(rows["row_key"].to_list()) & set(layers["row_key"].to_list())
            self.old_rows = rows.filter(pl.col("row_key").is_in(sorted(done)))
            self.old_layers = layers.filter(pl.col("row_key").is_in(sorted(done)))
        self.done = set(self.old_rows["row_key"].to_list())
        self.new_rows: list[dict] = []
        self.new_layers: list[dict] = []
        self.dirty = False

    def __contains__(self, row_key: str) -> bool:
        return row_key in self.done

    def add(self, row: dict, layer_rows: list[dict]) -> None:
        self.new_rows.append(row)
        self.new_layers.extend(layer_rows)
        self.done.add(row["row_key"])
        self.dirty = True

    def rows(self):
        """Every row (file + new), derived columns recomputed over all of them, in a stable order."""
        import polars as pl

        df = pl.concat([self.old_rows, frame(self.new_rows, ROW_SCHEMA)], how="diagonal_relaxed")
        return annotate(df)

    def layers(self):
        import polars as pl

        df = pl.concat([self.old_layers, frame(self.new_layers, LAYER_SCHEMA)], how="diagonal_relaxed")
        return df.sort(["row_key", "layer"])

    def flush(self) -> None:
        if self.path is None or not self.dirty:
            return
        write_table(self.layers(), layers_path(self.path))
        write_table(self.rows(), self.path)
        self.dirty = False
