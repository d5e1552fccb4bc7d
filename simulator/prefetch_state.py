"""Per-expert prefetch state (State.pf, int32) and the prev-token predictor's scalars (State.pf_scal).

An expert's queued copy may be a prefetch in flight; it may be resident by a prefetch not used yet; or its
queued copy may already have been served to a request that waited for it (a stale queue entry, skipped
when it pops). The completion time of a prefetch in flight is in State.pf_t."""


from moesim.jitcache import cached_njit

PF_NONE, PF_INFLIGHT, PF_LANDED, PF_STALE = range(4)
# State.pf_scal: the sequence of the last token whose rows State.pf_prev holds, and whether it holds any
PREV_SEQ, PREV_VALID = range(2)
N_PF_SCAL = 2


@cached_njit(_nrt=False)
def reset(pf, pf_scal):
    """Forget every prefetch (the cache and the copy queues were emptied)."""
    for o in range(pf.shape[0]):
        pf[o] = PF_NONE
    pf_scal[PREV_VALID] = 0
