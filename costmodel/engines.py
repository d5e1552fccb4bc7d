"""Engine profiles: what a real inference engine does per decode step, as data (presets/engines/*.toml).

A profile fixes the step semantics and traffic the pure bandwidth model leaves out: where a non-resident expert
runs (``miss``), whether VRAM holds whole layers or single experts (``placement``), fixed costs per layer on the
GPU and CPU, the hand-off of a CPU-resident MoE layer, where its weights lie on a multi-socket host and how much
of a second socket's memory it uses,
how it reads NVMe (request size and queue depth: mmap faults vs whole-expert reads) and whether it writes
evicted experts back, and how the replay's clock overlaps copies with compute (``overlap``, docs/replay-semantics.md).
Issue 29 adds what a dynamic expert cache pays per miss and per token: a fixed host cost per fetched or uploaded
expert, one copy per expert or per projection matrix (each paying the link's per-transfer latency), the read-back of
the router's output by the host in every MoE layer that may fetch or compute on the host, a fixed cost per decode
step, the hybrid miss (computed on the CPU for this use and uploaded into the cache in the background, at most
``uploads_per_layer`` per layer per step), CPU experts run in parallel with the GPU's (``cpu_overlap``) and where the
KV cache lives (``kv``). ``ideal`` is the pure bandwidth model.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path

from moesim.errors import MoesimError
from moesim.files import read_toml

DEFAULT_ENGINE = "ideal"
MISSES = ("any", "cpu", "fetch", "hybrid")
PLACEMENTS = ("experts", "layers")
COPIES = ("hw", "pinned", "pageable")
OVERLAPS = ("none", "layer", "cross-layer")
NUMA_PAGES = ("local", "spread")
EXPERT_COPIES = ("expert", "matrix")
KV_PLACEMENTS = ("layers", "vram")


@dataclass(frozen=True)
class EngineProfile:
    """One engine's step semantics and traffic. Times in microseconds as in the files."""

    name: str
    description: str = ""
    source: str = ""
    miss: str = "any"              # any | cpu | fetch | hybrid: what happens to an expert not in VRAM
    placement: str = "experts"     # experts | layers: what VRAM holds
    gpu_layer_us: float = 0.0      # fixed GPU cost per layer and step (kernel launches, small kernels)
    cpu_layer_us: float = 0.0      # fixed CPU cost per layer computed by the CPU (thread synchronisation)
    cpu_handoff: bool = False      # a CPU-resident MoE layer costs a GPU<->CPU hand-off per step
    cpu_stream_fraction: float = 1.0  # fraction of the machine's CPU expert rate the engine's kernels reach
    numa_gain: float = 1.0         # fraction of each further socket's bandwidth the engine gains (numa_pages local)
    numa_pages: str = "local"      # local | spread: weights on each thread's own node, or pages on any node alike
    nvme_read_kib: int = 0         # request size of NVMe reads (0: one request per expert)
    nvme_queue_depth: int = 0      # requests in flight for those reads (0: not limited)
    writeback: bool = False        # each eviction copies the evicted expert back to host memory
    copy: str = "hw"               # hw | pinned | pageable: host-to-GPU copies (hw: the machine file's use_pinned)
    overlap: str = "none"          # none | layer | cross-layer: copy/compute overlap of the replay's clock
    fetch_expert_us: float = 0.0   # fixed host cost per fetched or uploaded expert (launch, slot resolve, bookkeeping)
    expert_copies: str = "expert"  # expert | matrix: one host-to-GPU copy per expert, or one per projection matrix
    router_sync_us: float = 0.0    # per MoE layer step not wholly resident: the host reads the router's output back
    token_us: float = 0.0          # fixed per decode step (no CUDA graphs on the offload path, dispatch)
    uploads_per_layer: int = 0     # hybrid misses: at most this many background uploads per layer per step (0: any)
    cpu_overlap: bool = False      # the CPU computes its experts while the GPU runs the layer's others
    kv: str = "layers"             # layers | vram: KV cache with its layer's weights, or on the GPU in full
    sources: dict = field(default_factory=dict, compare=False)
    path: str = ""

    def summary(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


_KEYS = {f.name for f in fields(EngineProfile)} - {"path"}


def profile_keys() -> set[str]:
    """The keys a profile file may set (a machine file's [engine] table may override the numbers among them)."""
    return set(_KEYS) - {"sources"}


def _preset_dir() -> Path:
    return Path(str(resources.files("moesim.costmodel") / "presets" / "engines"))


def engine_names() -> list[str]:
    return sorted(p.name[:-5] for p in _preset_dir().glob("*.toml"))


def load_engine(name_or_path: str | EngineProfile | None) -> EngineProfile:
    """An engine profile by name (ideal, llama.cpp, mixtral-offloading, ktransformers) or a TOML file path."""
    if isinstance(name_or_path, EngineProfile):
        return name_or_path
    name = name_or_path or DEFAULT_ENGINE
    path = Path(name)
    if not (name.endswith(".toml") and path.exists()):  # a FIFO or a directory is named by read_toml
        if name.endswith(".toml") and "/" in name:
            raise MoesimError(f"engine profile file not found: {name}")
        path = _preset_dir() / f"{name}.toml"
        if not path.is_file():
            raise MoesimError(f"unknown engine {name!r} (known: {', '.join(engine_names())})")
    return _parse(read_toml(path, "engine profile"), path)


def _parse(doc: dict, path: Path) -> EngineProfile:
    def bad(msg):
        raise MoesimError(f"engine profile {path}: {msg}")

    unknown = sorted(set(doc) - _KEYS)
    if unknown:
        bad(f"unknown key {unknown[0]!r} (known: {', '.join(sorted(_KEYS))})")
    if not isinstance(doc.get("name"), str) or not doc["name"]:
        bad("name must be a non-empty string")
    for key, allowed in (("miss", MISSES), ("placement", PLACEMENTS), ("copy", COPIES), ("overlap", OVERLAPS),
                         ("numa_pages", NUMA_PAGES), ("expert_copies", EXPERT_COPIES), ("kv", KV_PLACEMENTS)):
        if key in doc and doc[key] not in allowed:
            bad(f"{key} must be one of {', '.join(allowed)} (got {doc[key]!r:.80})")
    for key in ("gpu_layer_us", "cpu_layer_us", "cpu_stream_fraction", "numa_gain", "nvme_read_kib",
                "nvme_queue_depth", "fetch_expert_us", "router_sync_us", "token_us", "uploads_per_layer"):
        v = doc.get(key, 0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1e9:  # refuses nan and inf
            bad(f"{key} must be a number in 0..1e9 (got {v!r:.80})")
    for key in ("nvme_read_kib", "nvme_queue_depth", "uploads_per_layer"):
        if key in doc and not float(doc[key]).is_integer():
            bad(f"{key} must be a whole number (got {doc[key]!r})")
    for key in ("description", "source"):
        if key in doc and not isinstance(doc[key], str):
            bad(f"{key} must be a string")
    for key in ("cpu_stream_fraction", "numa_gain"):
        if key in doc and not 0 < doc[key] <= 1 and not (key == "numa_gain" and doc[key] == 0):
            bad(f"{key} must be in (0, 1] (got {doc[key]})")
    if doc.get("numa_pages") == "spread" and "numa_gain" in doc:
        bad("numa_gain applies to numa_pages = 'local' (with 'spread' the socket link sets what a socket adds)")
    if "uploads_per_layer" in doc and doc.get("miss") != "hybrid":
        bad("uploads_per_layer caps the background uploads of hybrid misses: it needs miss = 'hybrid'")
    for key in ("cpu_handoff", "writeback", "cpu_overlap"):
        if key in doc and not isinstance(doc[key], bool):
            bad(f"{key} must be true or false")
    src = doc.get("sources", {})
    if not isinstance(src, dict) or any(k not in _KEYS for k in src):
        bad("[sources] must be a table naming the profile's keys")
    return EngineProfile(**{k: v for k, v in doc.items()}, path=str(path))


def with_overrides(e: EngineProfile, overrides: dict, where: str) -> EngineProfile:
    """``e`` with some of its numbers replaced (a fitted machine file's [engine] table), validated as a profile."""
    doc = {f.name: getattr(e, f.name) for f in fields(e) if f.name not in ("path", "sources")}
    doc["sources"] = dict(e.sources) | dict(overrides.get("sources", {}))
    doc.update({k: v for k, v in overrides.items() if k != "sources"})
    if doc.get("uploads_per_layer") == 0 and doc.get("miss") != "hybrid":
        doc.pop("uploads_per_layer")
    if doc.get("numa_pages") == "spread":
        doc.pop("numa_gain", None)
    return _parse(doc, Path(where))


def n_copies(e: EngineProfile, glu: bool) -> int:
    """Host-to-GPU copies one expert takes: one, or one per projection matrix (3 with a GLU, else 2)."""
    return (3 if glu else 2) if e.expert_copies == "matrix" else 1
