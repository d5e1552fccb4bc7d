"""A re-pinning placement's pin events (repin, static-domain: policies/repin.py, policies/static_domain.py), applied
by the kernels at the start of their token: an expert swapped out is evicted, one swapped in is uploaded, a copy
over the link the token waits for (host RAM or NVMe, priced as a fetch's copy), counted as a copy and an admission.
Shared by the plain and ext kernels (compiled once)."""

from moesim.jitcache import cached_njit
from moesim.policies.structures import RES
from moesim.simulator.counters import ADMISSIONS, COPIES, COPIES_NVME, EVICTIONS
from moesim.simulator.host_ram import from_nvme


@cached_njit(_nrt=False)
def first_event(ev, t0):
    """The index of the first event at token t0 or later (a streamed chunk starts there)."""
    i = 0
    while i < ev.shape[0] and ev[i, 0] < t0:
        i += 1
    return i


@cached_njit(_nrt=False)
def apply(ev, i, tg, t, E, ob, po, ram, tiered, counting, tok_counts, layer_counts, timed, s_fetch_ram,
          s_fetch_nvme, s_writeback, now, link_free, stall):
    """Apply the events of token tg (from index i on); returns (next index, now, link_free, stall)."""
    while i < ev.shape[0] and ev[i, 0] == tg:
        o = ev[i, 1]
        l = o // E
        if ev[i, 2] < 0:
            ob[o, RES] = 0
            tok_counts[EVICTIONS, t] += 1
            if counting:
                layer_counts[l, EVICTIONS] += 1
            if timed:
                link_free = max(now, link_free) + s_writeback
        else:
            ob[o, RES] = 1
            nvme = tiered and from_nvme(o, ram, ob, po)
            tok_counts[COPIES, t] += 1
            tok_counts[ADMISSIONS, t] += 1
            if nvme:
                tok_counts[COPIES_NVME, t] += 1
            if counting:
                layer_counts[l, COPIES] += 1
                layer_counts[l, ADMISSIONS] += 1
                if nvme:
                    layer_counts[l, COPIES_NVME] += 1
            if timed:  # the upload waits for the link, the token for the upload
                start = max(now, link_free)
                stall += start - now
                link_free = start + (s_fetch_nvme if nvme else s_fetch_ram)
                now = link_free
        i += 1
    return i, now, link_free, stall
