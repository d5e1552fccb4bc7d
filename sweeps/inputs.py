"""The traces of a sweep: metadata and digest at once, decoded routing only when a replay needs it."""

from __future__ import annotations

import os

from moesim.errors import MoesimError
from moesim.traces import Routing, TraceFile
from moesim.traces.decode_cache import load_decoded


class TraceEntry:
    """A trace of the sweep: its metadata and digest at once, the decoded routing only when a
    replay needs it (a finished sweep rerun decodes nothing)."""

    def __init__(self, source, name: str):
        self.name = name
        self._routing: Routing | None
        self.path: str | os.PathLike | None  # the file read, if any (an output must not replace it)
        if isinstance(source, Routing):
            self._routing, self.meta, self.digest = source, source.meta, source.digest
            self.path = source.path
        else:
            self._routing = None
            self._file = TraceFile(source)
            self.meta, self.digest = self._file.meta, self._file.digest
            self.path = self._file.path

    @property
    def routing(self):
        if self._routing is None:
            self._routing = load_decoded(self._file)
        return self._routing


def load_traces(traces) -> list[TraceEntry]:
    if isinstance(traces, (str, os.PathLike, Routing)):
        traces = [traces]
    out = []
    for t in traces:
        if isinstance(t, Routing):
            out.append(TraceEntry(t, str(t.path) if t.path is not None else "<in memory>"))
        else:
            out.append(TraceEntry(t, str(t)))
    if not out:
        raise MoesimError("give at least one trace")
    return out
