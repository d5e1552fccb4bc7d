"""NumPy .npy / .npz arrays as read-only memory maps, for imports larger than memory.

``np.load`` reads an .npz member whole; here a member stored uncompressed (``np.savez``) is mapped
in place, and a compressed one (``np.savez_compressed``) is inflated once into a scratch file beside
the output and mapped from there. Nothing is unpickled: an object array is refused.
"""

from __future__ import annotations

import contextlib
import os
import struct
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from moesim.errors import MoesimError
from moesim.files import regular_file

_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # zip local file header (30 bytes)


def _header(fh, path: Path, name: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    try:
        fmt = np.lib.format
        version = fmt.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(fh, max_header_size=1 << 20)
        elif version == (2, 0):
            shape, fortran, dtype = fmt.read_array_header_2_0(fh, max_header_size=1 << 20)
        else:
            raise ValueError(f"NumPy format version {version} (this reader knows 1.0 and 2.0)")
    except (ValueError, OSError, EOFError, SyntaxError) as exc:
        raise MoesimError(f"{path}: {name} is not a readable NumPy array ({' '.join(str(exc).split())[:100]})") \
            from None
    if dtype.hasobject:
        raise MoesimError(f"{path}: {name} holds Python objects (pickled); expected numeric arrays")
    return shape, fortran, dtype


def _mapped(path: Path, offset: int, shape, fortran: bool, dtype: np.dtype, size: int, name: str) -> np.ndarray:
    need = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if offset + need > size:
        raise MoesimError(f"{path}: {name} is truncated: its header promises {need} bytes of data, "
                          f"{max(size - offset, 0)} are there")
    if need == 0:
        return np.zeros(shape, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=tuple(shape), order="F" if fortran else "C")


@contextlib.contextmanager
def mapped_arrays(path: str | os.PathLike, scratch: str | os.PathLike | None = None) -> Iterator[dict[str, np.ndarray]]:
    """{name: read-only array} of a .npy (name '') or an .npz (member names without '.npy');
    ``scratch``: the directory for inflated members (default: the system's temporary directory)."""
    path = regular_file(path, ".npy or .npz file")
    with contextlib.ExitStack() as stack:
        try:
            arrays = _open(path, stack, scratch)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, struct.error, zlib.error) as exc:
            raise MoesimError(f"{path}: not a readable NumPy file ({' '.join(str(exc).split())[:120]})") from None
        except OSError as exc:
            raise MoesimError(f"{path}: cannot read it ({exc.strerror or exc})") from None
        yield arrays


def _open(path: Path, stack: contextlib.ExitStack, scratch) -> dict[str, np.ndarray]:
    with open(path, "rb") as fh:
        magic = fh.read(6)
        if magic == b"\x93NUMPY":
            fh.seek(0)
            shape, fortran, dtype = _header(fh, path, "the array")
            return {"": _mapped(path, fh.tell(), shape, fortran, dtype, os.path.getsize(path), "the array")}
    if magic[:2] != b"PK":
        raise MoesimError(f"{path}: not a .npy or .npz file (no NumPy or zip header)")
    out: dict[str, np.ndarray] = {}
    tmpdir: str | None = None
    size = os.path.getsize(path)
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            what = f"array {name!r}"
            if info.compress_type == zipfile.ZIP_STORED:
                with open(path, "rb") as fh:
                    fh.seek(info.header_offset)
                    head = _LOCAL_HEADER.unpack(fh.read(_LOCAL_HEADER.size))
                    if head[0] != b"PK\x03\x04":
                        raise MoesimError(f"{path}: damaged zip archive (member {name})")
                    fh.seek(info.header_offset + _LOCAL_HEADER.size + head[-2] + head[-1])
                    start = fh.tell()
                    shape, fortran, dtype = _header(fh, path, what)
                    out[name] = _mapped(path, fh.tell(), shape, fortran, dtype, min(size, start + info.file_size),
                                        what)
                continue
            if tmpdir is None:
                tmpdir = stack.enter_context(tempfile.TemporaryDirectory(prefix=".moesim-npz-", dir=scratch))
            dest = Path(tmpdir) / f"{len(out)}.npy"
            with zf.open(info) as src, open(dest, "wb") as dst:
                while chunk := src.read(16 << 20):
                    dst.write(chunk)
            with open(dest, "rb") as fh:
                shape, fortran, dtype = _header(fh, path, what)
                out[name] = _mapped(dest, fh.tell(), shape, fortran, dtype, os.path.getsize(dest), what)
    return out
