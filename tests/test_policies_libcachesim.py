"""The reference classes of the policies libCacheSim 0.3.5 also ships (tests/reference_policies.py: arc, s3fifo,
sieve, clock, slru, twoq, lruk, mq, car, lirs) against libCacheSim, request for request on fetch-all streams (object
size 1, capacity = slots): random streams at every capacity 1..E for small E and a spread of capacities for larger
E, and the real FLAME-MoE routing per layer and as one global stream, where libCacheSim's C replay confirms the miss
counts."""

import numpy as np
import pytest
from policy_streams import first_divergence, libcachesim_hits, reference_run, streams
from reference_policies import LIBCACHESIM as REFERENCES
from replay_helpers import libcachesim_misses, oracle_trace, seeded_rng

from moesim.policies import registry
from moesim.traces import load_routing
from moesim.traces.importers.flame import import_flame

pytest.importorskip("libcachesim", reason="libcachesim (test extra) is not installed")

TWINS = [n for n in registry.libcachesim_twins() if n in REFERENCES]  # the modules' LIBCACHESIM, with a reference
VARIANTS = [(n, None) for n in TWINS] + [  # (policy, parameters other than libCacheSim's defaults)
    ("clock", {"init_freq": 1, "n_bit_counter": 2}), ("clock", {"init_freq": 5, "n_bit_counter": 2}),
    ("s3fifo", {"small_size_ratio": 0.25, "ghost_size_ratio": 0.5, "move_to_main_threshold": 1}),
    ("s3fifo", {"small_size_ratio": 0.3, "ghost_size_ratio": 0.0, "move_to_main_threshold": 3}),
    ("lruk", {"k": 1}), ("lruk", {"k": 3}),
    ("mq", {"lifetime": 20}), ("mq", {"n_queue": 3, "lifetime": 5, "qout_size_ratio": 0.5}),
    ("twoq", {"a_in_size_ratio": 0.5, "a_out_size_ratio": 1.0}),
]


def test_every_new_twin_has_a_reference():
    assert set(TWINS) == set(REFERENCES) and {"slru", "twoq", "lruk", "mq", "car", "lirs"} <= set(TWINS)


def lirs_stale(name, capacity):
    """The one documented difference (policies/lirs.py): at 2 slots libCacheSim's LIRS can demote a
    non-resident entry, leaving a stale NH entry behind, which moesim does not model."""
    return name == "lirs" and capacity == 2


def lcs_aborts(name, capacity, params):
    """libCacheSim 0.3.5 aborts the process when S3FIFO's small queue gets no slot."""
    return name == "s3fifo" and int(capacity * (params or {}).get("small_size_ratio", 0.1)) == 0


def assert_same(name, capacity, stream, params, what):
    want = libcachesim_hits(name, capacity, stream, params)
    got, victims, _ = reference_run(name, capacity, stream, params)
    i = first_divergence(got, want)
    assert i < 0, (f"{name} {params or ''} capacity {capacity} {what}: first divergence at request {i} "
                   f"(object {stream[i]}): reference {'hit' if got[i] else 'miss'}, libCacheSim "
                   f"{'hit' if want[i] else 'miss'}; misses {int((~got).sum())} vs {int((~want).sum())}")
    return victims


@pytest.mark.parametrize("name,params", VARIANTS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(VARIANTS)])
def test_reference_equals_libcachesim_on_random_streams(name, params):
    for E, n, capacities in [(8, 1200, range(1, 9)), (16, 1200, range(1, 17)), (32, 1500, range(1, 33)),
                             (64, 2000, (1, 2, 3, 5, 8, 10, 13, 19, 20, 21, 29, 32, 40, 47, 63, 64)),
                             (256, 4000, (7, 20, 50, 64, 100, 128, 200, 255))]:
        with seeded_rng("policies-vs-libcachesim", name, repr(params), E) as rng:
            for kind, stream in streams(rng, E, n).items():
                for c in capacities:
                    if lcs_aborts(name, c, params) or lirs_stale(name, c):
                        continue
                    victims = assert_same(name, c, stream, params, f"{kind} stream over {E} objects")
                    if name == "s3fifo" and int(c * (params or {}).get("small_size_ratio", 0.1)) <= 1:
                        assert (victims == -2).all()  # nothing admitted, as in libCacheSim


@pytest.mark.parametrize("name", ["mq", "lirs", "lruk", "car", "twoq", "slru"])
def test_reference_equals_libcachesim_on_long_streams(name):
    """Long enough for MQ's default lifetime (10,000 uses) to demote, LIRS's stack to be limited and ARC-style
    ghosts to churn."""
    with seeded_rng("policies-vs-libcachesim-long", name) as rng:
        for kind, stream in streams(rng, 64, 25_000).items():
            for c in (3, 8, 16, 33):
                assert_same(name, c, stream, None, f"long {kind} stream over 64 objects")


def test_lirs_holds_more_than_its_capacity_as_libcachesim_does():
    """libCacheSim 0.3.5's LIRS keeps more objects than its capacity below 200 slots (policies/lirs.py): the
    reference, which libCacheSim confirms request for request above, does too, and evicts on hits."""
    with seeded_rng("lirs-over-capacity") as rng:
        stream = streams(rng, 16, 5000)["uniform"]
    policy = None
    peak = 0
    for part in np.array_split(stream, 50):
        _, _, policy = reference_run("lirs", 8, part, policy=policy)
        peak = max(peak, len(policy))
    assert peak > 8 and policy.extra_victims


def test_s3fifo_refuses_what_libcachesim_cannot_hold():
    """Below 20 slots (defaults) the small FIFO has at most one slot and libCacheSim admits nothing
    (at 10..19) or aborts (below 10); the reference never admits."""
    stream = np.arange(50) % 7
    for c in range(1, 20):
        hits, victims, policy = reference_run("s3fifo", c, stream)
        assert not hits.any() and (victims == -2).all() and len(policy) == 0


@pytest.fixture(scope="module")
def flame_routing(tmp_path_factory, flame_dir):
    out = tmp_path_factory.mktemp("flame") / "prefill.parquet"
    import_flame(flame_dir, out, layout="prefill")
    return load_routing(out)


@pytest.mark.parametrize("name", TWINS)
def test_reference_equals_libcachesim_on_real_flame(flame_routing, tmp_path, name):
    r = flame_routing
    L, E = r.n_layers, r.n_experts
    per_layer = [r.sel[:, l, :].reshape(-1).astype(np.int64) for l in range(L)]
    glob = (r.sel.astype(np.int64) + (np.arange(L) * E)[None, :, None]).reshape(-1)
    cases = [(f"layer {l}", s, slots) for slots in (8, 32) for l, s in enumerate(per_layer)]
    cases += [("global", glob, slots * L) for slots in (4, 16)]
    for what, stream, capacity in cases:
        if lcs_aborts(name, capacity, None) or lirs_stale(name, capacity):
            continue
        oracle_trace(tmp_path / "s.oracle", stream)
        want = libcachesim_misses(tmp_path / "s.oracle", name, capacity, len(stream))
        hits, _, _ = reference_run(name, capacity, stream)
        if int((~hits).sum()) != want or what == "layer 0":  # per request where it fails, and on one layer
            assert_same(name, capacity, stream, None, f"FLAME {what}")
        assert int((~hits).sum()) == want, f"{name} FLAME {what} capacity {capacity}"
