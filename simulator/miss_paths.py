"""The ext kernel's rarer per-request paths, called out of line: a substitution, a low-bit run (from the
resident low-bit tier, or a low-bit copy over the link), an admission under the engine's step semantics,
the step's pinned hits, and the synchronous copy's clock."""

from numba import njit

from moesim.jitcache import cached_njit
from moesim.policies.hooks import NOT_ADMITTED
from moesim.policies.miss import OUTCOME_DROP, OUTCOME_HIT, OUTCOME_SUBSTITUTE, SUBSTITUTE
from moesim.policies.structures import ACC, MARK, NREQ, QUEUED, RES, SCORE
from moesim.simulator import step_pin as pin
from moesim.simulator.copyqueue import start_copy
from moesim.simulator.counters import (
    CAPPED,
    CPU,
    CPU_NVME,
    DROPS,
    FIRST_CHOICE_SUBS,
    LOWBIT,
    LOWBIT_TIER,
    PIN_FULL,
    S_EXPERT_VRAM,
    S_FETCH_LOWBIT,
    S_LOWBIT_VRAM,
    SUBSTITUTIONS,
)
from moesim.simulator.host_ram import from_nvme


@njit(inline="always")
def layer_cold(ob, base, E):
    """Is some expert of the layer (objects base .. base + E - 1) not resident? Then an engine reads the router's
    output back to the host before the step's experts (the router read-back, cost router_sync)."""
    for e in range(E):
        if ob[base + e, RES] == 0:
            return True
    return False


@njit(inline="always")
def sync_fetch(now, link_free, copy_end, stall, s_link, s_run):
    """A copy the step waits for: it takes the link behind what is queued there, from ``copy_end`` on (the time
    waited is stall), then the expert runs. Returns (now, link_free, copy_end, stall)."""
    start = max(copy_end, link_free)
    stall += start - copy_end
    link_free = start + s_link
    return max(now, link_free) + s_run, link_free, link_free, stall


@cached_njit(_nrt=False)
def substitute(hit, prm, pool, cand, t, l, base, step, tick, ob, fo, po, heap):
    """The best-scored resident candidate not selected and not yet run at this step, run in place of a miss
    (marked, and used through the policy's ``hit`` hook); -1 when there is none."""
    for j in range(cand.shape[2]):
        c = base + cand[t, l, j]
        if c >= base and ob[c, RES] != 0 and fo[c, MARK] != step:
            fo[c, MARK] = step
            hit(ob, fo, po, heap, prm, pool, c, tick, False)
            return c
    return -1


@cached_njit(_nrt=False)
def accumulate(o, l, wr, now, link_free, cost, timed, tiered, ram, beta, ob, fo, po, queue, queue_t, qhl,
               tok_counts, layer_counts, t, counting):
    """--admit: a substituted, dropped or low-bit expert's gate weight accumulates; at beta (and no copy of it
    queued) a background copy of the full expert is queued. Returns when the link is free."""
    fo[o, ACC] += wr
    if fo[o, ACC] >= beta and ob[o, QUEUED] == 0:
        link_free = start_copy(o, l, now, link_free, cost, timed, tiered, ram, ob, fo, po, queue, queue_t, qhl,
                               tok_counts, layer_counts, t, counting)
    return link_free


@njit(inline="always")
def _bump(tok_counts, layer_counts, t, l, c, counting):
    tok_counts[c, t] += 1
    if counting:
        layer_counts[l, c] += 1


@cached_njit(_nrt=False)
def tier_run(o, l, wr, now, link_free, cost, timed, tiered, ram, copies, beta, ob, fo, po, queue, queue_t, qhl,
             tok_counts, layer_counts, t, counting):
    """A miss served by the expert's resident low-bit copy (no transfer); with --admit its weight accumulates
    towards a background copy of the full expert. Returns when the link is free."""
    _bump(tok_counts, layer_counts, t, l, LOWBIT, counting)
    _bump(tok_counts, layer_counts, t, l, LOWBIT_TIER, counting)
    if copies:
        link_free = accumulate(o, l, wr, now, link_free, cost, timed, tiered, ram, beta, ob, fo, po, queue, queue_t,
                               qhl, tok_counts, layer_counts, t, counting)
    return link_free


@cached_njit(_nrt=False)
def lowbit_fetch(o, l, wr, now, link_free, copy_end, stall, cost, timed, tiered, ram, copies, beta, ob, fo, po, queue,
                 queue_t, qhl, tok_counts, layer_counts, t, counting):
    """lowbit:Q: copy the expert's low-bit copy (behind what is queued on the link, after ``copy_end``) and run
    it; not admitted; with --admit its weight accumulates towards a background copy of the full expert.
    Returns (now, link_free, copy_end, stall)."""
    _bump(tok_counts, layer_counts, t, l, LOWBIT, counting)
    if timed:
        now, link_free, copy_end, stall = sync_fetch(now, link_free, copy_end, stall, cost[S_FETCH_LOWBIT],
                                                     cost[S_LOWBIT_VRAM])
    if copies:
        link_free = accumulate(o, l, wr, now, link_free, cost, timed, tiered, ram, beta, ob, fo, po, queue, queue_t,
                               qhl, tok_counts, layer_counts, t, counting)
    return now, link_free, copy_end, stall


@cached_njit(_nrt=False)
def admit_engine(insert, pin_mode, prm, pool, o, tick, step, n_up, max_up, step_pin, ob, fo, po, heap, spin,
                 tok_counts, layer_counts, t, l, counting):
    """Admit a fetched expert through the policy's ``insert`` hook under --max-uploads (beyond the cap: for this
    use only, counted as capped) and --step-pin (no pinned victim; none left: pin_full). Returns (victim or a
    negative code, uploads so far)."""
    if max_up > 0 and n_up >= max_up:
        _bump(tok_counts, layer_counts, t, l, CAPPED, counting)
        return NOT_ADMITTED, n_up
    if step_pin:
        v = pin.insert(insert, pin_mode, prm, pool, o, tick, step, ob, fo, po, heap, spin)
    else:
        v = insert(ob, fo, po, heap, prm, pool, o, tick)
    if v == pin.PIN_FULL:
        _bump(tok_counts, layer_counts, t, l, PIN_FULL, counting)
    elif v != NOT_ADMITTED:
        n_up += 1
    return v, n_up


@cached_njit(_nrt=False)
def pinned_hits(hit, prm, pool, row, row_next, t, l, base, tick1, uses_next, uses_score, inc, timed, s_vram, now,
                record, ob, fo, po, heap, outcome):
    """--step-pin: the step's hits, before its misses, in rank order (ticks tick1, tick1 + 1, ...), through the
    policy's ``hit`` hook. Returns (hits, now)."""
    n = 0
    for r in range(row.shape[0]):
        e = row[r]
        if e < 0 or ob[base + e, RES] == 0:
            continue
        o = base + e
        if uses_next and row_next[r] >= 0:
            fo[o, NREQ] = row_next[r]
        if uses_score:
            fo[o, SCORE] += inc
        hit(ob, fo, po, heap, prm, pool, o, tick1 + n, True)
        n += 1
        if timed:
            now += s_vram
        if record:
            outcome[t, l, r] = OUTCOME_HIT
    return n, now


@cached_njit(_nrt=False)
def cpu_run(o, l, t, now, timed, tiered, ram, s_cpu_ram, s_cpu_nvme, ob, po, tok_counts, layer_counts, counting):
    """A miss computed on the CPU from host memory (from NVMe first when not in the host-RAM tier). Returns now."""
    _bump(tok_counts, layer_counts, t, l, CPU, counting)
    nvme = tiered and from_nvme(o, ram, ob, po)
    if nvme:
        _bump(tok_counts, layer_counts, t, l, CPU_NVME, counting)
    if timed:
        now += s_cpu_nvme if nvme else s_cpu_ram
    return now


@cached_njit(_nrt=False)
def lose(hit, action, r, o, wr, wm, prm, pool, cand, t, l, base, step, tick, t_r, ov, now, link_free, cost, timed,
         tiered, ram, copies, beta, ob, fo, po, heap, queue, queue_t, qhl, tok_counts, layer_counts, counting, record,
         outcome, substituted):
    """A miss the step loses: substituted (``action`` SUBSTITUTE and a resident candidate found: it runs in its place
    through the policy's ``hit``) or dropped. With --admit its weight ``wr`` accumulates towards a background copy.
    Returns (the gate mass lost, now, link_free)."""
    sub = -1
    if action == SUBSTITUTE:
        sub = substitute(hit, prm, pool, cand, t, l, base, step, tick, ob, fo, po, heap)
    if sub >= 0:
        _bump(tok_counts, layer_counts, t, l, SUBSTITUTIONS, counting)
        if timed:
            now += cost[S_EXPERT_VRAM]
        if record:
            outcome[t, l, r] = OUTCOME_SUBSTITUTE
            substituted[t, l, r] = sub - base
    else:
        _bump(tok_counts, layer_counts, t, l, DROPS, counting)
        if record:
            outcome[t, l, r] = OUTCOME_DROP
    if r == 0:
        _bump(tok_counts, layer_counts, t, l, FIRST_CHOICE_SUBS, counting)
    if copies:
        link_free = accumulate(o, l, wr, t_r if ov else now, link_free, cost, timed, tiered, ram, beta, ob, fo, po,
                               queue, queue_t, qhl, tok_counts, layer_counts, t, counting)
    return wm, now, link_free
