"""Hardware presets: memory tiers, the host-to-GPU link, NVMe and CPU expert throughput, read from the TOML files in
presets/hardware/ (or a user's TOML file) and validated.

Units in the files: capacities in GiB (2**30 B), bandwidths in GB/s (1e9 B/s, as spec sheets state them),
latencies in microseconds, compute in TFLOP/s. Units in the objects: bytes, bytes/s, seconds, FLOP/s.
Every tier's effective bandwidth is ``spec_gb_s * efficiency`` or a measured ``effective_gb_s``; the ``sources``
sub-table of each tier says where each number comes from (spec sheet, measured, derived, assumed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from moesim.errors import MoesimError
from moesim.files import read_toml

GIB = 2 ** 30
GB = 1e9

# Remote over local read bandwidth of a two-socket server (DEFAULTS cpu.remote_gb_s gives the measurement).
REMOTE_FRACTION = 0.33
MAX_VALUE = 1e9  # bound on every number of a machine file (an exabyte of GiB, 1e9 GB/s, 17 minutes in us)
# PCIe transfer rate per lane (GT/s) and line-code efficiency, by generation (PCI-SIG base specifications).
PCIE_GT_S = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
PCIE_ENCODING = {1: 8 / 10, 2: 8 / 10, 3: 128 / 130, 4: 128 / 130, 5: 128 / 130, 6: 242 / 256}
PCIE_LANES = (1, 2, 4, 8, 16)
# The machine class of the substitution study; commands that need a machine and get none use it.
DEFAULT_HARDWARE = "rtx3090-pcie4"

_TABLES = {
    "gpu": {"name", "fp16_tflops", "compute_efficiency"},
    "vram": {"capacity_gib", "reserved_gib", "spec_gb_s", "efficiency", "effective_gb_s", "latency_us"},
    "ram": {"capacity_gib", "reserved_gib", "spec_gb_s", "efficiency", "effective_gb_s", "latency_us"},
    "link": {"kind", "pcie_gen", "lanes", "pinned_efficiency", "pageable_efficiency", "latency_us", "use_pinned"},
    "nvme": {"capacity_gib", "spec_gb_s", "efficiency", "effective_gb_s", "latency_us"},
    "cpu": {"name", "sockets", "cores", "core_gb_s", "matrix_us", "expert_gb_s", "latency_us", "process_sockets",
            "remote_gb_s"},
}
_TOP = {"name", "description", "source", "engine"} | set(_TABLES)
_GPU_TABLES = ("gpu", "vram", "link")
# Data-sheet numbers a file must give; everything else defaults from DEFAULTS (reported by `moesim hw show`).
_REQUIRED = {
    "gpu": ("fp16_tflops",),
    "vram": ("capacity_gib",),
    "ram": ("capacity_gib",),
    "link": ("kind",),
    "nvme": (),
    "cpu": (),
}

# Every default a hardware file may leave out: value and physical basis. (value may be a function of the file.)
DEFAULTS: dict[tuple[str, str], tuple[object, str]] = {
    ("gpu", "compute_efficiency"): (0.5, "assumed: quantized prefill GEMMs reach about half of the dense tensor peak"),
    ("vram", "reserved_gib"): (lambda d: 1.0 if d["vram"]["capacity_gib"] <= 12
                               else 1.5 if d["vram"]["capacity_gib"] <= 32 else 2.0,
                              "assumed: CUDA context (~0.3-0.5 GiB), compute buffers and a short KV cache: "
                              "1.0 GiB up to 12 GiB cards, 1.5 up to 32, 2.0 above"),
    ("vram", "efficiency"): (0.75, "assumed: memory-bound GEMV kernels reach 70-85% of spec bandwidth; with the "
                                   "llama.cpp profile's 55 us per layer it reproduces llama.cpp PR #6766 (RTX 4090)"),
    ("vram", "latency_us"): (0.0, "assumed: a layer's experts run as one grouped kernel, no per-expert launch"),
    ("ram", "reserved_gib"): (lambda d: max(4.0, 0.03 * d["ram"]["capacity_gib"]),
                              "assumed: OS, desktop session and engine buffers, max(4 GiB, 3% of capacity)"),
    ("ram", "efficiency"): (0.70, "measured: memtest86+ issue #557, Ryzen 9700X with dual-channel DDR5-5600 reads "
                                  "62.9 GB/s = 0.70 of spec 89.6 GB/s"),
    ("ram", "latency_us"): (0.0, "assumed: DRAM latency is negligible per MB-sized expert"),
    ("link", "pinned_efficiency"): (0.80, "assumed: CUDA bandwidthTest host-to-device with pinned memory reaches "
                                          "~80% of the raw PCIe rate (12-13 GB/s on 3.0 x16, 24-26 on 4.0 x16)"),
    ("link", "pageable_efficiency"): (0.45, "assumed: pageable copies go through a driver bounce buffer, about half "
                                            "the pinned rate"),
    ("link", "latency_us"): (10.0, "assumed: cudaMemcpyAsync launch and DMA setup, ~5-15 us per copy"),
    ("link", "use_pinned"): (True, "engines that offload experts keep them in pinned memory"),
    ("nvme", "efficiency"): (0.69, "derived: the second study measured 2.4 GB/s sequential on a 3.5 GB/s "
                                   "PCIe 3.0 drive"),
    ("nvme", "latency_us"): (80.0, "assumed: QD1 random-read latency of consumer NVMe, ~50-100 us"),
    ("cpu", "sockets"): (1, "assumed: one socket"),
    ("cpu", "cores"): (0, "unknown core count: no per-core limit on the CPU expert rate"),
    ("cpu", "process_sockets"): (lambda d: d["cpu"].get("sockets", 1),
                                 "the OS runs one process's threads on every socket (Linux schedules them on all "
                                 "NUMA nodes; Windows 11 / Server 2022 span all processor groups by default)"),
    ("cpu", "remote_gb_s"): (REMOTE_FRACTION,
                             "measured: Intel MLC v3.10 bandwidth matrix on KU Leuven's Genius nodes, 2 x "
                             "Xeon Gold 6140 (Skylake-SP, 3 UPI links, 6 x DDR4-2666 per socket): 34.3 GB/s "
                             "read from the other socket vs 104.4-106.0 GB/s local = 0.33 of the local rate "
                             "(github.com/hpcleuven/VscDocumentation, source/leuven/old_hardware/genius/"
                             "skylake_mlc.txt); default 0.33 x one socket's effective [ram] rate"),
    ("cpu", "core_gb_s"): (10.0, "derived: Little's law, ~14 outstanding 64 B cache-line misses per core / ~90 ns "
                                 "DRAM latency = 10 GB/s of weights one core can stream"),
    ("cpu", "matrix_us"): (1.0, "assumed: each expert matrix starts new memory streams; ~10 DRAM latencies (~0.1 us) "
                                "before the hardware prefetchers run at full rate"),
    ("cpu", "latency_us"): (0.0, "assumed: per-expert dispatch folded into matrix_us"),
}


@dataclass(frozen=True)
class Tier:
    """One memory or storage tier: usable capacity and effective bandwidth."""
    capacity: float  # bytes
    reserved: float  # bytes not available for weights (driver, OS, buffers, KV cache)
    bandwidth: float  # effective bytes/s
    spec_bandwidth: float  # bytes/s on the spec sheet (0 if not published)
    latency: float  # seconds per access/transfer

    @property
    def usable(self) -> float:
        return max(0.0, self.capacity - self.reserved)


@dataclass(frozen=True)
class Link:
    """The host-to-GPU copy path. ``kind = "unified"``: GPU and CPU share one memory, nothing is copied."""
    kind: str
    pcie_gen: int
    lanes: int
    raw_bandwidth: float  # bytes/s per direction after line coding
    pinned_bandwidth: float
    pageable_bandwidth: float
    latency: float
    use_pinned: bool

    @property
    def bandwidth(self) -> float:
        if self.kind == "unified":
            return math.inf
        return self.pinned_bandwidth if self.use_pinned else self.pageable_bandwidth


@dataclass(frozen=True)
class HardwarePreset:
    name: str
    description: str
    source: str
    gpu_name: str
    gpu_flops: float  # effective FLOP/s for prefill (spec x compute_efficiency)
    vram: Tier
    ram: Tier
    link: Link
    nvme: Tier
    cpu_name: str
    cpu_expert_bandwidth: float  # bytes/s of expert weights the CPU streams and computes on (all sockets)
    cpu_latency: float
    path: str = ""
    doc: dict = field(default_factory=dict, compare=False, repr=False)
    sockets: int = 1
    process_sockets: int = 1  # sockets one process's threads run on
    remote_bandwidth: float = 0.0  # bytes/s one socket's threads read from another socket's memory
    cores: int = 0
    core_bandwidth: float = 10e9  # bytes/s one core streams
    matrix_latency: float = 1e-6  # seconds per expert matrix on the CPU (stream start)
    cpu_expert_given: bool = False  # [cpu] expert_gb_s given (measured or calibrated), not derived
    defaults: dict = field(default_factory=dict, compare=False, repr=False)  # "table.key" -> (value, basis)
    # [engine]: the engine profile a machine file was calibrated with (``profile``) and its fitted numbers
    # (moesim calibrate); prices the machine when no engine is named (costmodel/timing.py engine_for)
    engine: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def unified(self) -> bool:
        return self.link.kind == "unified"

    @property
    def has_gpu(self) -> bool:
        return self.link.kind != "none"

    def cpu_rate(self, numa_gain: float = 1.0, fraction: float = 1.0, numa_pages: str = "local") -> float:
        """Bytes/s of expert weights the CPU computes on, times the engine's kernel ``fraction``. ``numa_pages``
        says where the engine's weights lie: ``local`` (each socket's threads read their own node: the effective
        DRAM rate of one socket plus ``numa_gain`` of each further socket the process runs on) or ``spread`` (pages
        on any node alike: a socket's threads read 1/S of the bytes locally and the rest over the socket link at
        ``remote_bandwidth``; every socket the process runs on does so in parallel). Capped by the process's cores
        x per-core rate. A given [cpu] expert_gb_s (measured or calibrated) is used as it is."""
        if self.cpu_expert_given:
            return self.cpu_expert_bandwidth * fraction
        s, p = self.sockets, self.process_sockets
        per_socket = self.ram.bandwidth / s
        if numa_pages == "spread" and s > 1 and self.remote_bandwidth > 0:
            bw = p / (1 / (s * per_socket) + (s - 1) / (s * self.remote_bandwidth))
        else:
            bw = per_socket * (1 + (p - 1) * numa_gain)
        if self.cores:
            bw = min(bw, self.cores * p / s * self.core_bandwidth)
        return bw * fraction

    def summary(self) -> dict:
        """Plain data: the effective numbers plus the file's own values and sources."""
        return {
            "name": self.name, "description": self.description, "source": self.source, "path": self.path,
            "unified_memory": self.unified,
            "effective": {
                "vram_gib": self.vram.capacity / GIB, "vram_usable_gib": self.vram.usable / GIB,
                "vram_gb_s": self.vram.bandwidth / GB, "ram_gib": self.ram.capacity / GIB,
                "ram_usable_gib": self.ram.usable / GIB, "ram_gb_s": self.ram.bandwidth / GB,
                "link": self.link_label(), "link_raw_gb_s": _finite(self.link.raw_bandwidth / GB),
                "link_pinned_gb_s": _finite(self.link.pinned_bandwidth / GB),
                "link_pageable_gb_s": _finite(self.link.pageable_bandwidth / GB),
                "link_gb_s": _finite(self.link.bandwidth / GB), "link_latency_us": self.link.latency * 1e6,
                "nvme_gb_s": self.nvme.bandwidth / GB, "nvme_latency_us": self.nvme.latency * 1e6,
                "cpu_expert_gb_s": self.cpu_expert_bandwidth / GB, "gpu_tflops_effective": self.gpu_flops / 1e12,
                "cpu_sockets": self.sockets, "cpu_process_sockets": self.process_sockets,
                "cpu_remote_gb_s": self.remote_bandwidth / GB,
                "cpu_spread_gb_s": self.cpu_rate(numa_pages="spread") / GB, "cpu_cores": self.cores,
                "cpu_matrix_us": self.matrix_latency * 1e6,
            },
            "file": self.doc,
            "defaults": {k: {"value": v, "basis": b} for k, (v, b) in self.defaults.items()},
        }

    def link_label(self) -> str:
        if not self.has_gpu:
            return "none (CPU-only machine)"
        if self.unified:
            return "unified memory (no copy)"
        return f"PCIe {self.link.pcie_gen}.0 x{self.link.lanes} ({'pinned' if self.link.use_pinned else 'pageable'})"


def _finite(x: float):
    return x if math.isfinite(x) else None


def _preset_dir() -> Path:
    return Path(str(resources.files("moesim.costmodel") / "presets" / "hardware"))


def hardware_names() -> list[str]:
    return sorted(p.stem for p in _preset_dir().glob("*.toml"))


def hardware_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix == ".toml" or "/" in str(name_or_path):
        if not path.exists():  # a FIFO or a directory is named by read_toml
            raise MoesimError(f"hardware preset file not found: {name_or_path}")
        return path
    path = _preset_dir() / f"{name_or_path}.toml"
    if not path.exists():
        raise MoesimError(f"unknown hardware preset {name_or_path!r} (known: {', '.join(hardware_names())})")
    return path


def load_hardware(name_or_path: str | HardwarePreset) -> HardwarePreset:
    """A hardware preset by name (``moesim hw list``) or from a TOML file path; errors are one clear line."""
    if isinstance(name_or_path, HardwarePreset):
        return name_or_path
    path = hardware_path(str(name_or_path))
    return _parse(read_toml(path, "hardware file"), path)


def _parse(doc: dict, path: Path) -> HardwarePreset:
    where = f"hardware preset {path}"
    defaults: dict[str, tuple[object, str]] = {}

    def bad(msg):
        raise MoesimError(f"{where}: {msg}")

    for key in doc:
        if key not in _TOP:
            bad(f"unknown key {key!r} (known: {', '.join(sorted(_TOP))})")
    engine = _engine_table(doc.get("engine", {}), bad)
    if "name" not in doc:
        bad("missing key 'name'")
    if not isinstance(doc["name"], str) or not doc["name"]:
        bad("name must be a non-empty string")
    gpu_tables = [t for t in _GPU_TABLES if t in doc]
    cpu_only = not gpu_tables
    if gpu_tables and len(gpu_tables) < len(_GPU_TABLES):
        missing = [t for t in _GPU_TABLES if t not in doc][0]
        bad(f"missing table [{missing}] ([gpu], [vram] and [link] go together; leave all three out for a "
            "CPU-only machine)")
    for table in ("ram", "nvme", "cpu"):
        if table not in doc:
            bad(f"missing table [{table}]")
    doc = {k: (dict(v) if isinstance(v, dict) else v) for k, v in doc.items()}
    for table, allowed in _TABLES.items():
        if table not in doc:
            continue
        t = doc[table]
        if not isinstance(t, dict):
            bad(f"{table} must be a table")
        for key, value in t.items():
            if key == "sources":
                if not isinstance(value, dict):
                    bad(f"[{table}] sources must be a table")
                for skey, sval in value.items():
                    if skey not in allowed:
                        bad(f"[{table}.sources] names unknown key {skey!r}")
                    if not isinstance(sval, str):
                        bad(f"[{table}.sources] {skey} must be a string")
                continue
            if key not in allowed:
                bad(f"unknown key {key!r} in [{table}] (known: {', '.join(sorted(allowed))})")
        for key in _REQUIRED[table]:
            if key not in t:
                bad(f"missing key {key!r} in [{table}]")

    def num(table, key, *, positive=False, default=None, at_most=None):
        t = doc[table]
        if key not in t:
            if (table, key) in DEFAULTS:
                value, basis = DEFAULTS[(table, key)]
                value = value(doc) if callable(value) else value
                defaults[f"{table}.{key}"] = (value, basis)
                return float(value)
            if default is None:
                bad(f"missing key {key!r} in [{table}]")
            return default
        v = t[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            bad(f"[{table}] {key} must be a number (got {v!r:.80})")
        if v > MAX_VALUE:  # GiB, GB/s, us or TFLOP/s: beyond this a typo, and products overflow to inf
            bad(f"[{table}] {key} must be <= {MAX_VALUE:g} (got {v})")
        if v < 0 or (positive and v == 0):
            bad(f"[{table}] {key} must be {'> 0' if positive else '>= 0'} (got {v})")
        if at_most is not None and v > at_most:
            bad(f"[{table}] {key} must be <= {at_most} (got {v})")
        return float(v)

    def bandwidth(table) -> tuple[float, float]:
        t = doc[table]
        spec = num(table, "spec_gb_s", positive=True, default=0.0) if "spec_gb_s" in t else 0.0
        if "effective_gb_s" in t and "efficiency" in t:
            bad(f"[{table}] give either efficiency or effective_gb_s, not both")
        if "effective_gb_s" in t:
            eff = num(table, "effective_gb_s", positive=True)
            if spec and eff > spec:
                bad(f"[{table}] effective_gb_s ({eff}) exceeds spec_gb_s ({spec})")
            return eff * GB, spec * GB
        if not spec:
            bad(f"[{table}] needs spec_gb_s (the data-sheet bandwidth) or effective_gb_s")
        e = num(table, "efficiency", positive=True, at_most=1.0)
        return spec * e * GB, spec * GB

    def tier(table, with_capacity=True) -> Tier:
        bw, spec = bandwidth(table)
        has_cap = with_capacity or "capacity_gib" in doc[table]
        cap = num(table, "capacity_gib", positive=True) if has_cap else 0.0
        reserved = num(table, "reserved_gib", default=0.0) if has_cap else 0.0
        if has_cap and reserved >= cap:
            bad(f"[{table}] reserved_gib ({reserved}) must be below capacity_gib ({cap})")
        return Tier(capacity=cap * GIB, reserved=reserved * GIB, bandwidth=bw, spec_bandwidth=spec,
                    latency=num(table, "latency_us") * 1e-6)

    ram = tier("ram")
    nvme = tier("nvme", with_capacity=False)
    if cpu_only:
        vram = Tier(capacity=0.0, reserved=0.0, bandwidth=ram.bandwidth, spec_bandwidth=ram.spec_bandwidth, latency=0.0)
        link = Link(kind="none", pcie_gen=0, lanes=0, raw_bandwidth=0.0, pinned_bandwidth=0.0, pageable_bandwidth=0.0,
                    latency=0.0, use_pinned=True)
        flops = 0.0
    else:
        vram = tier("vram")
        lt = doc["link"]
        kind = lt["kind"]
        if not isinstance(kind, str) or kind not in ("pcie", "unified"):
            bad(f"[link] kind must be 'pcie' or 'unified' (got {kind!r:.80})")
        use_pinned = lt.get("use_pinned", True)
        if "use_pinned" not in lt:
            defaults["link.use_pinned"] = DEFAULTS[("link", "use_pinned")]
        if not isinstance(use_pinned, bool):
            bad(f"[link] use_pinned must be true or false (got {use_pinned!r})")
        if kind == "pcie":
            for key in ("pcie_gen", "lanes"):
                if key not in lt:
                    bad(f"missing key {key!r} in [link] (needed for kind = 'pcie')")
            gen, lanes = lt["pcie_gen"], lt["lanes"]
            if not isinstance(gen, int) or isinstance(gen, bool) or gen not in PCIE_GT_S:
                bad(f"[link] pcie_gen must be one of {', '.join(map(str, PCIE_GT_S))} (got {gen!r:.80})")
            if not isinstance(lanes, int) or isinstance(lanes, bool) or lanes not in PCIE_LANES:
                bad(f"[link] lanes must be one of {', '.join(map(str, PCIE_LANES))} (got {lanes!r:.80})")
            raw = PCIE_GT_S[gen] * lanes * PCIE_ENCODING[gen] / 8 * GB
            pinned = raw * num("link", "pinned_efficiency", positive=True, at_most=1.0)
            pageable = raw * num("link", "pageable_efficiency", positive=True, at_most=1.0)
            if pageable > pinned:
                bad("[link] pageable_efficiency exceeds pinned_efficiency (pageable copies go through a bounce buffer)")
        else:
            gen = lanes = 0
            raw = pinned = pageable = math.inf
            if vram.capacity > ram.capacity:
                bad("[vram] capacity_gib exceeds [ram] capacity_gib on a unified-memory machine (one shared pool)")
        link = Link(kind=kind, pcie_gen=int(gen), lanes=int(lanes), raw_bandwidth=raw, pinned_bandwidth=pinned,
                    pageable_bandwidth=pageable, latency=num("link", "latency_us") * 1e-6, use_pinned=use_pinned)
        flops = num("gpu", "fp16_tflops", positive=True) * num("gpu", "compute_efficiency", positive=True, at_most=1.0)

    ct = doc["cpu"]
    sockets = num("cpu", "sockets")
    if not sockets.is_integer() or not 1 <= sockets <= 64:
        bad(f"[cpu] sockets must be a whole number in 1..64 (got {sockets!r})")
    cores = num("cpu", "cores")
    if not float(cores).is_integer():
        bad(f"[cpu] cores must be a whole number (got {cores!r})")
    core_bw = num("cpu", "core_gb_s", positive=True) * GB
    process_sockets, remote = int(sockets), 0.0
    if sockets > 1:  # where a process's threads run and how fast they read another socket's memory
        process_sockets = num("cpu", "process_sockets", positive=True)
        if not process_sockets.is_integer() or process_sockets > sockets:
            bad(f"[cpu] process_sockets must be a whole number in 1..sockets (got {process_sockets!r})")
        if "remote_gb_s" in ct:
            remote = num("cpu", "remote_gb_s", positive=True) * GB
        else:
            remote = REMOTE_FRACTION * ram.bandwidth / sockets
            defaults["cpu.remote_gb_s"] = (round(remote / GB, 3), DEFAULTS[("cpu", "remote_gb_s")][1])
    elif "process_sockets" in ct or "remote_gb_s" in ct:
        bad("[cpu] process_sockets and remote_gb_s describe a machine with sockets > 1")
    given = "expert_gb_s" in ct
    if given:
        cpu_bw = num("cpu", "expert_gb_s", positive=True) * GB
        if cpu_bw > ram.bandwidth * (1 + 1e-9):
            bad(f"[cpu] expert_gb_s ({cpu_bw / GB:g}) exceeds the effective [ram] bandwidth "
                f"({ram.bandwidth / GB:g} GB/s):"
                " the CPU cannot stream expert weights faster than host memory delivers them")
    else:
        cpu_bw = ram.bandwidth / int(sockets)
        if cores:
            cpu_bw = min(cpu_bw, cores * core_bw)
        defaults["cpu.expert_gb_s"] = (round(cpu_bw / GB, 3), "derived: effective [ram] bandwidth of one "
                                       "socket, capped by cores x core_gb_s; an engine's numa_pages and "
                                       "numa_gain decide what further sockets add")
    return HardwarePreset(
        name=str(doc["name"]), description=str(doc.get("description", "")), source=str(doc.get("source", "")),
        gpu_name=str(doc.get("gpu", {}).get("name", "")), gpu_flops=flops * 1e12, vram=vram, ram=ram, link=link,
        nvme=nvme, cpu_name=str(ct.get("name", "")), cpu_expert_bandwidth=cpu_bw,
        cpu_latency=num("cpu", "latency_us") * 1e-6, path=str(path), doc=doc, sockets=int(sockets),
        process_sockets=int(process_sockets), remote_bandwidth=remote, cores=int(cores),
        core_bandwidth=core_bw, matrix_latency=num("cpu", "matrix_us") * 1e-6, cpu_expert_given=given,
        defaults=defaults, engine=engine,
    )


def _engine_table(t, bad) -> dict:
    """[engine] of a machine file: ``profile`` (an engine profile name or file) and any of that profile's keys,
    each number with a ``sources`` entry; the values are validated as a profile when the machine is priced."""
    from moesim.costmodel.engines import profile_keys

    if not isinstance(t, dict):
        bad("engine must be a table")
    if not t:
        return {}
    if not isinstance(t.get("profile"), str) or not t["profile"]:
        bad("[engine] needs profile = the engine profile the numbers belong to (e.g. 'llama.cpp-expert-cache')")
    allowed = profile_keys() - {"name", "description", "source"}
    for key in t:
        if key not in allowed | {"profile", "sources"}:
            bad(f"unknown key {key!r} in [engine] (known: profile, {', '.join(sorted(allowed))})")
    src = t.get("sources", {})
    if not isinstance(src, dict) or any(k not in allowed for k in src):
        bad("[engine.sources] must be a table naming the engine's keys")
    return dict(t)


def missing_sources(hw: HardwarePreset) -> list[str]:
    """Numbers in the file that no ``sources`` entry explains (shipped presets must have none)."""
    out = []
    for table in (*_TABLES, "engine"):
        t = hw.doc.get(table, {})
        if not isinstance(t, dict):
            continue
        src = t.get("sources", {})
        for key, value in t.items():
            if key in ("sources", "name", "kind", "use_pinned"):
                continue
            if isinstance(value, (int, float)) and key not in src:
                out.append(f"{table}.{key}")
    return out
