"""The numba hooks of every eviction with a reference class (tests/reference_policies.py; the list of them is
derived from the registry) against that class, event for event on one pool: the same hits, the same victims (or
refusals), and after each chunk of the stream the same lists in the same order (where the policy keeps lists), the
same resident set and as many evictions beyond the victims. Streams mix fetched misses with misses the policy never
hears of and runs as a substitute."""

import numpy as np
import pytest
from policy_streams import (
    FETCH,
    NO_FETCH,
    SUBSTITUTE,
    check_same_state,
    first_divergence,
    fresh_state,
    hooks_run,
    reference_run,
    streams,
)
from replay_helpers import seeded_rng

from moesim.policies import registry
from moesim.policies.hooks import NOT_ADMITTED
from moesim.policies.structures import X0


def registry_variants() -> list:
    """Every eviction whose hooks the one-pool driver can run on their own: not pinned, and reading neither the
    kernel's decayed scores nor its next requests (freq and belady are checked through the replay reference)."""
    return [(e.name, None) for e in registry.EVICTIONS
            if not (e.pinned or e.uses_score or e.uses_next_request)]


VARIANTS = registry_variants() + [
    ("clock", {"init_freq": 5, "n_bit_counter": 2}),
    ("s3fifo", {"small_size_ratio": 0.25, "ghost_size_ratio": 0.5, "move_to_main_threshold": 1}),
    ("s3fifo", {"small_size_ratio": 0.3, "ghost_size_ratio": 0.0, "move_to_main_threshold": 3}),
    ("lruk", {"k": 1}), ("lruk", {"k": 3}), ("slru", {"n_seg": 3}),
    ("mq", {"lifetime": 20}), ("mq", {"n_queue": 3, "lifetime": 5, "qout_size_ratio": 0.5}),
    ("twoq", {"a_in_size_ratio": 0.5, "a_out_size_ratio": 1.0}),
    ("lfru", {"decay_tokens": 7}), ("lfru", {"decay_tokens": 50}), ("lcp", {"base": 0.5, "decay_tokens": 8}),
]


def test_variants_cover_the_new_policies():
    names = {n for n, _ in VARIANTS}
    assert {"lirs", "slru", "twoq", "car", "lruk", "mq", "arc", "s3fifo", "sieve", "clock", "lru", "fifo", "lfuda",
            "lcp", "lfru"} <= names


def run_both(name, capacity, stream, params, kinds, what, chunks=4):
    """Both implementations over the stream, compared per event and (state) after each chunk."""
    policy, state = None, fresh_state(capacity, int(stream.max()) + 1)
    for part in np.array_split(np.arange(len(stream)), chunks):
        i0 = int(part[0])
        hits, victims, policy = reference_run(name, capacity, stream[part], params, kinds[part], policy, i0)
        h, v, state = hooks_run(name, capacity, stream[part], params, kinds[part], state, i0)
        for got, want, label in ((h, hits, "hit"), (v, victims, "victim")):
            i = first_divergence(got, want)
            assert i < 0, (f"{name} {params or ''} capacity {capacity} {what}: {label} differs at event "
                           f"{i0 + i} (object {stream[i0 + i]}, kind {kinds[i0 + i]}): hooks {got[i]}, "
                           f"reference {want[i]}")
        check_same_state(state[0], state[2], policy)


@pytest.mark.parametrize("name,params", VARIANTS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(VARIANTS)])
def test_hooks_equal_reference(name, params):
    for E, n, capacities in [(8, 600, range(1, 9)), (32, 1000, (1, 2, 5, 10, 19, 20, 21, 31, 32)),
                             (128, 3000, (3, 20, 40, 64, 100, 127))]:
        with seeded_rng("hooks-vs-reference", name, repr(params), E) as rng:
            for kind, stream in streams(rng, E, n).items():
                fetch_all = np.full(n, FETCH, np.int8)
                mixed = rng.choice(np.array([FETCH, NO_FETCH, SUBSTITUTE], np.int8), size=n, p=[0.6, 0.2, 0.2])
                for c in capacities:
                    run_both(name, c, stream, params, fetch_all, f"{kind} stream over {E} objects")
                    run_both(name, c, stream, params, mixed, f"{kind} stream over {E} objects, mixed events")


def test_ghosts_and_refusals_are_exercised():
    """The streams above reach the paths that matter: ARC and S3-FIFO ghost hits, S3-FIFO refusals."""
    with seeded_rng("hooks-coverage") as rng:
        stream = streams(rng, 64, 3000)["zipf"]
    kinds = np.zeros(len(stream), np.int8)
    _, _, arc = reference_run("arc", 16, stream)
    assert arc.p > 0  # p only moves on ghost hits
    _, victims, _ = reference_run("s3fifo", 20, stream, None, kinds)
    _, _, (_, _, po, _) = hooks_run("s3fifo", 20, stream)
    assert (victims >= 0).any() and po[0, X0] == 1  # has evicted
    _, victims, _ = hooks_run("s3fifo", 19, stream)
    assert (victims == NOT_ADMITTED).all()


def test_declared_parameters_match_the_reference_defaults():
    import inspect

    from reference_policies import LIBCACHESIM

    for name, cls in LIBCACHESIM.items():
        defaults = {k: p.default for k, p in inspect.signature(cls).parameters.items() if k != "capacity"}
        ev = registry.get(name)
        declared = dict(ev.fixed) | ({ev.param.key: ev.param.default} if ev.param else {})
        assert declared == defaults, name


def test_engine_policies_declare_the_reference_defaults():
    import inspect

    from reference_policies import ENGINES

    for name, cls in ENGINES.items():
        defaults = {k: p.default for k, p in inspect.signature(cls).parameters.items()
                    if k not in ("capacity", "token")}
        ev = registry.get(name)
        declared = dict(ev.fixed) | ({ev.param.key: ev.param.default} if ev.param else {})
        assert declared == defaults, name
