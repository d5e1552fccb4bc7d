"""Tables read back from files (sweep results, quality results): checked like traces are, so a damaged
or hand-edited file is one line naming the file, the column and the row, never a printed nan, a
negative time or a traceback further on."""

from __future__ import annotations

import os
from collections.abc import Iterable

from moesim.errors import MoesimError


def read_parquet(path: str | os.PathLike, what: str, *, note: bool = True):
    """A Parquet table moesim wrote, as polars. Read with pyarrow, which raises on a damaged file where
    polars may panic (a BaseException, and a Rust backtrace on stderr). ``note``: see files.regular_file."""
    import polars as pl
    import pyarrow.parquet as pq

    from moesim.files import regular_file

    regular_file(path, what, note=note)
    try:
        return pl.DataFrame(pl.from_arrow(pq.read_table(path)))
    except Exception as exc:  # noqa: BLE001 - any unreadable file is one error line
        raise MoesimError(f"{path}: not a readable Parquet file ({' '.join(str(exc).split())[:160]})") from None


def typed(df, path: str | os.PathLike, types: dict):
    """``df`` with every column of ``types`` (name -> polars type) that it has cast to that type; a column
    that cannot be is refused."""
    import polars as pl

    for name, t in types.items():
        if name not in df.columns or df[name].dtype == t:
            continue
        try:
            df = df.with_columns(pl.col(name).cast(t, strict=True))
        except Exception:  # noqa: BLE001 - polars raises several types for a failed cast
            raise MoesimError(f"{path}: column {name} holds {df[name].dtype} values, not {t}; not a file moesim "
                              "wrote, or damaged") from None
    return df


def check_values(df, path: str | os.PathLike, columns: Iterable[str], lo: float | None = None,
                 hi: float | None = None, *, nulls: bool = True, when=None) -> None:
    """Every value of ``columns`` (those ``df`` has) finite and within [lo, hi]; nulls refused unless
    ``nulls``. ``when``: a polars expression selecting the rows the rule applies to (a hit rate is NaN by
    definition where there were no requests)."""
    import polars as pl

    for name in columns:
        if name not in df.columns:
            continue
        col = pl.col(name).cast(pl.Float64)
        bad = col.is_nan() | col.is_infinite()
        if lo is not None:
            bad = bad | (col < lo)
        if hi is not None:
            bad = bad | (col > hi)
        bad = bad.fill_null(not nulls)
        if when is not None:
            bad = bad & when.fill_null(True)
        hits = df.select(bad.arg_true().head(1)).to_series()
        if hits.len():
            i = int(hits[0])
            bounds = (f" in {lo:g}..{hi:g}" if hi is not None else f" >= {lo:g}") if lo is not None else ""
            raise MoesimError(f"{path}: row {i} has {name} = {df[name][i]!r}; it must be a finite number{bounds}: "
                              "not a file moesim wrote, or damaged")


def check_equal(df, path: str | os.PathLike, name: str, expected, what: str, *, when=None) -> None:
    """Column ``name`` equals the polars expression ``expected`` (to 1e-9, relative) on the rows ``when``
    selects: a rate that disagrees with its counters."""
    import polars as pl

    if name not in df.columns:
        return
    got = pl.col(name).cast(pl.Float64)
    bad = ((got - expected).abs() > 1e-9 * expected.abs().clip(lower_bound=1.0)).fill_null(False)
    if when is not None:
        bad = bad & when.fill_null(False)
    hits = df.select(bad.arg_true().head(1)).to_series()
    if hits.len():
        i = int(hits[0])
        raise MoesimError(f"{path}: row {i} has {name} = {df[name][i]!r}, but {what} give "
                          f"{df.select(expected).to_series()[i]!r}: not a file moesim wrote, or damaged")


__all__ = ["read_parquet", "typed", "check_values", "check_equal"]
