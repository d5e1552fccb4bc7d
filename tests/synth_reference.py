"""Generator 2's random bits and layer coupling read off their definitions (docs/synthetic.md), in plain
numpy: the tests' reference for the kernel (traces/synth_kernel.py), which never materializes them."""

from __future__ import annotations

import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer (uint64 arithmetic wraps, as in C)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def predecessors(order: np.ndarray) -> np.ndarray:
    """pred [L, E]: expert e at layer l >= 1 is the successor of expert pred[l, e] at layer l - 1, the
    expert of the same popularity rank (order [L, E]: rank -> expert, synthetic.coupling_order)."""
    L, E = order.shape
    pred = np.zeros((L, E), np.int32)
    for lay in range(1, L):
        pred[lay, order[lay]] = order[lay - 1]
    return pred


def linked_bits(key: int, t0: int, c: int, pred: np.ndarray, link16: int) -> np.ndarray:
    """The random bits of tokens t0 .. t0 + c - 1 ([c, L, E] uint32: 16 bits of the normal, then 16 of the
    Gumbel). The draw of (t, l, e) is splitmix64 of key + ((t * L + l) * E + e) * golden; with probability
    link16 / 65536 (its low 16 bits decide) the bits of (t, l >= 1, e) are those of (t, l - 1, pred[l, e])."""
    L, E = pred.shape
    out = np.empty((c, L, E), np.uint32)
    e = np.arange(E, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i in range(c):
            for lay in range(L):
                x = _mix(np.uint64(key) + np.uint64(((t0 + i) * L + lay) * E) * GOLDEN + e * GOLDEN)
                own = (((x >> np.uint64(16)) & np.uint64(0xFFFF)) | ((x >> np.uint64(48)) << np.uint64(16)))
                out[i, lay] = own.astype(np.uint32)
                if lay > 0:
                    linked = (x & np.uint64(0xFFFF)) < np.uint64(link16)
                    out[i, lay] = np.where(linked, out[i, lay - 1][pred[lay]], out[i, lay])
    return out
