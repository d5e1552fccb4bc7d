"""Background copies on the host-to-GPU link (admissions under --admit, and prefetches): each layer's FIFO
of queued copies (State.queue, queue_t, queue_hl), and their landing at that layer's first step after they
complete (docs/replay-semantics.md: "Background admission", "Prefetch")."""

from numba import njit

from moesim.jitcache import cached_njit
from moesim.policies.hooks import NOT_ADMITTED
from moesim.policies.structures import ACC, QUEUED, RES
from moesim.simulator.counters import COPIES, COPIES_NVME, S_COPY_NVME, S_COPY_RAM
from moesim.simulator.host_ram import from_nvme
from moesim.simulator.prefetch_state import PF_INFLIGHT, PF_LANDED, PF_NONE, PF_STALE


@cached_njit(_nrt=False)
def enqueue(o, l, done, ob, queue, queue_t, qhl):
    """Queue a background copy of o (layer l) that completes at ``done``."""
    E = queue.shape[1]
    ob[o, QUEUED] = 1
    q = (qhl[l, 0] + qhl[l, 1]) % E
    queue[l, q] = o
    queue_t[l, q] = done
    qhl[l, 1] += 1


@njit(inline="always")
def queue_copy(o, l, nvme, now, link_free, cost, timed, ob, queue, queue_t, qhl):
    """A background copy (admission or prefetch) takes the link after what is queued on it, from now on;
    returns when the link is free (= when o lands)."""
    if timed:
        link_free = max(now, link_free) + (cost[S_COPY_NVME] if nvme else cost[S_COPY_RAM])
    enqueue(o, l, link_free, ob, queue, queue_t, qhl)
    return link_free


@cached_njit(_nrt=False)
def start_copy(o, l, now, link_free, cost, timed, tiered, ram, ob, fo, po, queue, queue_t, qhl, tok_counts,
               layer_counts, t, counting):
    """Queue a background copy of o (its accumulator reached beta): it occupies the link after what is queued
    on it. Returns when the link is free."""
    fo[o, ACC] = 0.0
    tok_counts[COPIES, t] += 1
    if counting:
        layer_counts[l, COPIES] += 1
    nvme = tiered and from_nvme(o, ram, ob, po)
    if nvme:
        tok_counts[COPIES_NVME, t] += 1
        if counting:
            layer_counts[l, COPIES_NVME] += 1
    return queue_copy(o, l, nvme, now, link_free, cost, timed, ob, queue, queue_t, qhl)


@cached_njit(_nrt=False)
def upload(o, l, now, link_free, cost, timed, ob, queue, queue_t, qhl, tok_counts, layer_counts, t, counting):
    """A hybrid miss's background upload of o from host RAM (the CPU has just read it there), queued on the link
    at ``now`` and admitted when it lands. Returns when the link is free."""
    tok_counts[COPIES, t] += 1
    if counting:
        layer_counts[l, COPIES] += 1
    return queue_copy(o, l, False, now, link_free, cost, timed, ob, queue, queue_t, qhl)


@cached_njit(_nrt=False)
def land(insert, prm, pool, l, tick0, now, link_free, s_writeback, ob, fo, po, heap, queue, queue_t, qhl, pf):
    """Admit layer l's background copies and prefetches that completed by ``now`` (in queue order, at the
    step's first ticks) through the policy's insert hook. Returns (admissions, evictions, when the link
    is free). ``pf``: the prefetch states (empty without prefetch)."""
    E = queue.shape[1]
    n_admit = 0
    n_evict = 0
    i = 0
    prefetching = pf.shape[0] > 0
    while qhl[l, 1] > 0 and queue_t[l, qhl[l, 0]] <= now:
        o = queue[l, qhl[l, 0]]
        qhl[l, 0] = (qhl[l, 0] + 1) % E
        qhl[l, 1] -= 1
        ob[o, QUEUED] = 0
        fetched = False  # a prefetch: admitted but not an admission
        if prefetching:
            st = pf[o]
            pf[o] = PF_NONE
            if st == PF_STALE:
                continue  # already served to a request that waited for it
            fetched = st == PF_INFLIGHT
        if ob[o, RES] == 0:
            v = insert(ob, fo, po, heap, prm, pool, o, tick0 + i)
            if v != NOT_ADMITTED:
                if fetched:
                    pf[o] = PF_LANDED
                else:
                    n_admit += 1
            if v >= 0:
                n_evict += 1
                if s_writeback != 0.0:
                    link_free = max(now, link_free) + s_writeback
            i += 1
    return n_admit, n_evict, link_free
