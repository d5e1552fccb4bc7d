"""`moesim hw probe`: measure the machine this runs on and describe it as a machine file with `measured:` sources.

DRAM streaming bandwidth (threaded reductions over a buffer far larger than the caches), CPU expert mat-vec at
the model's real expert shapes (float32 BLAS mat-vec over a pool of matrices larger than the caches; two sizes
give the per-matrix start cost and the streaming rate), NVMe reads of 128 KiB and 4 MiB (O_DIRECT where the file
system allows it, else after dropping the file's pages) and, when torch sees a GPU, pinned and pageable
host-to-device copies and VRAM bandwidth.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from moesim.errors import MoesimError
from moesim.files import os_error_message

GB = 1e9


def _best(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def dram_bandwidth(mib: int = 512, threads: int | None = None) -> float:
    """Bytes/s of a multi-threaded streaming read (numpy reductions release the GIL)."""
    threads = threads or os.cpu_count() or 1
    a = np.ones(mib * 2**20 // 8, np.float64)
    parts = np.array_split(a, threads)
    with ThreadPoolExecutor(threads) as pool:
        secs = _best(lambda: list(pool.map(np.sum, parts)))
    return a.nbytes / secs


def expert_matvec(rows: int, cols: int, pool_mib: int = 256) -> tuple[float, float]:
    """(seconds per expert matrix at fixed cost, bytes/s) from mat-vecs over a pool of (rows x cols) float32
    matrices and of matrices 4x their size: t(matrix) = fixed + bytes / rate."""
    out = []
    for scale in (1, 4):
        r = rows * scale
        n = max(2, pool_mib * 2**20 // (r * cols * 4))
        mats = [np.ones((r, cols), np.float32) for _ in range(n)]
        x = np.ones(cols, np.float32)
        secs = _best(lambda mats=mats, x=x: [m @ x for m in mats]) / n
        out.append((r * cols * 4, secs))
    (b1, t1), (b4, t4) = out
    rate = (b4 - b1) / (t4 - t1) if t4 > t1 else b4 / t4
    fixed = t1 - b1 / rate
    if not 0 <= fixed <= 0.5 * t1:  # noisy (a shared machine): no fixed cost resolved, the larger size's rate
        rate, fixed = b4 / t4, max(0.0, t1 - b1 / (b4 / t4))
    return min(fixed, 0.5 * t1), rate


def nvme_reads(directory: str, mib: int = 256) -> dict:
    """Bytes/s of reads at 128 KiB and 4 MiB from a fresh file in ``directory`` (O_DIRECT when allowed)."""
    path = os.path.join(directory, f".moesim-probe-{os.getpid()}.bin")
    size = mib * 2**20
    block = np.random.default_rng(0).integers(0, 255, 4 * 2**20, np.uint8).tobytes()
    try:
        try:
            with open(path, "wb") as f:
                for _ in range(size // len(block)):
                    f.write(block)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:  # a full disk: say where (the OS error alone names no file)
            raise MoesimError(f"{directory}: cannot write the {mib} MiB probe file there "
                              f"({os_error_message(exc)}); give --dir on a disk with room") from None
        out = {}
        for kib in (128, 4096):
            out[kib] = _read_rate(path, size, kib * 1024)
        return out
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


def _read_rate(path: str, size: int, req: int) -> tuple[float, str]:
    import mmap

    direct = getattr(os, "O_DIRECT", 0)
    try:
        fd = os.open(path, os.O_RDONLY | direct)
        how = "O_DIRECT"
    except OSError:
        fd, how = os.open(path, os.O_RDONLY), "buffered after POSIX_FADV_DONTNEED"
    try:
        if how != "O_DIRECT" and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        buf = mmap.mmap(-1, req)  # page-aligned, as O_DIRECT needs
        t0 = time.perf_counter()
        done = 0
        try:
            while done < size:
                n = os.preadv(fd, [buf], done)
                if n <= 0:
                    break
                done += n
        except OSError:
            os.close(fd)
            fd = os.open(path, os.O_RDONLY)
            how = "buffered (O_DIRECT refused)"
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            t0, done = time.perf_counter(), 0
            while done < size:
                n = os.preadv(fd, [buf], done)
                if n <= 0:
                    break
                done += n
        return done / (time.perf_counter() - t0), how
    finally:
        os.close(fd)


def gpu(mib: int = 256) -> dict | None:
    """Pinned / pageable host-to-device copies and VRAM copy bandwidth, when torch sees a CUDA GPU."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    n = mib * 2**20
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    out = {"name": torch.cuda.get_device_name(0),
           "capacity_gib": torch.cuda.get_device_properties(0).total_memory / 2**30}
    for kind, host in (("pinned", torch.empty(n, dtype=torch.uint8).pin_memory()),
                       ("pageable", torch.empty(n, dtype=torch.uint8))):
        def copy(host=host):
            dev.copy_(host, non_blocking=True)
            torch.cuda.synchronize()
        out[kind] = n / _best(copy)
    other = torch.empty_like(dev)

    def d2d():
        other.copy_(dev)
        torch.cuda.synchronize()
    out["vram"] = 2 * n / _best(d2d)  # a device copy reads and writes every byte
    return out


def _mem_gib() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def probe(model: str = "qwen3-30b-a3b", directory: str | None = None, quick: bool = False) -> dict:
    """Measure this machine; return the machine-file document (plain data) with measured sources."""
    import platform
    import tempfile

    from moesim.costmodel.models import load_model

    m = load_model(model)
    mib = 64 if quick else 512
    when = time.strftime("%Y-%m-%d")
    tag = f"measured: moesim hw probe {when}"
    ram_bw = dram_bandwidth(mib)
    fixed, mv = expert_matvec(m.moe_intermediate_size, m.hidden_size, 32 if quick else 256)
    nv = nvme_reads(directory or tempfile.gettempdir(), 32 if quick else 256)
    cores = os.cpu_count() or 1
    doc: dict[str, Any] = {
        "name": f"probed-{platform.node() or 'machine'}",
        "description": f"{platform.processor() or platform.machine()}, measured by moesim hw probe on {when}",
        "source": "moesim hw probe (measured on this machine)",
    }
    g = gpu(64 if quick else 256)
    if g is not None:
        doc["gpu"] = {"name": g["name"], "fp16_tflops": 1.0,
                      "sources": {"fp16_tflops": "unknown: not probed; set the data-sheet FP16 tensor TFLOPS"}}
        doc["vram"] = {"capacity_gib": round(g["capacity_gib"], 2), "effective_gb_s": round(g["vram"] / GB, 2),
                       "sources": {"capacity_gib": tag, "effective_gb_s": f"{tag}, device-to-device copy"}}
        doc["link"] = {"kind": "pcie", "pcie_gen": 4, "lanes": 16,
                       "pinned_efficiency": 1.0, "pageable_efficiency": 1.0,
                       "sources": {"pcie_gen": "assumed: set from the data sheet",
                                   "pinned_efficiency": f"{tag}: pinned copies {g['pinned'] / GB:.2f} GB/s",
                                   "pageable_efficiency": f"{tag}: pageable copies {g['pageable'] / GB:.2f} GB/s"}}
        raw = 31.5e9
        doc["link"]["pinned_efficiency"] = round(min(1.0, g["pinned"] / raw), 3)
        doc["link"]["pageable_efficiency"] = round(min(doc["link"]["pinned_efficiency"], g["pageable"] / raw), 3)
    cpu_rate = min(mv, ram_bw)
    doc["ram"] = {"capacity_gib": round(_mem_gib(), 2), "effective_gb_s": round(ram_bw / GB, 3),
                  "sources": {"capacity_gib": f"{tag}, /proc/meminfo",
                              "effective_gb_s": f"{tag}, {cores}-thread streaming read of {mib} MiB"}}
    rate4, how4 = nv[4096]
    rate128, how128 = nv[128]
    doc["nvme"] = {"effective_gb_s": round(rate4 / GB, 3),
                   "latency_us": round(max(0.0, 131072 / rate128 - 131072 / rate4) * 1e6, 1),
                   "sources": {"effective_gb_s": f"{tag}, 4 MiB reads ({how4})",
                               "latency_us": f"{tag}, 128 KiB reads at {rate128 / GB:.3f} GB/s ({how128}): the extra "
                                             "time per request over 4 MiB reads"}}
    doc["cpu"] = {"name": platform.processor() or platform.machine(), "sockets": 1, "cores": cores,
                  "expert_gb_s": round(cpu_rate / GB, 3), "matrix_us": round(fixed * 1e6, 2),
                  "sources": {"cores": f"{tag}, os.cpu_count()",
                              "expert_gb_s": f"{tag}, float32 BLAS mat-vec over {model} expert matrices "
                                             f"({m.moe_intermediate_size} x {m.hidden_size}) and 4x larger ones",
                              "matrix_us": f"{tag}, fixed cost per matrix from the same fit",
                              "sockets": "assumed: one socket (not probed)"}}
    return doc
