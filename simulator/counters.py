"""The replay's counters, its seconds-per-operation vector and the scalars carried between kernel calls:
names and column indices, shared by the kernels, the argument builder and the results (no numba here)."""

# counter columns (per layer and per token)
COUNTER_NAMES = ("requests", "hits", "misses", "fetches", "substitutions", "drops", "cpu", "admissions",
                 "first_choice_substitutions", "evictions", "fetches_nvme", "cpu_nvme", "copies", "copies_nvme",
                 "prefetches", "prefetch_used", "prefetch_late", "prefetches_nvme", "lowbit", "capped", "pin_full",
                 "lowbit_tier", "rerouted", "first_choice_changed")
(REQUESTS, HITS, MISSES, FETCHES, SUBSTITUTIONS, DROPS, CPU, ADMISSIONS, FIRST_CHOICE_SUBS, EVICTIONS,
 FETCHES_NVME, CPU_NVME, COPIES, COPIES_NVME, PREFETCHES, PREFETCH_USED, PREFETCH_LATE,
 PREFETCHES_NVME, LOWBIT, CAPPED, PIN_FULL, LOWBIT_TIER, REROUTED, FIRST_CHOICE_CHANGED) = range(len(COUNTER_NAMES))
N_COUNTERS = len(COUNTER_NAMES)

# cost columns: seconds per operation (simulator/args.py kernel_costs); all zero replays without a clock
COST_NAMES = ("dense_layer", "expert_vram", "fetch_ram", "fetch_nvme", "cpu_ram", "cpu_nvme", "copy_ram",
              "copy_nvme", "cpu_handoff", "writeback", "fetch_lowbit", "lowbit_vram", "router_sync")
(S_DENSE_LAYER, S_EXPERT_VRAM, S_FETCH_RAM, S_FETCH_NVME, S_CPU_RAM, S_CPU_NVME, S_COPY_RAM, S_COPY_NVME,
 S_CPU_HANDOFF, S_WRITEBACK, S_FETCH_LOWBIT, S_LOWBIT_VRAM, S_ROUTER_SYNC) = range(len(COST_NAMES))
N_COSTS = len(COST_NAMES)

# The scalars a replay carries from one kernel call to the next (State.clock, State.scal): a streamed
# replay calls the kernel once per chunk of tokens with the same state arrays, so everything a token
# depends on from earlier tokens lives in the state, never in a kernel's locals.
NOW, LINK_FREE = range(2)       # clock: simulated seconds; when the host-to-GPU link finishes its queue
PREV_SEQ, DECAY_BASE = range(2)  # scal: the last replayed token's sequence; the token decay counts from
N_CLOCK = N_SCAL = 2

RESCALE = 1e150  # decayed frequency scores are rescaled before they overflow
