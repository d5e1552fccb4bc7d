"""NumPy files read by the importers: never unpickled, and the header checked before anything is
allocated (a header may claim any shape: 140 TiB in a 200-byte file would otherwise be allocated, or
fail with a traceback)."""

from __future__ import annotations

import math
import zipfile
import zlib
from pathlib import Path

import numpy as np

from moesim.errors import MoesimError
from moesim.files import regular_file

MAX_BYTES = 1 << 32  # the limit on one array's data: 4 GiB (the importers then hold a few copies of it)


def _claimed(fp, available: int, where: str) -> None:
    """Read the .npy header at ``fp`` and refuse object arrays and shapes whose data exceeds the limit or
    the ``available`` bytes after the header."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(fp)
        read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, _, dtype = read(fp)
    except Exception as exc:  # noqa: BLE001 - numpy parses the header with tokenize and ast: any error of theirs
        raise MoesimError(f"{where}: not a readable NumPy array ({' '.join(str(exc).split())[:120]})") from None
    if dtype.hasobject:
        raise MoesimError(f"{where}: holds Python objects (pickled); expected numeric arrays")
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > MAX_BYTES:
        raise MoesimError(f"{where}: its header claims an array of shape {shape} ({nbytes / 2**30:,.1f} GiB); the "
                          f"limit is {MAX_BYTES / 2**30:g} GiB per array")
    left = available - fp.tell()
    if nbytes > left:
        raise MoesimError(f"{where}: its header claims {nbytes:,} bytes of data (shape {shape}), the file holds "
                          f"{max(left, 0):,}: truncated or damaged")


def _load(source, where: str) -> np.ndarray:
    try:
        return np.load(source, allow_pickle=False)
    except ValueError as exc:
        if "pickle" in str(exc).lower():
            raise MoesimError(f"{where}: holds Python objects (pickled); expected numeric arrays") from None
        raise MoesimError(f"{where}: not a readable NumPy file ({' '.join(str(exc).split())[:120]})") from None
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise MoesimError(f"{where}: not a readable NumPy file ({' '.join(str(exc).split())[:120]})") from None


def magic(path: Path, what: str) -> bytes:
    """The first bytes of a regular file: b'\\x93NUMPY' for .npy, b'PK' for .npz."""
    regular_file(path, what)
    try:
        with open(path, "rb") as f:
            return f.read(6)
    except OSError as exc:
        raise MoesimError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def load_npy(path: Path) -> np.ndarray:
    """One .npy array, its header checked first."""
    try:
        with open(path, "rb") as f:
            _claimed(f, path.stat().st_size, str(path))
    except OSError as exc:
        raise MoesimError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    return _load(path, str(path))


def load_npz(path: Path, names: dict[str, tuple[str, ...]], required: str, what: str) -> dict[str, np.ndarray]:
    """{key: array} for every key of ``names`` (key -> accepted member names) an .npz archive holds, the
    ``required`` one (``what``) among them; each member's header checked before it is read. Two members meaning one
    key are refused."""
    try:
        with zipfile.ZipFile(path) as zf:
            infos = {i.filename.removesuffix(".npy"): i for i in zf.infolist()}
            found: dict[str, str] = {}
            for key, accepted in names.items():
                hits = [n for n in accepted if n in infos]
                if len(hits) > 1:
                    raise MoesimError(f"{path}: arrays {', '.join(hits)} all mean {key}; keep one")
                if hits:
                    found[key] = hits[0]
            out = {}
            for key, name in found.items():
                where = f"{path} (array {name})"
                with zf.open(infos[name]) as fp:
                    _claimed(fp, infos[name].file_size, where)
                with zf.open(infos[name]) as fp:
                    out[key] = _load(fp, where)
            if required not in out:
                raise MoesimError(f"{path}: no {what} array (expected one named {' / '.join(names[required])}; "
                                  f"the archive holds {', '.join(infos) or 'nothing'})")
            return out
    except (OSError, EOFError, zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, NotImplementedError,
            RuntimeError) as exc:
        raise MoesimError(f"{path}: not a readable NumPy file ({' '.join(str(exc).split())[:120]})") from None


__all__ = ["MAX_BYTES", "magic", "load_npy", "load_npz"]
