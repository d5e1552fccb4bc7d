"""LIRS exactly as libCacheSim 0.3.5's LIRS.c (Jiang & Zhang's low inter-reference recency set, with
libCacheSim's departures from the paper kept).

Three LRU lists per pool, newest at each head: the stack S (list 0: LIR experts, and HIR experts,
resident or not), Q (list 1: resident HIR experts) and NH (list 2: the non-resident HIR experts of S).
An expert can be in S and in Q or NH at once, so Q and NH are linked through the second link pair
(PRV2/NXT2). hirs_limit = max(1, int(0.01 * capacity)) and lirs_limit = capacity - hirs_limit; the pool
counts its LIR experts in X0 (libCacheSim's lirs_count; its HIR count is |Q|). ``CNT`` holds the flags
IN_S, LIR and SRES (of the S entry), IN_Q and IN_NH; an expert is resident when its S entry is LIR or
resident, or, without an S entry, when it is in Q.

- Every use and every insertion first moves the expert to the heads of S and Q where it is in them.
- A use of a LIR expert prunes S (non-LIR entries leave its bottom, its head excepted). A use of a
  resident HIR expert of S drops its Q entry and makes it LIR, demoting while the LIR set is full. A use
  of an expert in Q only demotes while the LIR set is full, then enters it in S as a resident HIR.
- Demoting moves S's bottom into Q's head (Q evicting its LRU first while full) and prunes S; evicting
  Q's LRU marks its S entry non-resident and links it in NH.
- Inserting a non-resident HIR expert of S demotes while the LIR set is full, drops its NH entry, evicts
  while the pool is full (Q's LRU while Q is full, then a demotion) and makes it LIR. Any other
  insertion evicts Q's LRU when both sets are full, and becomes LIR while the LIR set has room, else a
  resident HIR of S and Q.
- After each use and insertion, while S holds more than 2 x capacity entries, NH's oldest leaves S and NH.

libCacheSim's quirks kept: a use of an expert in Q only demotes a LIR expert though the used one stays
HIR; with hirs_limit = 1 (capacity < 200) that demotion evicts the used expert itself from Q while it
becomes a resident S entry no count includes, so the pool holds more experts than its capacity (one or
a few) until such an entry is used (then counted as LIR), demoted (into Q) or pruned (evicted).
Evictions happen on uses and an insertion can evict more than one expert: ``insert`` returns the first,
the others are counted in the pool's EXTRA_EVICTIONS (X3). One difference, at 2 slots only: libCacheSim
can demote a non-resident entry, leaving a stale NH entry behind; here its NH entry goes with it.
Nothing is admitted at 1 slot (no LIR share)."""

from numba import njit

from moesim.jitcache import cached_njit
from moesim.policies.hooks import NOT_ADMITTED
from moesim.policies.structures import (
    CAP,
    CNT,
    EXTRA_EVICTIONS,
    HEAD,
    LEN,
    NXT2,
    PRV2,
    RES,
    SIZE,
    TAIL,
    X0,
    X1,
    X2,
    list_move_front,
    list_push_front,
    list_unlink,
)

NAME = "lirs"
EXTRA_EVICTIONS_USED = True  # evicts beyond its insertions' victims (counted in the pool's EXTRA_EVICTIONS)
LIBCACHESIM = "LIRS"  # the libCacheSim 0.3.5 class with the same semantics under fetch-all (the tests' oracle)
DOC = ("LIRS (libCacheSim LIRS): LIR experts by reuse distance, 1% of slots for HIR experts; like libCacheSim "
       "0.3.5 it can hold a few experts beyond the slots below 200 slots")
SECOND_LINKS = (1, 2)  # Q and NH are linked through PRV2/NXT2 (the tests walk them there)
S, Q, NH = 0, 1, 2
IN_S, LIR, SRES, IN_Q, IN_NH = 1, 2, 4, 8, 16
LIRS_COUNT, LOST, FIRST = X0, X1, X2  # pool scalars; LOST/FIRST: the operation in progress's evictions


@njit(inline="always")
def _resident(f):
    if f & IN_S:
        return (f & (LIR | SRES)) != 0
    return (f & IN_Q) != 0


@njit(inline="always")
def _sync(ob, po, pool, x):
    """Give x the resident flag its list flags say; a resident that leaves is recorded as lost."""
    r = 1 if _resident(ob[x, CNT]) else 0
    if r != ob[x, RES]:
        ob[x, RES] = r
        if r:
            po[pool, SIZE] += 1
        else:
            po[pool, SIZE] -= 1
            if po[pool, LOST] == 0:
                po[pool, FIRST] = x
            po[pool, LOST] += 1


@njit(inline="always")
def _s_drop(ob, po, pool, x):
    list_unlink(ob, po, pool, x, S)
    ob[x, CNT] &= ~(IN_S | LIR | SRES)


@njit(inline="always")
def _q_push(ob, po, pool, x):
    list_push_front(ob, po, pool, x, Q, PRV2, NXT2)
    ob[x, CNT] |= IN_Q


@njit(inline="always")
def _q_unlink(ob, po, pool, x):
    list_unlink(ob, po, pool, x, Q, PRV2, NXT2)
    ob[x, CNT] &= ~IN_Q


@njit(inline="always")
def _nh_unlink(ob, po, pool, x):
    list_unlink(ob, po, pool, x, NH, PRV2, NXT2)
    ob[x, CNT] &= ~IN_NH


@njit(inline="always")
def _prune(ob, po, pool):
    while po[pool, LEN + 3 * S] >= 2:
        x = po[pool, TAIL + 3 * S]
        f = ob[x, CNT]
        if f & LIR:
            break
        if not (f & SRES) and (f & IN_NH):
            _nh_unlink(ob, po, pool, x)
        _s_drop(ob, po, pool, x)
        _sync(ob, po, pool, x)


@njit(inline="always")
def _evict_hir(ob, po, pool):
    x = po[pool, TAIL + 3 * Q]
    _q_unlink(ob, po, pool, x)
    if ob[x, CNT] & IN_S:
        ob[x, CNT] &= ~SRES
        list_push_front(ob, po, pool, x, NH, PRV2, NXT2)
        ob[x, CNT] |= IN_NH
    _sync(ob, po, pool, x)


@njit(inline="always")
def _evict_lir(ob, po, pool, hirs_limit):
    """Demote S's bottom (counted as one LIR expert leaving, LIR or not, as libCacheSim does) into Q."""
    x = po[pool, TAIL + 3 * S]
    if ob[x, CNT] & IN_NH:  # a non-resident entry (2 slots): libCacheSim would leave a stale NH entry
        _nh_unlink(ob, po, pool, x)
    _s_drop(ob, po, pool, x)
    po[pool, LIRS_COUNT] -= 1
    while po[pool, LEN + 3 * Q] + 1 > hirs_limit:
        _evict_hir(ob, po, pool)
    _q_push(ob, po, pool, x)
    _sync(ob, po, pool, x)
    _prune(ob, po, pool)


@njit(inline="always")
def _limit_stack(ob, po, pool):
    while po[pool, LEN + 3 * S] > 2 * po[pool, CAP] and po[pool, LEN + 3 * NH] > 0:
        x = po[pool, TAIL + 3 * NH]
        _nh_unlink(ob, po, pool, x)
        if ob[x, CNT] & IN_S:
            _s_drop(ob, po, pool, x)


@njit(inline="always")
def _lookup(ob, po, pool, o):
    f = ob[o, CNT]
    if f & IN_S and po[pool, HEAD + 3 * S] != o:
        list_move_front(ob, po, pool, o, S)
    if f & IN_Q and po[pool, HEAD + 3 * Q] != o:
        list_unlink(ob, po, pool, o, Q, PRV2, NXT2)
        list_push_front(ob, po, pool, o, Q, PRV2, NXT2)


@njit(inline="always")
def _limits(po, pool):
    c = po[pool, CAP]
    hl = max(1, int(0.01 * c))
    return hl, c - hl


@cached_njit(_nrt=False)
def _hit(ob, po, pool, o):
    hl, ll = _limits(po, pool)
    po[pool, LOST] = 0
    _lookup(ob, po, pool, o)
    f = ob[o, CNT]
    if f & IN_S:
        if f & LIR:
            _prune(ob, po, pool)
        else:  # a resident HIR entry of S becomes LIR
            if f & IN_Q:
                _q_unlink(ob, po, pool, o)
            while po[pool, LIRS_COUNT] + 1 > ll:
                _evict_lir(ob, po, pool, hl)
            ob[o, CNT] |= LIR
            po[pool, LIRS_COUNT] += 1
    else:  # in Q only: stays HIR, enters S
        while po[pool, LIRS_COUNT] + 1 > ll:
            _evict_lir(ob, po, pool, hl)
        self_evicted = not (ob[o, CNT] & IN_Q)  # evicted from Q by its own demotion: resident again below
        list_push_front(ob, po, pool, o, S)
        ob[o, CNT] |= IN_S | SRES
        _sync(ob, po, pool, o)
        if self_evicted:
            po[pool, LOST] -= 1
    _limit_stack(ob, po, pool)
    po[pool, EXTRA_EVICTIONS] += po[pool, LOST]


# out of line: inlining this body into the kernel doubled its cold compile time
@cached_njit(_nrt=False)
def _insert(ob, po, pool, o):
    c = po[pool, CAP]
    hl, ll = _limits(po, pool)
    po[pool, LOST] = 0
    _lookup(ob, po, pool, o)
    if ob[o, CNT] & IN_S:  # a non-resident HIR entry of S
        while po[pool, LIRS_COUNT] + 1 > ll:
            _evict_lir(ob, po, pool, hl)
        if ob[o, CNT] & IN_NH:
            _nh_unlink(ob, po, pool, o)
    else:
        if ll < 1:  # no LIR share (1 slot): libCacheSim admits nothing
            _limit_stack(ob, po, pool)
            return NOT_ADMITTED
        if po[pool, LIRS_COUNT] + 1 > ll and po[pool, LEN + 3 * Q] + 1 > hl:
            while po[pool, LEN + 3 * Q] + 1 > hl:
                _evict_hir(ob, po, pool)
    while po[pool, LIRS_COUNT] + po[pool, LEN + 3 * Q] + 1 > c:
        if ob[o, CNT] & IN_S:
            while po[pool, LEN + 3 * Q] >= hl:
                _evict_hir(ob, po, pool)
            _evict_lir(ob, po, pool, hl)
        elif po[pool, LIRS_COUNT] + 1 > ll and po[pool, LEN + 3 * Q] + 1 > hl:
            _evict_hir(ob, po, pool)
        else:
            break  # libCacheSim would loop forever; never reached in the tests' streams
    if ob[o, CNT] & IN_S:
        ob[o, CNT] |= LIR | SRES
        po[pool, LIRS_COUNT] += 1
    else:
        list_push_front(ob, po, pool, o, S)
        if po[pool, LIRS_COUNT] + 1 <= ll:
            ob[o, CNT] |= IN_S | LIR | SRES
            po[pool, LIRS_COUNT] += 1
        else:
            ob[o, CNT] |= IN_S | SRES
            _q_push(ob, po, pool, o)
    _sync(ob, po, pool, o)
    _limit_stack(ob, po, pool)
    lost = po[pool, LOST]
    if lost == 0:
        return -1
    po[pool, EXTRA_EVICTIONS] += lost - 1
    return po[pool, FIRST]


@njit(inline="always")
def insert(ob, fo, po, heap, prm, pool, o, tick):
    return _insert(ob, po, pool, o)


@njit(inline="always")
def hit(ob, fo, po, heap, prm, pool, o, tick, requested):
    _hit(ob, po, pool, o)
