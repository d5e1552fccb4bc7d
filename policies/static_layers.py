"""llama.cpp's expert placement: every expert of some layers in VRAM, the rest on
the CPU. `--n-cpu-moe N` (or an `-ot` pattern) keeps the stacked expert tensors of
the first N layers in host memory, so placement is per layer, not per expert. With
the same VRAM as `slots` per layer, the last floor(slots * L / E) layers are pinned
whole; nothing is ever evicted or admitted."""

import numpy as np

NAME = "static-layers"
DOC = "llama.cpp --n-cpu-moe placement: all experts of the last floor(slots*L/E) layers pinned, the rest never cached"
IN_DEFAULT_GRID = False  # the llama.cpp preset of the sweep


def pinned(counts: np.ndarray, slots: int, allocation: str) -> np.ndarray:
    L, E = counts.shape
    n = min(L, slots * L // E)
    return np.arange((L - n) * E, L * E, dtype=np.int64)
