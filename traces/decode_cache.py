"""A disk cache of decoded traces, so a rerun sweep does not decode the same file again.

Decoding (ranking candidates, gate weights) costs about a second per 1M routing steps; loading the
arrays back costs milliseconds. Entries are keyed by the trace file's content digest and a hash of
the decoder's source files (traces/*.py), written atomically, and re-decoded if unreadable. Set
MOESIM_DECODE_CACHE=0 to turn the cache off; it lives in ~/.cache/moesim/decoded (or under
$XDG_CACHE_HOME) and can be deleted at any time.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from moesim.errors import MoesimError
from moesim.files import atomic
from moesim.traces.reader import TraceFile
from moesim.traces.routing import STEP_ARRAYS, TOKEN_ARRAYS, Routing, decode

MAX_BYTES = 1 << 30  # larger decoded traces are not cached (disk use)
_OPTIONAL = ("token", "lookahead", "logits")  # None when the trace has no such data


def _decoder_hash() -> str:
    here = Path(__file__).resolve().parent.parent / "traces"
    h = hashlib.blake2b(digest_size=6)
    for f in sorted(here.glob("*.py")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    h.update(np.__version__.encode())
    return h.hexdigest()


def cache_dir() -> Path | None:
    if os.environ.get("MOESIM_DECODE_CACHE", "1").strip().lower() in ("0", "no", "off", "false"):
        return None
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "moesim" / "decoded"


def load_decoded(source, candidates: int | None = None, logits: bool = True):
    """The decoded Routing of ``source`` (a path or TraceFile), from the cache when possible (arguments:
    load_routing's)."""
    tf = source if isinstance(source, TraceFile) else TraceFile(source)
    base = cache_dir()
    if base is None or tf.meta.frequency_only:
        return decode(tf, candidates=candidates, logits=logits)
    path = base / f"{tf.digest}-{_decoder_hash()}-{candidates or 'all'}{'' if logits else '-nologits'}.npz"
    if path.exists():
        try:
            with np.load(path, allow_pickle=False) as z:
                arrs: dict[str, Any] = {k: z[k] if k in z.files or k not in _OPTIONAL else None
                                        for k in TOKEN_ARRAYS + STEP_ARRAYS}
                names = [str(x) for x in z["domain_names"]]
            return Routing(meta=tf.meta, domain_names=names, digest=tf.digest, path=tf.path, **arrs)
        except Exception:  # damaged or foreign: decode again and overwrite
            path.unlink(missing_ok=True)
    r = decode(tf, candidates=candidates, logits=logits)
    arrs = {k: getattr(r, k) for k in TOKEN_ARRAYS + STEP_ARRAYS if getattr(r, k) is not None}
    if sum(a.nbytes for a in arrs.values()) <= MAX_BYTES:
        try:
            with atomic(path) as tmp, open(tmp, "wb") as f:
                np.savez(f, domain_names=np.array(r.domain_names, dtype=str), **arrs)
        except (OSError, MoesimError):
            pass  # a read-only or full disk only costs the next run a decode
    return r
