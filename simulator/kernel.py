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
from moesim.simulator.structures import (ACC, CAP, CNT, HBASE, HEAD, HPOS, HSIZE, KEY1, KEY2, MARK, N_COUNTERS,
                                         NREQ, RES, SCORE, SIZE, TAIL, heap_fix, list_push_front, list_unlink)

# counter columns (per layer and per token)
REQUESTS, HITS, MISSES, FETCHES, SUBSTITUTIONS, DROPS, CPU, ADMISSIONS, FIRST_CHOICE_SUBS, EVICTIONS = range(10)
COUNTER_NAMES = ("requests", "hits", "misses", "fetches", "substitutions", "drops", "cpu", "admissions",
                 "first_choice_substitutions", "evictions")

LIST, HEAP, NONE = 0, 1, 2
NEVER = np.int64(1) << np.int64(62)  # next-use tick of an expert never requested again
_RESCALE = 1e150  # decayed frequency scores are rescaled before they overflow


@njit(cache=True)
def next_use_ticks(sel, n_experts):
    """For each request, the tick of the same (layer, expert)'s next request (NEVER if
    none); and each object's first request tick. Step s = token * L + layer owns the
    ticks [2ks, 2k(s+1)): its background admissions take 2ks + i, its requests
    2ks + k + rank, so ticks order every event of the replay."""
    T, L, k = sel.shape
    nxt = np.empty((T, L, k), np.int64)
    last = np.full(L * n_experts, NEVER, np.int64)
    for t in range(T - 1, -1, -1):
        for l in range(L - 1, -1, -1):
            for r in range(k - 1, -1, -1):
                o = l * n_experts + sel[t, l, r]
                nxt[t, l, r] = last[o]
                last[o] = (2 * (t * L + l) + 1) * k + r
    return nxt, last


@njit(cache=True)
def request_counts(sel, n_experts, n_tokens):
    """Router requests per (layer, expert) over the first n_tokens tokens, flattened."""
    T, L, k = sel.shape
    out = np.zeros(L * n_experts, np.int64)
    for t in range(min(T, n_tokens)):
        for l in range(L):
            for r in range(k):
                out[l * n_experts + sel[t, l, r]] += 1
    return out


# The replay kernel and its helpers are compiled without NRT (the driver allocates
# every array): with NRT, each use of an array in an inlined helper or each call
# increfs and decrefs it atomically, which made replay ~10x slower.
@njit(inline="always")
def _admit(structure, evict_code, pool, o, tick, ob, fo, po, heap):
    """Make o resident in its pool, evicting the policy's victim when the pool is full.
    Returns the victim, or -1."""
    v = -1
    full = po[pool, SIZE] >= po[pool, CAP]
    ob[o, RES] = 1
    ob[o, CNT] = 1
    ob[o, KEY2] = tick
    if structure == LIST:
        if full:
            v = po[pool, TAIL]
            list_unlink(ob, po, pool, v)
        list_push_front(ob, po, pool, o)
    else:
        fo[o, KEY1] = priority(evict_code, 1, fo[o, SCORE], ob[o, NREQ])
        base = po[pool, HBASE]
        if full:  # o takes the root's place, then sinks
            v = heap[base]
            ob[v, HPOS] = -1
            heap[base] = o
            heap_fix(ob, fo, po, heap, pool, 0)
        else:
            i = po[pool, HSIZE]
            heap[base + i] = o
            po[pool, HSIZE] = i + 1
            heap_fix(ob, fo, po, heap, pool, i)
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
        fo[o, KEY1] = priority(evict_code, ob[o, CNT], fo[o, SCORE], ob[o, NREQ])
        ob[o, KEY2] = tick
        heap_fix(ob, fo, po, heap, pool, ob[o, HPOS])


@njit(_nrt=False)
def _reset(structure, evict_code, pinned, warm_objs, pool_of_layer, E, ob, fo, po, heap):
    """Empty every pool, then pin the static set or pre-fill the warm set."""
    for o in range(ob.shape[0]):
        ob[o, RES] = 1 if pinned[o] else 0
        ob[o, HPOS] = -1
        ob[o, CNT] = 0
        fo[o, SCORE] = 0.0
        fo[o, ACC] = 0.0
    for p in range(po.shape[0]):
        po[p, SIZE] = 0
        po[p, HEAD] = -1
        po[p, TAIL] = -1
        po[p, HSIZE] = 0
    nw = warm_objs.shape[0]
    for i in range(nw):
        o = warm_objs[i]
        _admit(structure, evict_code, pool_of_layer[o // E], o, -2 * (nw - i) - 1, ob, fo, po, heap)


@njit(cache=True, _nrt=False)
def replay(sel, w, cand, next_tick, first_tick, tok_seq,
           evict_code, structure, move_on_access, miss_code, theta, beta,
           pool_of_layer, pinned, warm_objs, half_life, warmup_tokens, reset_per_seq,
           ob, fo, po, heap, pend, npend, sc, layer_counts, layer_mass, tok_counts, tok_mass):
    """Replay every (token, layer) step; add counters into layer_counts/layer_mass
    (tokens from warmup_tokens on) and tok_counts/tok_mass (every token).
    ob/fo/po/heap: the packed cache state (structures.new_state); pend [L, k],
    npend [L], sc [N_COUNTERS]: scratch for queued admissions and one step's counters."""
    T, L, k = sel.shape
    M = cand.shape[2]
    n_obj = ob.shape[0]
    E = n_obj // L
    for o in range(n_obj):
        ob[o, NREQ] = first_tick[o]
        ob[o, MARK] = -1
    decay_base = 0
    inc = 1.0

    for t in range(T):
        if t == 0 or (reset_per_seq and tok_seq[t] != tok_seq[t - 1]):
            _reset(structure, evict_code, pinned, warm_objs, pool_of_layer, E, ob, fo, po, heap)
            for l in range(L):
                npend[l] = 0
            decay_base = t
        if half_life > 0.0:
            inc = 2.0 ** ((t - decay_base) / half_life)
            if inc > _RESCALE:
                for o in range(n_obj):
                    fo[o, SCORE] /= inc
                    if ob[o, HPOS] >= 0:  # heap order is unchanged by a common factor
                        fo[o, KEY1] = priority(evict_code, ob[o, CNT], fo[o, SCORE], ob[o, NREQ])
                decay_base = t
                inc = 1.0

        for l in range(L):
            pool = pool_of_layer[l]
            base = l * E
            step = t * L + l
            for c in range(N_COUNTERS):
                sc[c] = 0
            smass = 0.0
            # background admissions queued at this layer's previous step land first
            for i in range(npend[l]):
                o = pend[l, i]
                if ob[o, RES] == 0:
                    sc[ADMISSIONS] += 1
                    if _admit(structure, evict_code, pool, o, 2 * step * k + i, ob, fo, po, heap) >= 0:
                        sc[EVICTIONS] += 1
            npend[l] = 0
            for r in range(k):
                ob[base + sel[t, l, r], MARK] = step

            for r in range(k):
                o = base + sel[t, l, r]
                tick = (2 * step + 1) * k + r
                ob[o, NREQ] = next_tick[t, l, r]
                fo[o, SCORE] += inc
                if ob[o, RES] != 0:
                    sc[HITS] += 1
                    ob[o, CNT] += 1
                    _touch(structure, move_on_access, evict_code, pool, o, tick, ob, fo, po, heap)
                    continue
                wr = w[t, l, r]
                action = miss.decide(miss_code, r, wr, theta)
                if action == miss.FETCH:
                    sc[FETCHES] += 1
                    if structure != NONE:  # static never admits
                        if _admit(structure, evict_code, pool, o, tick, ob, fo, po, heap) >= 0:
                            sc[EVICTIONS] += 1
                    continue
                if action == miss.CPU:
                    sc[CPU] += 1
                    continue
                # substituted or dropped: the step loses this expert's gate weight
                sub = -1
                if action == miss.SUBSTITUTE:
                    for j in range(M):
                        c = base + cand[t, l, j]
                        if ob[c, RES] != 0 and ob[c, MARK] != step:
                            sub = c
                            break
                if sub >= 0:
                    ob[sub, MARK] = step
                    sc[SUBSTITUTIONS] += 1
                    _touch(structure, move_on_access, evict_code, pool, sub, tick, ob, fo, po, heap)
                else:
                    sc[DROPS] += 1
                smass += wr
                if r == 0:
                    sc[FIRST_CHOICE_SUBS] += 1
                if beta > 0.0 and structure != NONE:
                    fo[o, ACC] += wr
                    if fo[o, ACC] >= beta:
                        fo[o, ACC] = 0.0
                        pend[l, npend[l]] = o
                        npend[l] += 1

            sc[REQUESTS] = k
            sc[MISSES] = k - sc[HITS]
            for c in range(N_COUNTERS):
                tok_counts[t, c] += sc[c]
            tok_mass[t] += smass
            if t >= warmup_tokens:
                for c in range(N_COUNTERS):
                    layer_counts[l, c] += sc[c]
                layer_mass[l] += smass
