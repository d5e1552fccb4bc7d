"""The overlapped clock (--overlap layer | cross-layer): two timelines, the GPU and the host-to-GPU link.

Under overlap a step's copies are all issued at its router decision (``t_r``, after its dense work) onto
the link in rank order; the GPU first runs the step's resident work (hits, substitutes, CPU experts and the
CPU hand-off: the kernel accumulates it in ``now``), then each link-dependent expert (a fetch, or a request
served by a prefetch still in flight) in rank order, each as soon as its copy has landed and the GPU is free.
The step's own fetches land in rank order (one link, issued back to back), so for them this is landing
order; a prefetch still in flight was issued before them and lands first. The step's end is
max(resident end + m x s_vram, H), where H chains max(H, landing) + s_vram over the m link-dependent experts.

A step's stall is what other traffic on the link (background copies, prefetches, write-backs, and the wait
for a prefetch still in flight) adds to its end: the end minus the end it would have with the link carrying
only its own fetches, issued at ``t_r`` back to back (``lk0``, ``h0``). docs/replay-semantics.md states it.
"""

from numba import njit

NEG = -1.0e300  # "no landing yet" (a chain's start)


@njit(inline="always")
def fetch(t_r, link_free, copy, s_vram, h, lk0, h0, m):
    """A demand fetch under overlap: its copy queues on the link behind what is there (at the earliest at
    the router decision), its compute follows its landing. Returns (link_free, h, lk0, h0, m)."""
    link_free = max(t_r, link_free) + copy
    lk0 = lk0 + copy
    return link_free, max(h, link_free) + s_vram, lk0, max(h0, lk0) + s_vram, m + 1


@njit(inline="always")
def finish(mode, now, m, s_vram, h, h0, link_free, stall):
    """The step's end and its stall under overlap ``mode`` (1 layer: the link is synchronized at the end
    of every layer, so every copy issued during the step has landed; 2 cross-layer: copies run on)."""
    ready = now + m * s_vram
    end = max(ready, h)
    if mode == 1:
        end = max(end, link_free)
    return end, stall + end - max(ready, h0)
