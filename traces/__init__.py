"""Trace format v1: metadata, writer, streaming reader, decoded routing arrays."""

from moesim.traces.meta import GATINGS, LAYOUTS, PHASES, SCHEMA_VERSION, TraceMeta
from moesim.traces.reader import TraceFile, open_trace
from moesim.traces.routing import Routing, load_routing
from moesim.traces.writer import TraceWriter

__all__ = ["GATINGS", "LAYOUTS", "PHASES", "SCHEMA_VERSION", "TraceMeta", "TraceFile", "open_trace", "Routing",
           "load_routing", "TraceWriter"]
