"""The replay kernel: one numba loop over (token, layer, rank) for one policy config.

It only computes on arrays (no I/O, no Python objects); policies arrive as plain
int codes (policies/registry.py, policies/miss.py). The public entry point that
validates and converts is simulator.driver.simulate. The semantics are in
docs/replay-semantics.md; tests/reference_replay.py is the slow reference this
kernel must match count for count.
"""

import numpy as np
from numba import njit

from moesim.policies import miss
from moesim.policies.registry import priority
from moesim.simulator.structures import (ACC, CAP, CNT, HBASE, HEAD, HK1, HK2, HOBJ, HPOS, HSIZE, MARK,
                                         N_COUNTERS, NREQ, QUEUED, RES, RNXT, RPRV, RRES, SCORE, SIZE, TAIL,
                                         heap_fix, list_push_front, list_unlink)

# counter columns (per layer and per token)
(REQUESTS, HITS, MISSES, FETCHES, SUBSTITUTIONS, DROPS, CPU, ADMISSIONS, FIRST_CHOICE_SUBS, EVICTIONS,
 FETCHES_NVME, CPU_NVME, COPIES, COPIES_NVME) = range(14)
COUNTER_NAMES = ("requests", "hits", "misses", "fetches", "substitutions", "drops", "cpu", "admissions",
                 "first_choice_substitutions", "evictions", "fetches_nvme", "cpu_nvme", "copies", "copies_nvme")
# cost columns: seconds per operation (costmodel.timing.CostParams); all zero replays without a clock
(S_DENSE_LAYER, S_EXPERT_VRAM, S_FETCH_RAM, S_FETCH_NVME, S_CPU_RAM, S_CPU_NVME, S_COPY_RAM,
 S_COPY_NVME) = range(8)
N_COSTS = 8

LIST, HEAP, NONE = 0, 1, 2
NEVER = np.int64(1) << np.int64(62)  # next-use tick of an expert never requested again
_RESCALE = 1e150  # decayed frequency scores are rescaled before they overflow


@njit(cache=True)
def next_use_ticks(sel, n_experts):
    """For each request, the tick of the same (layer, expert)'s next request (NEVER if
    none); and each object's first request tick. Step s = token * L + layer owns the
    ticks [s(E+k), (s+1)(E+k)): its background admissions take s(E+k) + i, its requests
    s(E+k) + E + rank, so ticks order every event of the replay."""
    T, L, k = sel.shape
    nxt = np.full((T, L, k), NEVER, np.int64)
    last = np.full(L * n_experts, NEVER, np.int64)
    for t in range(T - 1, -1, -1):
        for l in range(L - 1, -1, -1):
            for r in range(k - 1, -1, -1):
                if sel[t, l, r] < 0:
                    continue
                o = l * n_experts + sel[t, l, r]
                nxt[t, l, r] = last[o]
                last[o] = (t * L + l) * (n_experts + k) + n_experts + r
    return nxt, last


@njit(cache=True)
def request_counts(sel, n_experts, n_tokens):
    """Router requests per (layer, expert) over the first n_tokens tokens, flattened."""
    T, L, k = sel.shape
    out = np.zeros(L * n_experts, np.int64)
    for t in range(min(T, n_tokens)):
        for l in range(L):
            for r in range(k):
                if sel[t, l, r] >= 0:
                    out[l * n_experts + sel[t, l, r]] += 1
    return out


# The replay kernel and its helpers are compiled without NRT (the driver allocates
# every array): with NRT, each use of an array in an inlined helper or each call
# increfs and decrefs it atomically, which made replay ~10x slower.
@njit(_nrt=False)
def _admit(structure, evict_code, pool, o, tick, ob, fo, po, heap):
    """Make o resident in its pool, evicting the policy's victim when the pool is full.
    Returns the victim, or -1."""
    v = -1
    full = po[pool, SIZE] >= po[pool, CAP]
    ob[o, RES] = 1
    ob[o, CNT] = 1
    if structure == LIST:
        if full:
            v = po[pool, TAIL]
            list_unlink(ob, po, pool, v)
        list_push_front(ob, po, pool, o)
    else:
        base = po[pool, HBASE]
        if full:  # o takes the root's place (the victim), then sinks
            j = base
            v = np.int64(heap[j, HOBJ])
            ob[v, HPOS] = -1
        else:
            j = base + po[pool, HSIZE]
            po[pool, HSIZE] += 1
        heap[j, HK1] = priority(evict_code, 1, fo[o, SCORE], ob[o, NREQ])
        heap[j, HK2] = tick
        heap[j, HOBJ] = o
        heap_fix(ob, po, heap, pool, j - base)
    if full:
        ob[v, RES] = 0
        ob[v, CNT] = 0
    else:
        po[pool, SIZE] += 1
    return v


@njit(inline="always")
def _touch(structure, move_on_access, evict_code, pool, o, tick, ob, fo, po, heap):
    """A use of resident o (a hit, or a run as a substitute) refreshes its place."""
    if structure == LIST:
        if move_on_access and po[pool, HEAD] != o:
            list_unlink(ob, po, pool, o)
            list_push_front(ob, po, pool, o)
    elif structure == HEAP:
        j = po[pool, HBASE] + ob[o, HPOS]
        heap[j, HK1] = priority(evict_code, ob[o, CNT], fo[o, SCORE], ob[o, NREQ])
        heap[j, HK2] = tick
        heap_fix(ob, po, heap, pool, ob[o, HPOS])


@njit(_nrt=False)
def _from_nvme(o, ram, ob, po):
    """Read o from host memory: True when it must first come from NVMe (a host-RAM tier
    miss, which then caches it, evicting the least recently used)."""
    if po[ram, CAP] < 0:
        return False  # every expert fits in host RAM
    if po[ram, CAP] == 0:
        return True  # no host RAM to spare: every read streams from NVMe
    if ob[o, RRES] != 0:
        if po[ram, HEAD] != o:
            list_unlink(ob, po, ram, o, RPRV, RNXT)
            list_push_front(ob, po, ram, o, RPRV, RNXT)
        return False
    if po[ram, SIZE] >= po[ram, CAP]:
        v = po[ram, TAIL]
        list_unlink(ob, po, ram, v, RPRV, RNXT)
        ob[v, RRES] = 0
    else:
        po[ram, SIZE] += 1
    ob[o, RRES] = 1
    list_push_front(ob, po, ram, o, RPRV, RNXT)
    return True


@njit(_nrt=False)
def _reset(structure, evict_code, pinned, warm_objs, ram_warm, pool_of_layer, E, ob, fo, po, heap, qhl):
    """Empty every pool and copy queue, then pin the static set or pre-fill the warm
    set; the host-RAM tier starts with ram_warm (least recently used first)."""
    for o in range(ob.shape[0]):
        ob[o, RES] = 1 if pinned[o] else 0
        ob[o, HPOS] = -1
        ob[o, CNT] = 0
        ob[o, QUEUED] = 0
        ob[o, RRES] = 0
        fo[o, SCORE] = 0.0
        fo[o, ACC] = 0.0
    for p in range(po.shape[0]):
        po[p, SIZE] = 0
        po[p, HEAD] = -1
        po[p, TAIL] = -1
        po[p, HSIZE] = 0
    for l in range(qhl.shape[0]):
        qhl[l, 0] = 0
        qhl[l, 1] = 0
    nw = warm_objs.shape[0]
    for i in range(nw):
        o = warm_objs[i]
        _admit(structure, evict_code, pool_of_layer[o // E], o, -2 * (nw - i) - 1, ob, fo, po, heap)
    ram = po.shape[0] - 1
    for i in range(ram_warm.shape[0]):
        _from_nvme(ram_warm[i], ram, ob, po)


@njit(cache=True, _nrt=False)
def replay(sel, w, wm, cand, next_tick, first_tick, tok_seq,
           evict_code, structure, move_on_access, uses_score, uses_next, miss_code, theta, beta,
           pool_of_layer, pinned, warm_objs, ram_warm, cost, half_life, warmup_tokens, reset_per_seq,
           ob, fo, po, heap, queue, queue_t, qhl, sc,
           layer_counts, layer_mass, tok_counts, tok_mass, tok_seconds, tok_stall, record, rec_outcome, rec_sub):
    """Replay every (token, layer) step; add counters into layer_counts/layer_mass
    (tokens from warmup_tokens on) and tok_counts/tok_mass/tok_seconds/tok_stall
    (every token). sel entries < 0 are padding (batched routing). w: the weights the
    miss policy reads; wm: the gate mass a substitution or drop loses.
    cost: seconds per operation (S_* columns; all zero for a replay without a clock).
    uses_score / uses_next: the eviction's priority reads the request score / the next
    request, so the kernel keeps it up to date.
    ob/fo/po/heap/queue/queue_t/qhl/sc: state and scratch (structures.new_state).
    record: write each request's outcome (miss.OUTCOME_*) into rec_outcome [T, L, k] and the
    substitute run in its place into rec_sub [T, L, k] (both pre-filled with -1)."""
    T, L, k = sel.shape
    M = cand.shape[2]
    n_obj = ob.shape[0]
    E = n_obj // L
    ram = po.shape[0] - 1
    for o in range(n_obj):
        ob[o, NREQ] = first_tick[o]
        ob[o, MARK] = -1
    # hoisted: array loads inside the loop could not be, stores to other arrays may alias them
    s_dense_layer, s_vram = cost[S_DENSE_LAYER], cost[S_EXPERT_VRAM]
    s_fetch_ram, s_fetch_nvme = cost[S_FETCH_RAM], cost[S_FETCH_NVME]
    s_cpu_ram, s_cpu_nvme = cost[S_CPU_RAM], cost[S_CPU_NVME]
    s_copy_ram, s_copy_nvme = cost[S_COPY_RAM], cost[S_COPY_NVME]
    substitutes = miss_code == miss.THRESHOLD or miss_code == miss.FIRST_CHOICE or miss_code == miss.SUBSTITUTE_ALL
    decay_base = 0
    inc = 1.0
    now = 0.0        # simulated seconds
    link_free = 0.0  # when the host-to-GPU link finishes its queued copies

    for t in range(T):
        t_start = now
        stall = 0.0
        if t == 0 or (reset_per_seq and tok_seq[t] != tok_seq[t - 1]):
            _reset(structure, evict_code, pinned, warm_objs, ram_warm, pool_of_layer, E, ob, fo, po, heap, qhl)
            decay_base = t
        if half_life > 0.0:
            inc = 2.0 ** ((t - decay_base) / half_life)
            if inc > _RESCALE:
                for o in range(n_obj):
                    fo[o, SCORE] /= inc
                    if ob[o, HPOS] >= 0:  # heap order is unchanged by a common factor
                        j = po[pool_of_layer[o // E], HBASE] + ob[o, HPOS]
                        heap[j, HK1] = priority(evict_code, ob[o, CNT], fo[o, SCORE], ob[o, NREQ])
                decay_base = t
                inc = 1.0

        for l in range(L):
            pool = pool_of_layer[l]
            base = l * E
            step = t * L + l
            for c in range(N_COUNTERS):
                sc[c] = 0
            smass = 0.0
            now += s_dense_layer
            # background copies of this layer's experts that have completed are admitted first
            i = 0
            while qhl[l, 1] > 0 and queue_t[l, qhl[l, 0]] <= now:
                o = queue[l, qhl[l, 0]]
                qhl[l, 0] = (qhl[l, 0] + 1) % E
                qhl[l, 1] -= 1
                ob[o, QUEUED] = 0
                if ob[o, RES] == 0:
                    sc[ADMISSIONS] += 1
                    if _admit(structure, evict_code, pool, o, step * (E + k) + i, ob, fo, po, heap) >= 0:
                        sc[EVICTIONS] += 1
                    i += 1
            if substitutes:  # a substitute may not be one of the step's selected experts
                for r in range(k):
                    if sel[t, l, r] >= 0:
                        ob[base + sel[t, l, r], MARK] = step
            n_req = 0
            n_hit = 0

            for r in range(k):
                if sel[t, l, r] < 0:
                    continue
                o = base + sel[t, l, r]
                tick = step * (E + k) + E + r
                if uses_next:
                    ob[o, NREQ] = next_tick[t, l, r]
                if uses_score:
                    fo[o, SCORE] += inc
                n_req += 1
                if ob[o, RES] != 0:
                    if record:
                        rec_outcome[t, l, r] = miss.OUTCOME_HIT
                    n_hit += 1
                    if structure == HEAP:
                        ob[o, CNT] += 1
                    _touch(structure, move_on_access, evict_code, pool, o, tick, ob, fo, po, heap)
                    now += s_vram
                    continue
                wr = w[t, l, r]
                action = miss.decide(miss_code, r, wr, theta)
                if action == miss.FETCH:
                    if record:
                        rec_outcome[t, l, r] = miss.OUTCOME_FETCH
                    sc[FETCHES] += 1
                    start = max(now, link_free)  # behind any queued background copy
                    stall += start - now
                    if _from_nvme(o, ram, ob, po):
                        sc[FETCHES_NVME] += 1
                        link_free = start + s_fetch_nvme
                    else:
                        link_free = start + s_fetch_ram
                    now = link_free + s_vram
                    if structure != NONE:  # static never admits
                        if _admit(structure, evict_code, pool, o, tick, ob, fo, po, heap) >= 0:
                            sc[EVICTIONS] += 1
                    continue
                if action == miss.CPU:
                    if record:
                        rec_outcome[t, l, r] = miss.OUTCOME_CPU
                    sc[CPU] += 1
                    if _from_nvme(o, ram, ob, po):
                        sc[CPU_NVME] += 1
                        now += s_cpu_nvme
                    else:
                        now += s_cpu_ram
                    continue
                # substituted or dropped: the step loses this expert's gate weight
                sub = -1
                if action == miss.SUBSTITUTE:
                    for j in range(M):
                        c = base + cand[t, l, j]
                        if c >= base and ob[c, RES] != 0 and ob[c, MARK] != step:
                            sub = c
                            break
                if sub >= 0:
                    if record:
                        rec_outcome[t, l, r] = miss.OUTCOME_SUBSTITUTE
                        rec_sub[t, l, r] = sub - base
                    ob[sub, MARK] = step
                    sc[SUBSTITUTIONS] += 1
                    _touch(structure, move_on_access, evict_code, pool, sub, tick, ob, fo, po, heap)
                    now += s_vram
                else:
                    if record:
                        rec_outcome[t, l, r] = miss.OUTCOME_DROP
                    sc[DROPS] += 1
                smass += wm[t, l, r]
                if r == 0:
                    sc[FIRST_CHOICE_SUBS] += 1
                if beta > 0.0 and structure != NONE:
                    fo[o, ACC] += wr
                    if fo[o, ACC] >= beta and ob[o, QUEUED] == 0:
                        fo[o, ACC] = 0.0
                        # a background copy: occupies the link after what is queued on it
                        start = max(now, link_free)
                        sc[COPIES] += 1
                        if _from_nvme(o, ram, ob, po):
                            sc[COPIES_NVME] += 1
                            link_free = start + s_copy_nvme
                        else:
                            link_free = start + s_copy_ram
                        ob[o, QUEUED] = 1
                        q = (qhl[l, 0] + qhl[l, 1]) % E
                        queue[l, q] = o
                        queue_t[l, q] = link_free
                        qhl[l, 1] += 1

            sc[REQUESTS] = n_req
            sc[HITS] = n_hit
            sc[MISSES] = n_req - n_hit
            for c in range(N_COUNTERS):
                tok_counts[t, c] += sc[c]
            tok_mass[t] += smass
            if t >= warmup_tokens:
                for c in range(N_COUNTERS):
                    layer_counts[l, c] += sc[c]
                layer_mass[l] += smass
        tok_seconds[t] = now - t_start
        tok_stall[t] = stall
