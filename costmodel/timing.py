"""The analytic time model: seconds per decode step from bytes moved through each tier.

Decode is bandwidth-bound: every operation is costed as (per-transfer latency) + bytes / (effective bandwidth of the
path it takes). ``cost_params`` turns (model, quantization, hardware) into plain floats (``CostParams``) that a replay
kernel multiplies by its counts; ``estimate`` is the trace-free what-if built on the same numbers. docs/costmodel.md
gives the equations and what is not modelled.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from moesim.costmodel.engines import EngineProfile, load_engine, n_copies, with_overrides
from moesim.costmodel.hardware import GIB, HardwarePreset, load_hardware
from moesim.costmodel.models import ModelPreset, load_model
from moesim.errors import MoesimError

DENSE_PLACEMENTS = ("auto", "vram", "ram", "nvme")
MISS_MODES = ("fetch", "cpu", "hybrid")
# Swapped-out anonymous pages come back in clusters of 2^vm.page-cluster pages: Linux's default page-cluster = 3,
# 8 pages of 4 KiB (Documentation/admin-guide/sysctl/vm.rst); the faulting thread waits for each cluster.
SWAP_CLUSTER = 8 * 4096
# The per-step engine costs the replay charges beyond per-operation seconds (simulator/counters.py COST_NAMES holds
# them; docs/replay-semantics.md, "Engine costs of a dynamic cache"); CostParams.kernel_v2() gives them.
KERNEL_V2_COSTS = ("router_sync",)


@dataclass(frozen=True)
class CostParams:
    """Seconds per operation for one (model, quantization, hardware). All times in seconds, sizes in bytes.

    Per decode step (one token of each of ``batch`` sequences, all MoE layers), a replay adds:

    - ``s_dense`` once, plus ``s_dense_per_seq`` for each sequence beyond the first (dense weights are read once per
      step; the embedding row and the KV/recurrent state are read per sequence);
    - ``s_expert_vram`` for every expert run on the GPU (hits, substitutes, and fetched experts after their copy);
    - ``s_fetch_ram`` for each synchronous copy host RAM -> VRAM (latency + bytes / link bandwidth), or
      ``s_fetch_nvme`` when the expert is not in host RAM either (NVMe -> VRAM, chunk-pipelined through host
      memory: both latencies + bytes / the slower of NVMe and link); both exclude the compute;
    - ``s_expert_cpu`` for each expert computed on the CPU from host RAM, ``s_expert_cpu_nvme`` when it must first be
      read from NVMe;
    - background copies occupy the link for ``s_copy_link`` (from host RAM) or ``s_copy_nvme`` (from NVMe); a
      synchronous fetch issued while the link is busy waits for it (the replay kernel keeps that clock).

    ``s_nvme_read`` is NVMe -> host RAM alone (admission into a host-RAM tier). On a unified-memory machine nothing
    is copied: ``s_fetch_ram = s_copy_link = 0`` and ``s_fetch_nvme = s_nvme_read``.

    An engine's per-miss and per-token costs (issue 29) fold into these: every copy (fetch, background copy,
    write-back) pays the link latency once per copy the engine makes of an expert (``copies_per_expert``) and a
    fetched or uploaded expert ``s_fetch_fixed``; ``s_dense`` holds the fixed cost of a decode step (``s_token``) and
    the swap-in of over-committed host memory (``s_swap``). ``s_router_sync`` (once per MoE layer step not wholly
    resident), ``cpu_overlap`` and ``uploads_per_layer`` (hybrid misses) are per-step logic of the replay's kernels
    (``kernel_v2``).
    ``vram_expert_slots`` / ``ram_expert_slots``: how many experts fit in VRAM after the dense weights and the
    reserve, and in host RAM beyond those (tiers exclusive; 0 means none). ``ram_expert_capacity``: how many
    experts host RAM holds in all (inclusive of the VRAM copies, as an offloading engine keeps every expert in
    host memory); a replay's host-RAM tier has this size.
    """

    model: str
    quant: str
    hw: str
    n_moe_layers: int
    n_experts: int
    top_k: int
    bytes_per_expert: float
    dense_bytes: float  # non-expert bytes one decoded token reads at batch 1 (weights + embedding row + state)
    dense_weight_bytes: float  # dense weights read once per step whatever the batch
    dense_seq_bytes: float  # per sequence per step: embedding row + KV / recurrent state at ``context``
    dense_placement: str  # vram | split | ram | nvme
    dense_vram_fraction: float  # fraction of the dense weights held in VRAM
    context: int
    s_dense: float
    s_dense_per_seq: float
    s_expert_vram: float
    s_fetch_ram: float
    s_fetch_nvme: float
    s_nvme_read: float
    s_expert_cpu: float
    s_expert_cpu_nvme: float
    s_copy_link: float
    s_copy_nvme: float
    vram_expert_slots: int
    ram_expert_slots: int
    unified: bool
    flops_per_token: float  # 2 x active non-embedding parameters: matmul FLOPs of one token
    attn_flops_per_ctx_token: float  # extra FLOPs per token per earlier token in the context (QK^T and AV)
    gpu_flops: float  # effective FLOP/s of the GPU
    link_bandwidth: float  # bytes/s (inf on unified memory)
    nvme_bandwidth: float
    ram_expert_capacity: int = 0
    engine: str = "ideal"
    s_cpu_handoff: float = 0.0  # once per (token, MoE layer) step with an expert computed on the CPU
    s_writeback: float = 0.0  # link time per eviction for engines that copy evicted experts back
    s_gpu_layer: float = 0.0  # fixed GPU cost per layer (included in s_dense)
    s_cpu_layer: float = 0.0  # fixed CPU cost per layer computed on the CPU (included in s_dense)
    cpu_bandwidth: float = 0.0  # bytes/s of expert weights the CPU computes on (this engine)
    nvme_read_bandwidth: float = 0.0  # bytes/s of expert reads from NVMe (this engine's request size)
    placement: str = "experts"  # experts | layers (what VRAM holds under this engine)
    has_gpu: bool = True
    overlap: str = "none"  # the engine's copy/compute overlap (the replay clock's default --overlap)
    # lowbit:Q (a miss fetches a Q-quantized copy): bytes per expert at each quantization the model preset knows, and
    # the fixed parts of a copy (link + host RAM latency) and of a run from VRAM
    expert_bytes_by_quant: dict = field(default_factory=dict)
    s_link_latency: float = 0.0
    s_vram_latency: float = 0.0
    vram_bandwidth: float = 0.0
    # issue 29: per-miss and per-token engine costs (folded into the seconds above, except those of kernel_v2())
    s_token: float = 0.0  # fixed per decode step (included in s_dense)
    s_fetch_fixed: float = 0.0  # per fetched or uploaded expert (included in s_fetch_*, s_copy_*)
    copies_per_expert: int = 1  # host-to-GPU copies per expert (each pays the link latency)
    s_router_sync: float = 0.0  # per MoE layer step not wholly resident
    engine_miss: str = "any"  # the engine's miss mode: any | cpu | fetch | hybrid
    uploads_per_layer: int = 0  # hybrid misses: background uploads per layer per step at most (0: any)
    cpu_overlap: bool = False  # CPU experts run while the GPU runs the layer's others
    # memory pressure at (context, batch): the KV cache, its placement, what host RAM has left, what swaps
    batch: int = 1
    kv_bytes_per_seq: float = 0.0  # KV cache of one sequence at ``context`` tokens
    kv_vram_fraction: float = 1.0  # share of the KV cache in VRAM (the rest in host RAM)
    host_cache_bytes: float = 0.0  # host RAM left for experts after the reserve, KV, dense weights, embedding table
    swap_bytes: float = 0.0  # host memory (KV cache, own dense weights) swapped in every step when over-committed
    dense_nvme_bytes: float = 0.0  # mmap-ed dense weights the page cache cannot keep: re-read every step
    s_swap: float = 0.0  # seconds per step of swap-in and dense re-reads (included in s_dense)
    mmap: bool = False  # the engine reads host weights through the page cache (nvme_read_kib > 0)

    def kernel_v2(self) -> dict:
        """The per-step engine costs and modes the replay charges: ``router_sync`` (seconds, KERNEL_V2_COSTS), the
        modes ``cpu_overlap`` and ``uploads_per_layer`` (docs/replay-semantics.md)."""
        return {"router_sync": self.s_router_sync, "cpu_overlap": self.cpu_overlap,
                "uploads_per_layer": self.uploads_per_layer, "hybrid": self.engine_miss == "hybrid"}

    def lowbit_seconds(self, quant: str) -> tuple[float, float]:
        """(copy host RAM -> VRAM, run from VRAM) of one expert quantized as ``quant`` (lowbit:Q). The low-bit
        copies are read from host RAM (they are a fraction of the experts' size); no NVMe tier is modelled."""
        if quant not in self.expert_bytes_by_quant:
            raise MoesimError(f"lowbit:{quant}: the model preset {self.model} has no quantization {quant!r} "
                              f"(known: {', '.join(self.expert_bytes_by_quant)})")
        b = float(self.expert_bytes_by_quant[quant])
        if b >= self.bytes_per_expert:
            raise MoesimError(f"lowbit:{quant}: {quant} experts ({b / 2**20:.2f} MiB) are not smaller than the "
                              f"replay's {self.quant} experts ({self.bytes_per_expert / 2**20:.2f} MiB)")
        fetch = 0.0 if self.unified else self.s_link_latency + self.s_fetch_fixed + b / self.link_bandwidth
        run = self.s_vram_latency + (b / self.vram_bandwidth if self.vram_bandwidth > 0 else 0.0)
        return fetch, run

    def step_seconds(self, n_gpu: float, n_fetch_ram: float = 0, n_fetch_nvme: float = 0, n_cpu_ram: float = 0,
                     n_cpu_nvme: float = 0, batch: int = 1) -> float:
        """One decode step without link contention: ``n_gpu`` counts every expert run on the GPU (including the
        fetched ones), the other counts are the copies and CPU-computed experts of the step."""
        return (self.s_dense + (batch - 1) * self.s_dense_per_seq + n_gpu * self.s_expert_vram
                + n_fetch_ram * self.s_fetch_ram + n_fetch_nvme * self.s_fetch_nvme
                + n_cpu_ram * self.s_expert_cpu + n_cpu_nvme * self.s_expert_cpu_nvme)

    def router_sync_seconds(self, n_host_layer_steps: float) -> float:
        """The router read-back of ``n_host_layer_steps`` (token, MoE layer) steps of layers not wholly resident."""
        return n_host_layer_steps * self.s_router_sync

    def decode_compute_floor(self, batch: int = 1) -> float:
        """Seconds the GPU needs for the matmul FLOPs of one step at this batch (decode is memory-bound unless this
        exceeds the memory time)."""
        return batch * (self.flops_per_token + self.attn_flops_per_ctx_token * self.context) / self.gpu_flops

    def prefill_seconds(self, n_tokens: int, n_gpu: float, n_fetch_ram: float = 0, n_fetch_nvme: float = 0) -> float:
        """A prompt of ``n_tokens`` processed as one batch: the larger of its compute time (matmul FLOPs plus causal
        attention over the prompt, at the GPU's effective FLOP/s) and its memory time (dense weights once, each
        distinct expert of the prompt read once: ``n_gpu`` experts from VRAM, the rest copied first)."""
        flops = n_tokens * self.flops_per_token + self.attn_flops_per_ctx_token * n_tokens * (n_tokens - 1) / 2
        compute = flops / self.gpu_flops
        memory = (self.s_dense + n_gpu * self.s_expert_vram + n_fetch_ram * self.s_fetch_ram
                  + n_fetch_nvme * self.s_fetch_nvme)
        return max(compute, memory)

    def as_dict(self) -> dict:
        return asdict(self)


def _resolve(model, quant, hw) -> tuple[ModelPreset, str, HardwarePreset]:
    m = model if isinstance(model, ModelPreset) else load_model_any(str(model))
    h = load_hardware(hw)
    quant = quant or m.native_quant
    m.bytes_per_expert(quant)  # validates the quantization name
    m.dense_bytes_per_token(quant)
    return m, quant, h


def _attn_flops_per_ctx_token(m: ModelPreset) -> float:
    a = m.attention
    kind = a.get("kind", "gqa")
    if kind == "mla":
        per_layer = (2 * a["n_heads"] * (a["qk_nope_head_dim"] + a["qk_rope_head_dim"])
                     + 2 * a["n_heads"] * a["v_head_dim"])
        return per_layer * m.n_layers
    n_full = sum(1 for i in range(m.n_layers) if m._is_full_attention(i))
    return 4.0 * a["n_heads"] * a["head_dim"] * n_full


def load_model_any(name_or_path: str) -> ModelPreset:
    """A model preset name, a model TOML file, or a GGUF file (header and tensor index only)."""
    if str(name_or_path).endswith(".gguf"):
        from moesim.costmodel.gguf import load_gguf

        return load_gguf(name_or_path)
    return load_model(name_or_path)


def nvme_rate(h: HardwarePreset, e: EngineProfile) -> float:
    """Bytes/s of NVMe reads in the engine's request size: ``qd`` requests of ``r`` bytes in flight, each taking
    the drive's latency plus r / sequential bandwidth (never above the sequential rate)."""
    bw = h.nvme.bandwidth
    if not e.nvme_read_kib:
        return bw
    r = e.nvme_read_kib * 1024.0
    qd = max(1, e.nvme_queue_depth)
    return min(bw, qd * r / (h.nvme.latency + r / bw))


def swap_rate(h: HardwarePreset) -> float:
    """Bytes/s of swap-in: page clusters of SWAP_CLUSTER bytes, one in flight (the faulting thread waits)."""
    bw = h.nvme.bandwidth
    return min(bw, SWAP_CLUSTER / (h.nvme.latency + SWAP_CLUSTER / bw))


def engine_for(engine, hw) -> EngineProfile:
    """The engine profile that prices ``hw``: ``engine`` (a name, file or profile) or, when None, the machine file's
    [engine] profile (a calibrated machine), else ideal. A machine file's fitted numbers apply to its own profile."""
    h = load_hardware(hw)
    doc = h.engine
    if isinstance(engine, EngineProfile) and not doc:
        return engine
    e = load_engine(engine if engine is not None else (doc.get("profile") if doc else None))
    if doc and load_engine(doc["profile"]).name == e.name:
        e = with_overrides(e, {k: v for k, v in doc.items() if k != "profile"}, f"{h.path} [engine]")
    return e


def cost_params(model, quant: str | None, hw, *, context: int = 0, dense: str = "auto", batch: int = 1,
                engine: str | EngineProfile | None = None) -> CostParams:
    """Per-operation seconds for ``model`` (preset, name or TOML path) at ``quant`` (default: the model's native
    format) on ``hw`` (preset, name or TOML path).

    ``dense`` places the non-expert weights: ``auto`` = VRAM if they fit after the reserve (else the part that fits,
    the rest computed by the CPU from host RAM, as llama.cpp's partial ``-ngl`` does), ``vram``, ``ram`` (CPU
    computes them from host RAM) or ``nvme`` (streamed from NVMe every token: nothing cached). ``context`` is the
    number of earlier tokens whose KV cache each decoded token reads (0: not counted); ``batch`` sequences each keep
    such a KV cache. Memory is shared: the KV cache (context x batch) comes out of VRAM and host RAM before the expert
    tiers, as the engine places it (``kv``: with its layer's weights, or on the GPU in full); what host RAM cannot hold
    is swapped and read back every step (``s_swap``). ``engine`` None: the machine file's [engine], else ideal.
    """
    m, quant, h = _resolve(model, quant, hw)
    e = engine_for(engine, h)
    if dense not in DENSE_PLACEMENTS:
        raise MoesimError(f"unknown dense placement {dense!r} (known: {', '.join(DENSE_PLACEMENTS)})")
    if context < 0 or batch < 1:
        raise MoesimError("context must be >= 0 and batch >= 1")
    bpe = float(m.bytes_per_expert(quant))
    groups = m.dense_bytes_by_group(quant)
    weights = float(m.dense_resident_bytes(quant))
    state = float(m.kv_read_bytes(context))  # one sequence's KV cache: what a decoded token reads, and holds
    kv_total = state * batch

    vram_bw, nvme_bw = h.vram.bandwidth, h.nvme.bandwidth
    cpu_bw = h.cpu_rate(e.numa_gain, e.cpu_stream_fraction, e.numa_pages)
    link_bw = h.link.bandwidth
    if h.has_gpu and not h.unified and e.copy != "hw":
        link_bw = h.link.pinned_bandwidth if e.copy == "pinned" else h.link.pageable_bandwidth
    nvme_read_bw = nvme_rate(h, e)
    whole_reads = not e.nvme_read_kib  # one request per expert: the drive's latency is paid per read
    nvme_lat = h.nvme.latency if whole_reads else 0.0
    usable_v = h.vram.usable if h.has_gpu else 0.0
    if not h.has_gpu:
        if dense == "vram":
            raise MoesimError(f"{h.name} has no GPU: dense weights cannot be placed in VRAM")
        if dense == "auto":
            dense = "ram"
    kv_first = h.has_gpu and e.kv == "vram"
    if kv_first and kv_total > usable_v:
        raise MoesimError(f"the KV cache of {batch} sequence(s) x {context} tokens ({kv_total / GIB:.1f} GiB) does "
                          f"not fit in the usable VRAM of {h.name} ({usable_v / GIB:.1f} GiB), where the {e.name} "
                          "engine keeps it; use a shorter --context or a smaller --batch")
    # engines that keep each layer's KV cache with its weights (llama.cpp -ngl) place both together
    need = weights + (0.0 if kv_first else kv_total)
    room = usable_v - (kv_total if kv_first else 0.0)
    if dense == "auto":
        frac = 1.0 if need <= room else max(0.0, room / need)
        placement = "vram" if frac >= 1.0 else ("split" if frac > 0 else "ram")
    else:
        placement, frac = dense, (1.0 if dense == "vram" else 0.0)
        if dense == "vram" and need > room:
            what = "dense weights" + ("" if kv_first or not kv_total else " and their KV cache")
            raise MoesimError(f"{what} ({need / GIB:.1f} GiB) do not fit in the usable VRAM of {h.name} "
                              f"({max(room, 0) / GIB:.1f} GiB); use --dense auto or ram")
    kv_frac = 1.0 if kv_first else (frac if h.has_gpu else 0.0)
    on_gpu, off_gpu = weights * frac, weights * (1 - frac)
    kv_vram, kv_host = kv_total * kv_frac, kv_total * (1 - kv_frac)

    # host RAM: the reserve (OS, buffers), the embedding table, the KV cache and the dense weights not on the GPU come
    # first; an mmap-ing engine keeps its dense weights in the page cache, others in their own memory. A step reads
    # all of them, so when they do not fit, LRU reclaim keeps nothing from one step to the next (a cyclic scan larger
    # than the memory misses on every page): over-committed memory is swapped in whole every step, and dense pages the
    # page cache cannot hold are re-read from NVMe every step
    mmap = bool(e.nvme_read_kib)
    ram_room = h.ram.usable
    if h.unified and h.has_gpu:  # one pool: the GPU's wired part is already counted in [ram]
        ram_room -= h.vram.capacity
    dense_host = off_gpu if placement in ("split", "ram") else 0.0
    anon = kv_host + (0.0 if mmap else dense_host)
    embed = m.embedding_table_bytes(quant)
    over = anon + embed - ram_room
    swap = anon if over > 0 else 0.0
    left = max(0.0, ram_room - embed - anon)
    file_hot = dense_host if mmap else 0.0
    dense_nvme = file_hot if file_hot > left else 0.0
    left = max(0.0, left - file_hot)
    if over > 0:
        free_nvme = h.nvme.capacity - m.file_bytes(quant) if h.nvme.capacity else math.inf
        if over > free_nvme:
            raise MoesimError(f"the KV cache of {batch} sequence(s) x {context} tokens ({kv_total / GIB:.1f} GiB) "
                              f"cannot fit anywhere on {h.name}: {over / GIB:.1f} GiB beyond VRAM and host RAM, "
                              f"{max(free_nvme, 0) / GIB:.1f} GiB free on the NVMe for swap")
    s_swap = swap / swap_rate(h) + dense_nvme / nvme_read_bw

    if placement == "nvme":
        s_dense_weights = nvme_lat + weights / min(nvme_read_bw, cpu_bw)
    else:
        s_dense_weights = on_gpu / vram_bw + off_gpu / cpu_bw
    # fixed per-layer costs: the GPU share of the layers, and the layers (or parts) the CPU computes
    s_gpu_layer = e.gpu_layer_us * 1e-6 if h.has_gpu else 0.0
    s_cpu_layer = e.cpu_layer_us * 1e-6
    s_dense_weights += m.n_layers * (frac * s_gpu_layer + (1 - frac) * s_cpu_layer)
    # The embedding row is a host lookup; the KV / recurrent state lives with the attention weights (or in VRAM).
    s_seq = groups["embed_row"] / h.ram.bandwidth + state * (kv_frac / vram_bw + (1 - kv_frac) / cpu_bw)
    s_token = e.token_us * 1e-6
    s_dense = s_dense_weights + s_seq + s_token + s_swap

    vram_left = max(0.0, usable_v - on_gpu - kv_vram) if h.has_gpu else 0.0
    total_experts = m.n_moe_layers * m.n_experts
    vram_slots = min(total_experts, int(vram_left // bpe))
    ram_slots = min(total_experts - vram_slots, int(left // bpe))

    unified = h.unified or not h.has_gpu
    n_mats = 3 if m.glu else 2
    copies = n_copies(e, m.glu)
    copy_lat = copies * h.link.latency  # each copy of an expert (or of one of its matrices) pays the link latency
    s_fetch_fixed = 0.0 if unified else e.fetch_expert_us * 1e-6
    s_expert_vram = h.vram.latency + bpe / vram_bw
    s_nvme_read = nvme_lat + bpe / nvme_read_bw
    if unified:
        s_fetch_ram, s_fetch_nvme = 0.0, s_nvme_read
    else:
        s_fetch_ram = copy_lat + h.ram.latency + s_fetch_fixed + bpe / link_bw
        s_fetch_nvme = nvme_lat + copy_lat + s_fetch_fixed + bpe / min(nvme_read_bw, link_bw)
    s_cpu_fixed = h.cpu_latency + n_mats * h.matrix_latency
    s_expert_cpu = s_cpu_fixed + h.ram.latency + bpe / cpu_bw
    s_expert_cpu_nvme = nvme_lat + s_cpu_fixed + bpe / min(nvme_read_bw, cpu_bw)
    # hand-off of a CPU-resident MoE layer: activations to the host and back (a synchronous copy each way), a
    # second GPU graph launch for the split, and the CPU sub-graph's thread synchronisation
    s_handoff = 0.0
    if e.cpu_handoff and h.has_gpu:
        s_handoff = 2 * h.link.latency + s_gpu_layer + s_cpu_layer
    s_writeback = (copy_lat + bpe / link_bw) if (e.writeback and not unified) else 0.0
    s_router_sync = e.router_sync_us * 1e-6 if h.has_gpu else 0.0

    flops_per_token = 2.0 * m.active_params("without_embedding_table")
    return CostParams(
        model=m.name, quant=quant, hw=h.name, n_moe_layers=m.n_moe_layers, n_experts=m.n_experts, top_k=m.top_k,
        bytes_per_expert=bpe, dense_bytes=weights + groups["embed_row"] + state, dense_weight_bytes=weights,
        dense_seq_bytes=groups["embed_row"] + state, dense_placement=placement, dense_vram_fraction=frac,
        context=int(context), s_dense=s_dense, s_dense_per_seq=s_seq, s_expert_vram=s_expert_vram,
        s_fetch_ram=s_fetch_ram, s_fetch_nvme=s_fetch_nvme, s_nvme_read=s_nvme_read, s_expert_cpu=s_expert_cpu,
        s_expert_cpu_nvme=s_expert_cpu_nvme, s_copy_link=s_fetch_ram, s_copy_nvme=s_fetch_nvme,
        vram_expert_slots=int(vram_slots), ram_expert_slots=int(ram_slots), unified=unified,
        flops_per_token=flops_per_token, attn_flops_per_ctx_token=_attn_flops_per_ctx_token(m), gpu_flops=h.gpu_flops,
        link_bandwidth=link_bw, nvme_bandwidth=nvme_bw,
        ram_expert_capacity=min(total_experts, int(left // bpe)),
        engine=e.name, overlap=e.overlap, s_cpu_handoff=s_handoff, s_writeback=s_writeback, s_gpu_layer=s_gpu_layer,
        s_cpu_layer=s_cpu_layer, cpu_bandwidth=cpu_bw, nvme_read_bandwidth=nvme_read_bw, placement=e.placement,
        has_gpu=h.has_gpu, expert_bytes_by_quant={q: m.bytes_per_expert(q) for q in m.quant_names()},
        s_link_latency=copy_lat + h.ram.latency, s_vram_latency=h.vram.latency, vram_bandwidth=vram_bw,
        s_token=s_token, s_fetch_fixed=s_fetch_fixed, copies_per_expert=copies, s_router_sync=s_router_sync,
        engine_miss=e.miss, uploads_per_layer=int(e.uploads_per_layer), cpu_overlap=bool(e.cpu_overlap and h.has_gpu),
        batch=int(batch), kv_bytes_per_seq=state, kv_vram_fraction=kv_frac, host_cache_bytes=left, swap_bytes=swap,
        dense_nvme_bytes=dense_nvme, s_swap=s_swap, mmap=mmap,
    )


MAX_ZIPF = 20.0  # popularity skew exponents beyond this put all but ~1e-6 of a layer's requests on one expert

# ---- routing statistics the analytic model needs --------------------------------------------------------------

def _zipf_probs(n_experts: int, zipf: float) -> np.ndarray:
    w = np.exp(-zipf * np.log(np.arange(1, n_experts + 1, dtype=np.float64)))  # i^-zipf; the tail may underflow to 0
    return w / w.sum()


def coverage(n_experts: int, slots: float, zipf: float = 0.0) -> float:
    """Fraction of one layer's expert requests that fall on its ``slots`` most popular experts when popularity is
    Zipf(``zipf``) over ``n_experts`` (0 = uniform: slots / n_experts). Fractional slots interpolate."""
    if zipf < 0:
        raise MoesimError(f"zipf exponent must be >= 0 (got {zipf})")
    slots = min(max(float(slots), 0.0), float(n_experts))
    if zipf == 0:
        return slots / n_experts
    cum = np.concatenate([[0.0], np.cumsum(_zipf_probs(n_experts, zipf))])
    i = int(math.floor(slots))
    return float(cum[i] + (slots - i) * (cum[min(i + 1, n_experts)] - cum[i]))


def selection_probs(n_experts: int, top_k: int, zipf: float = 0.0) -> np.ndarray:
    """P(expert i is among a token's top_k) with Zipf popularity: k x p_i, capped at 1 with the excess spread over
    the others (water-filling), so the probabilities sum to top_k."""
    p = _zipf_probs(n_experts, zipf) * top_k
    for _ in range(n_experts):
        over = p > 1.0
        if not over.any():
            break
        excess = float((p[over] - 1.0).sum())
        p[over] = 1.0
        free = ~over & (p < 1.0)
        mass = float(p[free].sum())
        if mass > 0.0:
            p[free] += excess * p[free] / mass
        else:  # a skew so steep the tail underflowed to 0: the limit fills the next experts in rank order
            for i in np.flatnonzero(free):
                take = min(1.0 - p[i], excess)
                p[i] += take
                excess -= take
                if excess <= 0.0:
                    break
    return np.minimum(p, 1.0)


def expected_union(n_experts: int, top_k: int, batch: int, zipf: float = 0.0) -> float:
    """Expected number of distinct experts one layer reads when ``batch`` independent tokens each select top_k of
    n_experts (uniform: E (1 - (1 - k/E)^B)). Lock-step sequences are independent draws; the skew makes them
    overlap more."""
    if batch < 1:
        raise MoesimError("batch must be >= 1")
    q = selection_probs(n_experts, top_k, zipf)
    return float(np.sum(1.0 - (1.0 - q) ** batch))


# ---- the what-if ------------------------------------------------------------------------------------------------

def what_fits(p: CostParams, zipf: float = 0.0) -> tuple[float, float]:
    """Default hit fractions: VRAM and host RAM hold what fits (``p.vram_expert_slots`` and ``p.ram_expert_slots``,
    spread evenly over the MoE layers), each layer's most popular experts first. Returns (vram_hit, ram_hit) with
    ram_hit the fraction of VRAM misses found in host RAM. With zipf = 0 (uniform access) vram_hit is the fraction of
    expert bytes that fit in VRAM."""
    per_layer_v = p.vram_expert_slots / p.n_moe_layers
    per_layer_r = p.ram_expert_slots / p.n_moe_layers
    if p.placement == "layers":  # whole layers' experts in VRAM (llama.cpp --n-cpu-moe): no popularity order
        layers_v = min(p.n_moe_layers, p.vram_expert_slots // p.n_experts)
        cv = layers_v / p.n_moe_layers
        rest = p.n_moe_layers * p.n_experts - layers_v * p.n_experts
        slots_r = p.ram_expert_slots + (p.vram_expert_slots - layers_v * p.n_experts)
        return cv, (min(1.0, slots_r / rest) if rest else 0.0)
    cv = coverage(p.n_experts, per_layer_v, zipf)
    cr = coverage(p.n_experts, per_layer_v + per_layer_r, zipf)
    ram_hit = 0.0 if cv >= 1.0 else (cr - cv) / (1.0 - cv)
    return cv, ram_hit


def estimate(model, quant: str | None, hw, *, vram_hit: float | None = None, ram_hit: float | None = None,
             batch: int = 1, miss: str | None = None, dense: str = "auto", context: int = 0, zipf: float = 0.0,
             union: float | None = None, prefill_tokens: int = 0, engine: str | EngineProfile | None = None,
             cpu_moe_layers: int | None = None, speculative: int = 0, accept: float | None = None) -> dict:
    """Seconds per token with no trace: every MoE layer reads ``union`` distinct experts per step (batch 1: top_k;
    batch B: the expected union of B independent selections), a fraction ``vram_hit`` of them resident in VRAM, a
    fraction ``ram_hit`` of the rest in host RAM, the rest on NVMe. ``miss = fetch``: non-resident experts are copied
    to the GPU and run there; ``cpu``: they are computed by the CPU where they lie (llama.cpp's placement of
    experts in host memory); ``hybrid``: computed by the CPU for this use and uploaded into the cache in the
    background (the link's busy time bounds the step from below). Hit fractions left out default to what fits (see
    ``what_fits``); when host RAM left after the KV cache cannot hold a step's working set (the experts it reads from
    host memory), the default host hit fraction is 0: a recency-managed page cache is flushed by a scan larger than
    itself.

    ``engine`` (a profile name or object; None: the machine file's [engine], else ideal) fixes the miss mode when the
    engine has one (llama.cpp and ktransformers compute misses on the CPU, mixtral-offloading fetches them, the
    expert-cache llama.cpp builds are hybrid), adds its fixed per-layer and per-step costs, the hand-off of each
    CPU-resident MoE layer, the router read-back of every layer not wholly resident, per-copy latencies and per-fetch
    costs, write-back of evicted experts, its NVMe read size and whether CPU experts overlap GPU work.
    ``cpu_moe_layers`` = N is llama.cpp's ``--n-cpu-moe N``: the experts of N MoE layers stay in host memory and are
    computed by the CPU, the others are in VRAM (sets vram_hit = 1 - N / layers). On a machine without a GPU every
    expert is computed by the CPU from host memory.

    ``speculative`` = G with ``accept`` = A: each step verifies G + 1 tokens per sequence (reading the union of their
    experts: B (G + 1) selections) and yields 1 + A G of them (A: the fraction of drafted tokens accepted, as
    llama.cpp's "draft acceptance rate" reports it); tokens/s count the yielded tokens. The draft's own cost is not
    modelled."""
    if not (isinstance(zipf, (int, float)) and 0.0 <= zipf <= MAX_ZIPF):
        raise MoesimError(f"zipf exponent must be between 0 and {MAX_ZIPF:g} (got {zipf}); at {MAX_ZIPF:g} a layer's "
                          "top expert already takes all but 1e-6 of its requests")
    if isinstance(speculative, bool) or not isinstance(speculative, int) or speculative < 0:
        raise MoesimError(f"--speculative must be a whole number of drafted tokens >= 0 (got {speculative!r})")
    if accept is None:
        accept = 1.0 if speculative == 0 else None
        if accept is None:
            raise MoesimError("--speculative G needs --accept A, the fraction of drafted tokens accepted")
    if not (isinstance(accept, (int, float)) and math.isfinite(accept) and 0.0 <= accept <= 1.0):
        raise MoesimError(f"--accept must be a fraction in [0, 1] (got {accept})")
    e = engine_for(engine, hw)
    if miss is None:
        miss = e.miss if e.miss != "any" else "fetch"
    if miss not in MISS_MODES:
        raise MoesimError(f"unknown miss mode {miss!r} (known: {', '.join(MISS_MODES)})")
    if e.miss != "any" and miss != e.miss and not (cpu_moe_layers is not None and miss == "cpu"):
        what = {"cpu": "computes misses on the CPU", "fetch": "fetches misses",
                "hybrid": "computes misses on the CPU and uploads them"}[e.miss]
        raise MoesimError(f"engine {e.name} {what} (--miss {e.miss}); use --engine ideal for --miss {miss}")
    if miss == "hybrid" and e.miss == "any":
        raise MoesimError("--miss hybrid needs an engine that uploads CPU-computed misses (e.g. --engine "
                          "llama.cpp-expert-cache)")
    verified = speculative + 1  # tokens per sequence a step reads the experts of
    p = cost_params(model, quant, hw, context=context, dense=dense, batch=batch, engine=e)
    if not p.has_gpu:
        if vram_hit:
            raise MoesimError(f"{p.hw} has no GPU: --vram-hit must be 0 or left out")
        vram_hit, miss = 0.0, "cpu"
    if cpu_moe_layers is not None:
        if not 0 <= cpu_moe_layers <= p.n_moe_layers:
            raise MoesimError(f"--n-cpu-moe must be between 0 and {p.n_moe_layers} (got {cpu_moe_layers})")
        if vram_hit is not None:
            raise MoesimError("give --n-cpu-moe or --vram-hit, not both")
        vram_hit = 1.0 - cpu_moe_layers / p.n_moe_layers
        miss = "cpu"
    if union is None:
        union = expected_union(p.n_experts, p.top_k, batch * verified, zipf)
    elif not p.top_k <= union <= min(p.n_experts, p.top_k * batch * verified):
        raise MoesimError(f"union must be between top_k ({p.top_k}) and min(n_experts, top_k x batch x verified "
                          f"tokens) ({min(p.n_experts, p.top_k * batch * verified)}), got {union}")
    fit_v, fit_r = what_fits(p, zipf)
    defaults = []
    if vram_hit is None:
        vram_hit = fit_v
        defaults.append("vram_hit")
    for name, v in (("vram_hit", vram_hit), ("ram_hit", 0.0 if ram_hit is None else ram_hit)):
        if not (isinstance(v, (int, float)) and 0.0 <= v <= 1.0):
            raise MoesimError(f"{name} must be in [0, 1] (got {v})")
    bpe = p.bytes_per_expert
    # a step's working set in host memory: the experts it reads that are not in VRAM
    working_set = p.n_moe_layers * union * (1 - vram_hit) * bpe
    host_tier = (p.ram_expert_slots if "vram_hit" in defaults else p.ram_expert_capacity) * bpe
    thrash = working_set > host_tier and working_set > 0
    if ram_hit is None:
        if thrash:
            ram_hit = 0.0
        elif "vram_hit" in defaults:
            ram_hit = fit_r
        else:
            # a given VRAM hit fraction: host RAM holds as many of the other experts as it has room for
            rest = p.n_moe_layers * p.n_experts * (1.0 - vram_hit)
            ram_hit = 0.0 if rest <= 0 else min(1.0, p.ram_expert_capacity / rest)
        defaults.append("ram_hit")
    reads = p.n_moe_layers * union
    r_vram = reads * vram_hit
    r_ram = reads * (1 - vram_hit) * ram_hit
    r_nvme = reads * (1 - vram_hit) * (1 - ram_hit)

    t = {"dense": p.s_dense - p.s_token - p.s_swap + (batch - 1) * p.s_dense_per_seq,
         "expert_vram": r_vram * p.s_expert_vram}
    if p.s_token:
        t["token"] = p.s_token
    if p.s_swap:
        t["swap"] = p.s_swap
    by = {"vram": 0.0, "ram": 0.0, "nvme": 0.0, "link": 0.0, "cpu": 0.0}
    # dense bytes by where they are read
    w_gpu = p.dense_weight_bytes * p.dense_vram_fraction
    w_off = p.dense_weight_bytes - w_gpu
    state = p.dense_seq_bytes * batch
    by["vram"] += w_gpu + state * p.kv_vram_fraction
    by["nvme" if p.dense_placement == "nvme" else "ram"] += w_off
    by["cpu"] += w_off + state * (1 - p.kv_vram_fraction)
    by["ram"] += state * (1 - p.kv_vram_fraction)
    by["nvme"] += p.swap_bytes + p.dense_nvme_bytes
    by["vram"] += r_vram * bpe
    # every MoE layer not wholly resident reads its router's output back (whole layers on the host under layer
    # placement; under expert placement every layer, unless everything hits)
    host_share = (1.0 - vram_hit) if p.placement == "layers" else (1.0 if vram_hit < 1.0 else 0.0)
    if p.s_router_sync and host_share:
        t["router_sync"] = p.router_sync_seconds(p.n_moe_layers * host_share)
    link_busy = 0.0
    if miss == "fetch":
        t["fetch_ram"] = r_ram * p.s_fetch_ram
        t["fetch_nvme"] = r_nvme * p.s_fetch_nvme
        t["expert_vram"] += (r_ram + r_nvme) * p.s_expert_vram
        by["vram"] += (r_ram + r_nvme) * bpe
        by["ram"] += r_ram * bpe
        by["nvme"] += r_nvme * bpe
        if not p.unified:
            by["link"] += (r_ram + r_nvme) * bpe
        if p.s_writeback:  # each fetch into a full cache evicts one expert, copied back on the same stream
            t["writeback"] = (r_ram + r_nvme) * p.s_writeback
            by["link"] += (r_ram + r_nvme) * bpe
    else:
        t["cpu_ram"] = r_ram * p.s_expert_cpu
        t["cpu_nvme"] = r_nvme * p.s_expert_cpu_nvme
        by["ram"] += r_ram * bpe
        by["nvme"] += r_nvme * bpe
        by["cpu"] += (r_ram + r_nvme) * bpe
        if p.s_cpu_handoff and vram_hit < 1.0:
            # MoE layers with an expert on the CPU: whole layers under layer placement, else any of the step's reads
            share = 1.0 - vram_hit if p.placement == "layers" else 1.0 - vram_hit ** union
            t["cpu_handoff"] = p.n_moe_layers * share * p.s_cpu_handoff
        if p.cpu_overlap:
            # the CPU computes a layer's misses while the GPU runs its hits: the shorter side is hidden
            gpu, cpu = t["expert_vram"], t["cpu_ram"] + t["cpu_nvme"]
            t["cpu_overlap"] = -min(gpu, cpu)
        if miss == "hybrid" and not p.unified:
            # each miss is uploaded into the cache in the background (at most uploads_per_layer per layer per step),
            # read from host RAM where the CPU has just read it
            per_layer = union * (1 - vram_hit)
            if p.uploads_per_layer:
                per_layer = min(per_layer, float(p.uploads_per_layer))
            uploads = p.n_moe_layers * per_layer
            link_busy = uploads * p.s_copy_link
            by["link"] += uploads * bpe
            by["ram"] += uploads * bpe
    s_memory = sum(t.values())
    if link_busy > s_memory:  # the background uploads cannot all land within the step: the link sets its pace
        t["upload_wait"] = link_busy - s_memory
        s_memory = link_busy
    s_compute = p.decode_compute_floor(batch * verified) if p.dense_vram_fraction >= 1 else 0.0
    s_step = max(s_memory, s_compute)
    if not (math.isfinite(s_step) and s_step > 0):  # never print a nan or inf as a time
        raise MoesimError(f"the estimate is not a finite time ({s_step} s per step): check the model, machine and "
                          "options for extreme values")
    tokens = batch * (1 + accept * speculative)  # yielded per step

    m = model if isinstance(model, ModelPreset) else load_model_any(str(model))
    out = {
        "model": p.model, "quant": p.quant, "hw": p.hw, "engine": p.engine, "batch": batch, "miss": miss,
        "context": context,
        "dense_placement": p.dense_placement, "dense_vram_fraction": p.dense_vram_fraction,
        "vram_hit": vram_hit, "ram_hit": ram_hit, "defaults": defaults, "zipf": zipf,
        "what_fits": {"vram_expert_slots": p.vram_expert_slots, "ram_expert_slots": p.ram_expert_slots,
                      "total_experts": p.n_moe_layers * p.n_experts, "vram_hit": fit_v, "ram_hit": fit_r},
        "experts_read_per_layer": union,
        "reads_fraction": {"vram": vram_hit, "ram": (1 - vram_hit) * ram_hit,
                           "nvme": (1 - vram_hit) * (1 - ram_hit)},
        "memory": {"kv_bytes_per_seq": p.kv_bytes_per_seq, "kv_vram_fraction": p.kv_vram_fraction,
                   "kv_bytes_vram": p.kv_bytes_per_seq * batch * p.kv_vram_fraction,
                   "kv_bytes_host": p.kv_bytes_per_seq * batch * (1 - p.kv_vram_fraction),
                   "host_cache_bytes": p.host_cache_bytes, "working_set_bytes": working_set,
                   "thrash": bool(thrash), "swap_bytes": p.swap_bytes, "dense_nvme_bytes": p.dense_nvme_bytes},
        "speculative": {"drafted": speculative, "accept": accept, "verified_per_seq": verified,
                        "tokens_per_step": tokens},
        "s_per_step": s_step, "s_per_token": s_step / tokens, "tok_per_s": tokens / s_step,
        "tok_per_s_per_seq": tokens / batch / s_step,
        "bound": "compute" if s_compute > s_memory else "memory",
        "s_compute_floor": s_compute,
        "time_per_step": t,
        "link_busy_per_step": link_busy,
        "bytes_per_token": {k: v / tokens for k, v in by.items()},
        "bytes_per_step": by,
        "active_bytes_per_token": p.dense_bytes + p.n_moe_layers * p.top_k * bpe,
        "bytes_per_expert": bpe,
        "dense_bytes_per_token": p.dense_bytes,
        "model_file_bytes": m.file_bytes(p.quant),
        "cost_params": p.as_dict(),
    }
    if prefill_tokens:
        u = expected_union(p.n_experts, p.top_k, prefill_tokens, zipf) * p.n_moe_layers
        n_gpu = u * vram_hit
        s_pf = p.prefill_seconds(prefill_tokens, u, u * (1 - vram_hit) * ram_hit, u * (1 - vram_hit) * (1 - ram_hit))
        out["prefill"] = {"tokens": prefill_tokens, "experts_read": u, "experts_resident": n_gpu,
                          "seconds": s_pf, "tok_per_s": prefill_tokens / s_pf}
    return out
