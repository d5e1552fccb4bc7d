"""Files moesim reads and writes.

Inputs are regular files (a FIFO or a device would hang a reader or feed it endless bytes). Outputs
never replace an input of the command, appear whole or not at all (written under a temporary name
unique to the process in the destination's directory, fsynced, renamed into place; the temporary is
removed on any error and, when a killed process left it, by the next writer of the same
destination), and an OS error while writing (full disk, read-only filesystem, a file where a
directory is expected...) is one line, a MoesimError.
"""

from __future__ import annotations

import contextlib
import errno
import io
import itertools
import os
import re
import shutil
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from moesim.errors import MoesimError

SUFFIXES = (".csv", ".parquet", ".json")
_TEMP_ENDINGS = (".partial", ".old")
_counter = itertools.count()

PathLike = str | os.PathLike


# ---------------------------------------------------------------------------------------------- OS errors


_WHY = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
        errno.EROFS: "read-only filesystem", errno.EFBIG: "file too large for this filesystem or limit",
        errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
        errno.ENOTDIR: "a path component is a file, not a directory", errno.EISDIR: "is a directory",
        errno.ENOENT: "no such file or directory", errno.EXDEV: "crosses filesystems"}
_ERRNO = re.compile(r"(?:os error|errno) (\d+)", re.IGNORECASE)


def os_errno(exc: BaseException) -> int | None:
    """The errno of an OS-level failure, also when a library wrapped it (polars raises ComputeError
    '... (os error 28)' for a full disk while writing Parquet); None for other exceptions."""
    if isinstance(exc, OSError):
        if exc.errno is not None:
            return exc.errno
        m = _ERRNO.search(str(exc))
        return int(m.group(1)) if m else 0
    if type(exc).__module__.startswith("polars"):
        m = _ERRNO.search(str(exc))
        return int(m.group(1)) if m else None
    return None


def os_error_message(exc: BaseException) -> str:
    code = os_errno(exc)
    if code in _WHY:
        return _WHY[code]
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    if code:
        return os.strerror(code)
    return " ".join(str(exc).split())[:160]


def write_error(path: PathLike, exc: BaseException) -> MoesimError:
    return MoesimError(f"{path}: cannot write it ({os_error_message(exc)})")


def read_error(path: PathLike, exc: BaseException) -> MoesimError:
    return MoesimError(f"{path}: cannot read it ({os_error_message(exc)})")


# ---------------------------------------------------------------------------------------------- inputs

# Every file a command read (while ``tracking_inputs`` is active: the CLI runs each command inside it), so
# that every output is checked against every input, also those that reach a writer the command does not
# know of (the trace a report found through its results, a --prefetch-train or --quality file of a sweep).
_read: list[Path] | None = None


@contextlib.contextmanager
def tracking_inputs() -> Iterator[None]:
    global _read
    outer, _read = _read, []
    try:
        yield
    finally:
        _read = outer


def note_input(path: PathLike | None) -> None:
    """Count ``path`` among the command's inputs (no output may replace it or a directory hold it)."""
    if _read is not None and path is not None and Path(path) not in _read:
        _read.append(Path(path))


def inputs_read() -> list[Path]:
    return list(_read or ())


def regular_file(path: PathLike, what: str = "file", *, note: bool = True) -> Path:
    """``path`` if it is a regular file (symlinks followed); a one-line error otherwise. ``note``: an
    input of the command (``note_input``); not for a file the command reads to extend it (resume)."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise MoesimError(f"{path}: no such file") from None
    except OSError as exc:
        raise read_error(path, exc) from None
    if stat.S_ISDIR(st.st_mode):
        raise MoesimError(f"{path}: is a directory, not a {what}")
    if not stat.S_ISREG(st.st_mode):
        raise MoesimError(f"{path}: not a regular file (a FIFO, device or socket); moesim reads {what}s from "
                          "regular files only")
    if note:
        note_input(path)
    return path


def read_bytes(path: PathLike, what: str = "file") -> bytes:
    path = regular_file(path, what)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise read_error(path, exc) from None


def _not_utf8(path: PathLike, what: str, byte: int) -> MoesimError:
    return MoesimError(f"{path}: not UTF-8 text (byte {byte}); a {what} must be UTF-8")


def read_text(path: PathLike, what: str = "file") -> str:
    data = read_bytes(path, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _not_utf8(path, what, exc.start) from None


def check_utf8(path: PathLike, what: str = "file") -> Path:
    """``path``, a regular file of UTF-8 text, read a MiB at a time (for files parsed by a library that would
    take other bytes for binary cells: a Latin-1 CSV)."""
    import codecs

    path = regular_file(path, what)
    decoder = codecs.getincrementaldecoder("utf-8")()
    done = 0
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                decoder.decode(chunk)
                done += len(chunk)
            decoder.decode(b"", final=True)
    except UnicodeDecodeError as exc:
        raise _not_utf8(path, what, max(0, done - len(decoder.getstate()[0]) + exc.start)) from None
    except OSError as exc:
        raise read_error(path, exc) from None
    return path


def read_toml(path: PathLike, what: str = "TOML file") -> dict:
    import tomllib

    text = read_text(path, what)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise MoesimError(f"{path}: not valid TOML ({exc})") from None
    except RecursionError:
        raise MoesimError(f"{path}: TOML nested too deeply") from None


# ---------------------------------------------------------------------------------------------- outputs


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist (yet): compare where they would be
        return os.path.realpath(a) == os.path.realpath(b)


def _inside(path: Path, directory: Path) -> bool:
    d, p = os.path.realpath(directory), os.path.realpath(path)
    return p.startswith(d.rstrip(os.sep) + os.sep)


def check_output(path: PathLike, inputs: Iterable[PathLike | None] = (), *, directory: bool = False) -> Path:
    """Refuse a destination that is an input of the command (the same file, through any link), that
    would delete an input (a report directory holding one), or that exists and is not a regular file
    (a directory, a device such as /dev/null, a FIFO). ``inputs`` adds to the files the command has read
    (``note_input``). Nothing is written here."""
    path = Path(path)
    for i in [*inputs, *inputs_read()]:
        if i is None:
            continue
        i = Path(i)
        clash = _same_file(path, i)
        if not clash and directory:
            clash = _inside(i, path)
        elif not clash and os.path.isdir(i) and _inside(path, i) and path.exists() and path.suffix != ".parquet":
            clash = True  # a file inside an input folder (a CSV of an import, a tracer's weights)
        if clash:
            same = "" if str(i) == str(path) else f" ({i})"
            raise MoesimError(f"{path}: is an input of this command{same}; refusing to overwrite it (choose "
                              "another output name)")
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return path
    except OSError as exc:
        raise write_error(path, exc) from None
    if directory:
        if not stat.S_ISDIR(st.st_mode):
            raise MoesimError(f"{path}: exists and is not a directory")
    elif not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise MoesimError(f"{path}: exists and is {kind}; refusing to replace it")
    return path


def temp_path(path: PathLike) -> Path:
    """``.NAME.PID-N.partial`` beside ``path``: unique per process and call, so two writers of one
    destination never share a temporary, and a stale one names the process that left it."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}-{next(_counter)}.partial")


def _owner_pid(name: str, prefix: str) -> int | None:
    rest = name[len(prefix):]
    head = re.match(r"(\d+)[-.]", rest)
    return int(head.group(1)) if head else None


def remove_stale_partials(path: PathLike) -> None:
    """Remove temporaries of ``path`` (``.NAME.PID...partial`` files or directories, ``.NAME.PID.old``
    report directories) whose process is gone: a writer killed with -9 leaves them."""
    path = Path(path)
    prefix = f".{path.name}."
    try:
        entries = [e for e in os.scandir(path.parent) if e.name.startswith(prefix) and e.name.endswith(_TEMP_ENDINGS)]
    except OSError:
        return
    for e in entries:
        pid = _owner_pid(e.name, prefix)
        if pid is None or pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
            continue  # its process still runs: still being written
        except ProcessLookupError:
            pass
        except OSError:
            continue  # another user's process: alive
        with contextlib.suppress(OSError):
            if e.is_dir(follow_symlinks=False):
                shutil.rmtree(e.path, ignore_errors=True)
            else:
                os.unlink(e.path)


def _fsync(path: Path, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        if not directory or exc.errno not in (errno.EINVAL, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _discard(tmp: Path) -> None:
    with contextlib.suppress(OSError):
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)


class Output:
    """One destination file: checked at once (not an input, not a special file, its folder
    creatable), then written under ``tmp`` and published by ``commit()`` or dropped by ``discard()``."""

    def __init__(self, path: PathLike, inputs: Iterable[PathLike | None] = ()):
        self.path = check_output(path, inputs)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise write_error(self.path, exc) from None
        remove_stale_partials(self.path)
        self.tmp = temp_path(self.path)

    def commit(self) -> Path:
        try:
            _fsync(self.tmp)
            os.replace(self.tmp, self.path)
            with contextlib.suppress(OSError):
                _fsync(self.path.parent, directory=True)
        except OSError as exc:
            self.discard()
            raise write_error(self.path, exc) from None
        return self.path

    def discard(self) -> None:
        _discard(self.tmp)


def _failed(path: Path, exc: BaseException):
    """The exception to raise for a failed write: OS-level failures become one line."""
    return write_error(path, exc) if os_errno(exc) is not None else exc


@contextlib.contextmanager
def atomic(path: PathLike, *, inputs: Iterable[PathLike | None] = ()) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success fsync it and rename it into place, on any
    error remove it (an OS error comes out as one-line MoesimError)."""
    with atomic_files([path], inputs=inputs) as (tmp,):
        yield tmp


@contextlib.contextmanager
def atomic_files(paths: Iterable[PathLike], *, inputs: Iterable[PathLike | None] = ()) -> Iterator[list[Path]]:
    """Several files that belong together (results.parquet and results.layers.parquet): every one is
    written to its temporary before any is renamed, so a full disk publishes none of them."""
    inputs = list(inputs)
    outs = [Output(p, inputs) for p in paths]
    try:
        yield [o.tmp for o in outs]
    except BaseException as exc:
        for o in outs:
            o.discard()
        err = _failed(outs[-1].path, exc)
        if err is exc:
            raise
        raise err from None
    for i, o in enumerate(outs):
        try:
            o.commit()
        except BaseException:
            for rest in outs[i + 1:]:
                rest.discard()
            raise


def write_table(frame, path: PathLike, *, inputs: Iterable[PathLike | None] = ()) -> Path:
    """Write a polars DataFrame as CSV, Parquet or JSON, chosen by the suffix."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise MoesimError(f"{path}: unknown table format (use one of {', '.join(SUFFIXES)})")
    with atomic(path, inputs=inputs) as tmp:
        write_table_to(frame, tmp, path.suffix)
    return path


def write_table_to(frame, tmp: Path, suffix: str) -> None:
    """The bytes of ``write_table`` at a temporary path (for ``atomic_files``). Encoded in memory first:
    polars reports some failed writes (a full disk while it writes the Parquet footer) as 'invalid
    thrift' without the OS error; Python's own write raises the OSError that says what happened."""
    buf = io.BytesIO()
    writer = {".csv": frame.write_csv, ".parquet": frame.write_parquet, ".json": frame.write_json}[suffix]
    writer(buf)
    with open(tmp, "wb") as f:
        f.write(buf.getbuffer())


def write_text(text: str, path: PathLike, *, inputs: Iterable[PathLike | None] = ()) -> Path:
    with atomic(path, inputs=inputs) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_bytes(data: bytes, path: PathLike, *, inputs: Iterable[PathLike | None] = ()) -> Path:
    with atomic(path, inputs=inputs) as tmp:
        tmp.write_bytes(data)
    return Path(path)


# ---------------------------------------------------------------------------------------------- directories


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        at_fdcwd, rename_exchange = -100, 2
        return libc.renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0
    except (OSError, AttributeError):
        return False


def _publish_dir(tmp: Path, out: Path) -> None:
    """Move a finished directory into place. Replacing an old one is one atomic exchange on Linux;
    elsewhere two renames, with a moment in which ``out`` does not exist."""
    if not out.exists():
        try:
            os.rename(tmp, out)
            return
        except OSError as exc:  # another writer published first: replace its directory as below
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
    if _exchange(tmp, out):
        shutil.rmtree(tmp, ignore_errors=True)  # now the old directory
        return
    old = out.with_name(f".{out.name}.{os.getpid()}.old")
    shutil.rmtree(old, ignore_errors=True)
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except OSError:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def atomic_dir(path: PathLike, *, inputs: Iterable[PathLike | None] = ()) -> Iterator[Path]:
    """Yield an empty temporary directory beside ``path``; on success it replaces ``path`` (a reader
    sees the old directory or the new one), on any error it is removed."""
    path = check_output(path, inputs, directory=True)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_partials(path)
        tmp = temp_path(path)
        tmp.mkdir()
    except OSError as exc:
        raise write_error(path, exc) from None
    try:
        yield tmp
        _publish_dir(tmp, path)
    except MoesimError as exc:  # a file inside failed: name it where the user will look for it
        raise MoesimError(str(exc).replace(str(tmp), str(path))) from None
    except BaseException as exc:
        err = _failed(path, exc)
        if err is exc:
            raise
        raise err from None
    finally:
        _discard(tmp)


__all__ = ["atomic", "atomic_files", "atomic_dir", "check_output", "tracking_inputs", "note_input", "inputs_read",
           "regular_file", "read_bytes", "read_text", "check_utf8",
           "read_toml", "remove_stale_partials", "temp_path", "write_table", "write_text", "write_bytes",
           "write_error", "os_errno", "Output"]
