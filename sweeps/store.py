"""The keyed result store of a sweep: results.parquet (one row per config) and results.layers.parquet
(one row per config x MoE layer), both keyed by ``row_key`` = trace digest : config key : cost key.

Rows already in the files are never recomputed; new rows are merged in and both files are rewritten
atomically (both written to unique temporaries first, then renamed layers first, so a config present
in the main file always has its layer rows). A config counts as done only when it is in both files.

A sweep with ``--ci`` replays again the rows it finds without unit sums (sweeps/intervals.py) and
replaces them, and gives the rows it reuses its own interval level: rows are added or replaced by
their key, never lost.

Several sweeps may write one results file at once (two grids run side by side, or a second sweep
started before the first ended): every flush takes an exclusive lock (``.NAME.lock`` beside the
results, held only while reading and rewriting the files), re-reads the files if another process
changed them since, and writes the union of their rows and its own, keyed by ``row_key``. So no
sweep that exits 0 loses a row to another, and neither waits for the other's replays.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from moesim.errors import MoesimError
from moesim.files import atomic_files, check_output, write_error, write_table_to
from moesim.sweeps.grid import DEFAULT_BASELINE
from moesim.sweeps.ranking import annotate
from moesim.sweeps.schema import LAYER_SCHEMA, ROW_SCHEMA, frame, polars_schema
from moesim.table_checks import read_parquet

# Columns a file must have to be taken for sweep results (anything else at -o is refused, never replaced).
_KEY_COLUMNS = ("row_key", "trace_digest", "config_key", "cost_key", "group_key", "label")
_LAYER_KEY_COLUMNS = ("row_key", "layer")

try:
    import fcntl
except ImportError:  # not POSIX: no lock; concurrent sweeps to one file are then last-writer-wins
    fcntl = None  # type: ignore[assignment]


def layers_path(path: str | os.PathLike) -> Path:
    """results.parquet -> results.layers.parquet"""
    p = Path(path)
    return p.with_name(p.stem + ".layers" + p.suffix)


def lock_path(path: str | os.PathLike) -> Path:
    p = Path(path)
    return p.with_name(f".{p.name}.lock")


# Columns older versions wrote that are now derived under another name (dropped when a file is read).
RETIRED = ("speedup_vs_fetch_all",)


def _conform(df, schema: dict[str, str]):
    """Columns in the store's order and types; unknown extra columns (a newer writer) are kept at the end."""
    import polars as pl

    df = df.drop([c for c in RETIRED if c in df.columns])
    types = polars_schema(schema)
    cols = []
    for name, t in types.items():
        cols.append(pl.col(name).cast(t) if name in df.columns else pl.lit(None, dtype=t).alias(name))
    extra = [c for c in df.columns if c not in types]
    return df.select(cols + extra)


def _stat(path: Path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on ``.NAME.lock`` (created beside the results, left there) for the block."""
    if fcntl is None:
        yield
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as exc:
        raise write_error(path, exc) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _columns(path: Path) -> set[str] | None:
    """The column names in a Parquet file's footer, None when it is not Parquet or is damaged."""
    import pyarrow.parquet as pq

    try:
        return set(pq.read_schema(path).names)
    except Exception:  # noqa: BLE001 - unreadable or not Parquet: reading it says what is wrong
        return None


def _read(path: Path, traces: dict | None = None):
    """(rows, layers) of a results file pair, only configs present in both; None if there is no file.
    ``traces``: as checked_rows takes them."""
    import polars as pl

    lp = layers_path(path)
    if not path.exists():
        if lp.exists():  # results removed, or a file of that name that has nothing to do with the sweep
            _check_layers_file(lp)
        return None
    names = _columns(path)  # from the footer first: a foreign Parquet file (a trace, say) is never decoded
    missing = [c for c in _KEY_COLUMNS if names is not None and c not in names]
    if missing:
        raise MoesimError(f"{path}: exists and is not a moesim sweep results file (no {', '.join(missing)} "
                          "column); refusing to replace it: move it away or pick another -o")
    try:  # not an input (no note): the file this sweep extends
        rows = read_parquet(path, "results file", note=False)
        layers = read_parquet(lp, "per-layer results file", note=False) if lp.exists() else None
    except MoesimError as exc:  # a foreign or damaged file: never overwrite it silently
        raise MoesimError(f"{exc}; refusing to replace it: move it away or pick another -o") from None
    if layers is not None:
        _check_layers_file(lp, layers.columns)
    rows = checked_rows(rows, path, traces=traces)
    layers = checked_rows(layers, lp, LAYER_SCHEMA) if layers is not None else frame([], LAYER_SCHEMA)
    done = sorted(set(rows["row_key"].to_list()) & set(layers["row_key"].to_list()))
    return rows.filter(pl.col("row_key").is_in(done)), layers.filter(pl.col("row_key").is_in(done))


def _check_layers_file(lp: Path, columns=None) -> None:
    """``lp`` (a sweep's NAME.layers.parquet side file) is one: never replace a foreign file of that name."""
    if columns is None:
        import pyarrow.parquet as pq

        try:
            columns = pq.read_schema(lp).names
        except Exception:  # noqa: BLE001 - unreadable or not Parquet: not a file the sweep wrote
            columns = []
    if any(c not in columns for c in _LAYER_KEY_COLUMNS):
        raise MoesimError(f"{lp}: exists and is not the per-layer file of moesim sweep results; refusing to "
                          "replace it: move it away or pick another -o")


_RATES = ("hit_rate", "miss_rate", "substitution_rate", "drop_rate")
_OF_REQUESTS = {"hit_rate": "hits", "miss_rate": "misses", "substitution_rate": "substitutions", "drop_rate": "drops"}
_NONNEGATIVE = ("mass", "counted_tokens", "slots_per_layer", "warmup_tokens", "s_per_token", "ms_per_token",
                "tok_per_s", "stall_per_token", "gb_per_token_sync", "gb_per_token_background", "gb_per_token_nvme",
                "gb_per_token_cpu", "gb_per_token_vram_experts", "gb_per_token_prefetch", "vram_gib_for_cache",
                "vram_gib_free", "layer")


def checked_rows(df, path, schema: dict[str, str] = ROW_SCHEMA, traces: dict | None = None):
    """A results (or per-layer) table read from ``path`` in the store's columns and types, its numbers
    checked: counters and times finite and not negative, rates in 0..1 and equal to their counters (NaN only
    where there were no requests). ``traces``: {digest: (model_id, n_experts, n_tokens or None)} of traces
    at hand; their rows must agree with them (model, slots, counted tokens)."""
    import polars as pl

    from moesim.simulator.counters import COUNTER_NAMES
    from moesim.table_checks import check_equal, check_values, typed

    df = _conform(typed(df, path, polars_schema(schema)), schema)
    asked = pl.col("requests") > 0
    check_values(df, path, (*COUNTER_NAMES, *_NONNEGATIVE, "mass_per_step"), lo=0)
    check_values(df, path, ("batch",), lo=1)
    check_values(df, path, ("budget", "lowbit_share"), lo=0, hi=1)
    check_values(df, path, _RATES, lo=0, hi=1, when=asked)
    for rate, counter in _OF_REQUESTS.items():
        check_equal(df, path, rate, pl.col(counter) / pl.col("requests"), f"its {counter} and requests", when=asked)
    for digest, (model_id, n_experts, n_tokens) in (traces or {}).items():
        _agree(df.filter(pl.col("trace_digest") == digest), path, model_id, n_experts, n_tokens)
    return df


def _agree(df, path, model_id, n_experts: int, n_tokens: int | None) -> None:
    import polars as pl

    bad = [("slots_per_layer", pl.col("slots_per_layer") > n_experts, f"more than the trace's {n_experts} experts")]
    if n_tokens is not None:
        bad.append(("counted_tokens", pl.col("counted_tokens") > n_tokens, f"more than the trace's {n_tokens} tokens"))
    if "model_id" in df.columns and model_id is not None:
        bad.append(("model_id", pl.col("model_id") != model_id, f"not the trace's model {model_id!r}"))
    for name, expr, why in bad:
        if name not in df.columns:
            continue
        rows = df.filter(expr.fill_null(False))
        if rows.height:
            raise MoesimError(f"{path}: a row of this trace has {name} = {rows[name][0]!r}, {why}: results of "
                              "another trace with the same digest, or a damaged file")


def conform_rows(df):
    """A results table (of any moesim version) in the store's row columns and types."""
    return _conform(df, ROW_SCHEMA)


class ResultStore:
    """Rows of one results file, plus what this process adds; ``flush`` merges them into both files.
    ``inputs``: the sweep's traces, which neither file may be; ``traces``: {digest: (model_id, n_experts,
    n_tokens or None)}, which the stored rows of those traces must agree with."""

    def __init__(self, path: str | os.PathLike | None, inputs=(), *, baseline: str = DEFAULT_BASELINE,
                 rank_by: str = "class", traces: dict | None = None):
        self.baseline, self.rank_by, self.traces = baseline, rank_by, traces
        self.path = Path(path) if path is not None else None
        if self.path is not None and self.path.suffix != ".parquet":
            raise MoesimError(f"{self.path}: sweep results are stored as Parquet (-o NAME.parquet); "
                              "use --format csv|json to print other formats")
        self.old_rows = frame([], ROW_SCHEMA)
        self.old_layers = frame([], LAYER_SCHEMA)
        self.replaced: set[str] = set()  # keys this process rewrote: its version wins over the file's
        self._units_of: tuple | None = None  # (old_rows, {row_key: (ci_rule, ci_method)}) for has_units
        self._seen = None  # (stat of rows, stat of layers) as last read or written by this process
        if self.path is not None:
            self.inputs = list(inputs)
            for p in (self.path, layers_path(self.path)):
                check_output(p, self.inputs)
            # no lock needed to read: both files are replaced by renames, the layers file first, so a
            # reader sees per-layer rows for every row it sees (at worst it recomputes a config)
            self._load()
        self.done = set(self.old_rows["row_key"].to_list())
        self.new_rows: list[dict] = []
        self.new_layers: list[dict] = []
        self.dirty = False

    def _signature(self):
        assert self.path is not None
        return _stat(self.path), _stat(layers_path(self.path))

    def _load(self) -> None:
        """Merge what is on disk into the rows held."""
        import polars as pl

        assert self.path is not None
        found = _read(self.path, self.traces)
        self._seen = self._signature()
        if found is None:
            return
        rows, layers = found
        if self.replaced:
            theirs = ~pl.col("row_key").is_in(list(self.replaced))
            rows, layers = rows.filter(theirs), layers.filter(theirs)
        mine = self.old_rows.filter(~pl.col("row_key").is_in(rows["row_key"].to_list()))
        self.old_rows = pl.concat([rows, _conform(mine, ROW_SCHEMA)], how="diagonal_relaxed")
        mine_layers = self.old_layers.filter(~pl.col("row_key").is_in(rows["row_key"].to_list()))
        self.old_layers = pl.concat([layers, _conform(mine_layers, LAYER_SCHEMA)], how="diagonal_relaxed")

    def __contains__(self, row_key: str) -> bool:
        return row_key in self.done

    def has_units(self, row_key: str, rule: str, method: str) -> bool:
        """The row is stored with its sums per resampling unit taken by ``rule`` (--ci-unit) and
        ``method`` (--ci-method, as simulator/rotation.py applies it)."""
        import polars as pl

        def match(r):
            return r.get("ci_rule") == rule and r.get("ci_method") == method and r.get("ci_unit_sums") is not None

        if any(r["row_key"] == row_key for r in self.new_rows):
            return any(r["row_key"] == row_key and match(r) for r in self.new_rows)
        if self._units_of is None or self._units_of[0] is not self.old_rows:  # one pass over the stored rows
            stored = self.old_rows.filter(pl.col("ci_unit_sums").is_not_null()).select("row_key", "ci_rule",
                                                                                      "ci_method")
            self._units_of = (self.old_rows, {k: (a, b) for k, a, b in stored.iter_rows()})
        return self._units_of[1].get(row_key) == (rule, method)

    def add(self, row: dict, layer_rows: list[dict]) -> None:
        key = row["row_key"]
        if key in self.done:  # replayed again (for its unit sums): this version replaces the stored one
            self._drop_old({key})
            self.new_rows = [r for r in self.new_rows if r["row_key"] != key]
            self.new_layers = [r for r in self.new_layers if r["row_key"] != key]
        self.new_rows.append(row)
        self.new_layers.extend(layer_rows)
        self.done.add(key)
        self.dirty = True

    def _drop_old(self, keys: set[str]) -> None:
        import polars as pl

        self.replaced |= keys
        self.old_rows = self.old_rows.filter(~pl.col("row_key").is_in(list(keys)))
        self.old_layers = self.old_layers.filter(~pl.col("row_key").is_in(list(keys)))

    def relevel(self, keys: set[str], level: float, resamples: int) -> None:
        """Rows of ``keys`` that have unit sums take this interval level and number of resamples."""
        import polars as pl

        has = pl.col("row_key").is_in(list(keys)) & pl.col("ci_unit_sums").is_not_null()
        stale = self.old_rows.filter(has & ((pl.col("ci_level") != level) | (pl.col("ci_resamples") != resamples)))
        if stale.height:
            self.replaced |= set(stale["row_key"].to_list())
            self.old_rows = self.old_rows.with_columns(
                pl.when(has).then(pl.lit(level, pl.Float64)).otherwise(pl.col("ci_level")).alias("ci_level"),
                pl.when(has).then(pl.lit(resamples, pl.Int64)).otherwise(pl.col("ci_resamples")).alias("ci_resamples"))
            self.dirty = True
        for r in self.new_rows:
            if r["row_key"] in keys and r.get("ci_unit_sums") is not None:
                r["ci_level"], r["ci_resamples"] = level, resamples

    def rows(self):
        """Every row (file + new), derived columns recomputed over all of them, in a stable order."""
        import polars as pl

        df = pl.concat([self.old_rows, frame(self.new_rows, ROW_SCHEMA)], how="diagonal_relaxed")
        return annotate(df, self.baseline, self.rank_by)

    def layers(self):
        import polars as pl

        df = pl.concat([self.old_layers, frame(self.new_layers, LAYER_SCHEMA)], how="diagonal_relaxed")
        return df.sort(["row_key", "layer"])

    def flush(self) -> None:
        import polars as pl

        if self.path is None or not self.dirty:
            return
        with _locked(self.path):
            # fold this process's new rows in first, so a re-read cannot lose them
            self.old_rows = pl.concat([self.old_rows, frame(self.new_rows, ROW_SCHEMA)], how="diagonal_relaxed")
            self.old_layers = pl.concat([self.old_layers, frame(self.new_layers, LAYER_SCHEMA)],
                                        how="diagonal_relaxed")
            self.new_rows, self.new_layers = [], []
            if self._signature() != self._seen:  # another sweep wrote the file since: keep its rows too
                self._load()
                self.done |= set(self.old_rows["row_key"].to_list())
            lp = layers_path(self.path)
            with atomic_files([lp, self.path], inputs=self.inputs) as (tmp_layers, tmp_rows):
                write_table_to(self.layers(), tmp_layers, ".parquet")
                write_table_to(self.rows(), tmp_rows, ".parquet")
            self._seen = self._signature()
        self.dirty = False
