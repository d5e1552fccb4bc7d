"""Engines' expert caches as plain Python, to write realized-behaviour logs from a routing for verify's tests.

``llama_moecache_log`` follows src/llama-moecache.cpp of ggml-org/llama.cpp PR #27861 (as carried by the
forks that include it): per decode step the graph observes each cached layer's selected ids (a resident
expert is a hit and refreshes its slot's clock; a missing one is a miss, remembered once unless its
upload is in flight); then ``llama_moe_cache_step`` publishes the uploads the worker finished (which
were queued at the previous step), and queues up to ``max_inserts`` of each layer's misses, the last
observed first, each into an empty slot or the least recently used slot with no upload in flight
(evicted at once). Every 512 steps it prints the line verify reads.
"""

from __future__ import annotations

import numpy as np


def llama_moecache_log(sel: np.ndarray, n_experts: int, n_slots: int, max_inserts: int = 2, *,
                       layers=None, device_mib: float = 100.0) -> str:
    """``sel`` [steps, L, k]: the decode steps' selections, rank order."""
    T, L, k = sel.shape
    slot_expert = np.full((L, n_slots), -1)
    expert_slot = np.full((L, n_experts), -1)
    last_use = np.zeros((L, n_slots), np.int64)
    slot_busy = np.zeros((L, n_slots), bool)
    expert_busy = np.zeros((L, n_experts), bool)
    hits = misses = clock = 0
    done: list[tuple[int, int, int]] = []
    lines = [f"llama_moe_cache_init: MoE expert cache enabled: {L} layers x {n_slots} slots, {max_inserts} "
             f"inserts/step, {device_mib:.1f} MiB device memory"]
    for t in range(T):
        pending: list[list[int]] = [[] for _ in range(L)]
        for li in range(L):  # the graph: moe_obs_cb per layer
            for e in sel[t, li]:
                e = int(e)
                s = expert_slot[li, e]
                if s >= 0:
                    hits += 1
                    clock += 1
                    last_use[li, s] = clock
                else:
                    misses += 1
                    if not expert_busy[li, e] and e not in pending[li]:
                        pending[li].append(e)
        for li, e, s in done:  # llama_moe_cache_step: publish what the worker finished
            slot_expert[li, s], expert_slot[li, e] = e, s
            clock += 1
            last_use[li, s] = clock
            slot_busy[li, s] = expert_busy[li, e] = False
        done = []
        for li in range(L):
            budget = max_inserts
            for e in reversed(pending[li]):
                if budget <= 0:
                    break
                if expert_slot[li, e] >= 0 or expert_busy[li, e]:
                    continue
                free = np.flatnonzero((slot_expert[li] < 0) & ~slot_busy[li])
                if len(free):
                    s = int(free[0])
                else:
                    cand = np.flatnonzero(~slot_busy[li])
                    if not len(cand):
                        break
                    s = int(cand[np.argmin(last_use[li, cand])])
                victim = slot_expert[li, s]
                if victim >= 0:
                    expert_slot[li, victim] = -1
                    slot_expert[li, s] = -1
                slot_busy[li, s] = expert_busy[li, e] = True
                done.append((li, e, s))  # the worker copies it during the next step's graph
                budget -= 1
        if (t + 1) % 512 == 0:
            lines.append(f"0.{t:03d}.000 D moe-cache: steps={t + 1} hits={hits} misses={misses} "
                         f"hit-rate={100.0 * hits / (hits + misses):.1f}%")
    return "\n".join(lines) + "\n"
