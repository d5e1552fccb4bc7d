"""The traces of a sweep: metadata and digest at once, decoded routing only when a replay needs it."""

from __future__ import annotations

import functools
import os

from moesim.errors import MoesimError
from moesim.traces import Routing, TraceFile
from moesim.traces.decode_cache import load_decoded
from moesim.traces.stream import DecodedStore


class TraceEntry:
    """A trace of the sweep: its metadata and digest at once, the decoded routing only when a
    replay needs it (a finished sweep rerun decodes nothing). A streamed trace (``stream``; None:
    when decoding it whole would take more than MOESIM_STREAM_MB) is decoded into a temporary
    DecodedStore instead, which every replay reads a chunk at a time; ``close()`` deletes it."""

    def __init__(self, source, name: str, stream: bool | None = None):
        from moesim.simulator.driver import should_stream

        self.name = name
        self._routing: Routing | None
        self._store: DecodedStore | None = None
        self.path: str | os.PathLike | None  # the file read, if any (an output must not replace it)
        if isinstance(source, Routing):
            self._routing, self.meta, self.digest = source, source.meta, source.digest
            self.path = source.path
            self.streamed = bool(stream)
        else:
            self._routing = None
            self._file = TraceFile(source)
            self.meta, self.digest = self._file.meta, self._file.digest
            if stream is None:
                check_stream_limit()
            self.streamed = bool(stream) if stream is not None else should_stream(self._file)
            self.path = self._file.path

    @functools.cached_property
    def n_tokens(self) -> int:
        """The trace's tokens, from its (seq, pos) keys when it is not decoded yet (a finished sweep's rerun reads
        those columns only)."""
        if self._routing is not None:
            return self._routing.n_tokens
        return self._file.index_keys(self._file.read_keys()).n_tokens

    @property
    def routing(self):
        """The decoded routing, in memory (also for a streamed entry: the in-memory-only analyses)."""
        if self._routing is None:
            self._routing = load_decoded(self._file)
        return self._routing

    @property
    def source(self):
        """What replays read: the Routing, or the DecodedStore of a streamed trace (with the candidates'
        logits when the trace keeps them: the reroute rows need them)."""
        return self.source_for(logits=True)

    def source_for(self, logits: bool):
        """``source``; a streamed trace's store keeps the candidates' logits only with ``logits`` (they are
        4 bytes per candidate per step on disk: left out when no replay reroutes)."""
        if not self.streamed:
            return self.routing
        if self._store is None:
            if self._routing is not None:
                self._store = DecodedStore.from_routing(self._routing)
            else:
                self._store = DecodedStore.from_file(self._file, logits=logits and self.meta.has_scores)
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


def check_stream_limit() -> None:
    """MOESIM_STREAM_MB, if set, is a positive number: NaN would never stream (every comparison is false)
    and a negative limit always would. (simulator/driver.py reads it; the check belongs there too.)"""
    import math

    raw = os.environ.get("MOESIM_STREAM_MB", "").strip()
    try:
        ok = not raw or (math.isfinite(float(raw)) and float(raw) > 0)
    except ValueError:
        ok = False
    if not ok:
        raise MoesimError(f"MOESIM_STREAM_MB must be a positive number of megabytes, got {raw!r}")


def load_traces(traces, stream: bool | None = None) -> list[TraceEntry]:
    if isinstance(traces, (str, os.PathLike, Routing)):
        traces = [traces]
    out = []
    for t in traces:
        if isinstance(t, Routing):
            out.append(TraceEntry(t, str(t.path) if t.path is not None else "<in memory>", stream))
        else:
            out.append(TraceEntry(t, str(t), stream))
    if not out:
        raise MoesimError("give at least one trace")
    return out
