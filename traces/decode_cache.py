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

import numpy as np

from moesim.errors import MoesimError
from moesim.files import atomic
from moesim.traces.reader import TraceFile
from moesim.traces.routing import Routing, decode

MAX_BYTES = 1 << 30  # larger decoded traces are not cached (disk use)
_ARRAYS = ("seq", "pos", "phase", "domain", "sel", "w", "cand")


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


def load_decoded(source, candidates: int | None = None):
    """The decoded Routing of ``source`` (a path or TraceFile), from the cache when possible."""
    tf = source if isinstance(source, TraceFile) else TraceFile(source)
    base = cache_dir()
    if base is None or tf.meta.frequency_only:
        return decode(tf, candidates=candidates)
    path = base / f"{tf.digest}-{_decoder_hash()}-{candidates or 'all'}.npz"
    if path.exists():
        try:
            with np.load(path, allow_pickle=False) as z:
                arrs = {k: z[k] for k in _ARRAYS}
                token = z["token"] if "token" in z.files else None
                look = z["lookahead"] if "lookahead" in z.files else None
                names = [str(x) for x in z["domain_names"]]
            return Routing(meta=tf.meta, domain_names=names, token=token, lookahead=look, digest=tf.digest,
                           path=tf.path, **arrs)
        except Exception:  # damaged or foreign: decode again and overwrite
            path.unlink(missing_ok=True)
    r = decode(tf, candidates=candidates)
    arrs = {k: getattr(r, k) for k in _ARRAYS}
    if r.token is not None:
        arrs["token"] = r.token
    if r.lookahead is not None:
        arrs["lookahead"] = r.lookahead
    if sum(a.nbytes for a in arrs.values()) <= MAX_BYTES:
        try:
            with atomic(path) as tmp, open(tmp, "wb") as f:
                np.savez(f, domain_names=np.array(r.domain_names, dtype=str), **arrs)
        except (OSError, MoesimError):
            pass  # a read-only or full disk only costs the next run a decode
    return r
