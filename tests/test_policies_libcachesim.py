"""The reference arc, s3fifo, sieve and clock (tests/reference_policies.py) against libCacheSim 0.3.5,
request for request on fetch-all streams (object size 1, capacity = slots): random streams at every
capacity 1..E for small E and a spread of capacities for larger E, and the real FLAME-MoE routing per
layer and as one global stream, where libCacheSim's C replay confirms the miss counts."""

import numpy as np
import pytest
from policy_streams import first_divergence, libcachesim_hits, reference_run, streams
from replay_helpers import libcachesim_misses, oracle_trace, seeded_rng

from moesim.traces import load_routing
from moesim.traces.importers.flame import import_flame

pytest.importorskip("libcachesim", reason="libcachesim (test extra) is not installed")

VARIANTS = [  # (policy, parameters other than libCacheSim's defaults)
    ("arc", None), ("sieve", None), ("clock", None), ("s3fifo", None),
    ("clock", {"init_freq": 1, "n_bit_counter": 2}), ("clock", {"init_freq": 5, "n_bit_counter": 2}),
    ("s3fifo", {"small_size_ratio": 0.25, "ghost_size_ratio": 0.5, "move_to_main_threshold": 1}),
    ("s3fifo", {"small_size_ratio": 0.3, "ghost_size_ratio": 0.0, "move_to_main_threshold": 3}),
]


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
                    if lcs_aborts(name, c, params):
                        continue
                    victims = assert_same(name, c, stream, params, f"{kind} stream over {E} objects")
                    if name == "s3fifo" and int(c * (params or {}).get("small_size_ratio", 0.1)) <= 1:
                        assert (victims == -2).all()  # nothing admitted, as in libCacheSim


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


@pytest.mark.parametrize("name", ["arc", "s3fifo", "sieve", "clock"])
def test_reference_equals_libcachesim_on_real_flame(flame_routing, tmp_path, name):
    r = flame_routing
    L, E = r.n_layers, r.n_experts
    per_layer = [r.sel[:, l, :].reshape(-1).astype(np.int64) for l in range(L)]
    glob = (r.sel.astype(np.int64) + (np.arange(L) * E)[None, :, None]).reshape(-1)
    cases = [(f"layer {l}", s, slots) for slots in (8, 32) for l, s in enumerate(per_layer)]
    cases += [("global", glob, slots * L) for slots in (4, 16)]
    for what, stream, capacity in cases:
        if lcs_aborts(name, capacity, None):
            continue
        oracle_trace(tmp_path / "s.oracle", stream)
        want = libcachesim_misses(tmp_path / "s.oracle", name, capacity, len(stream))
        hits, _, _ = reference_run(name, capacity, stream)
        if int((~hits).sum()) != want or what == "layer 0":  # per request where it fails, and on one layer
            assert_same(name, capacity, stream, None, f"FLAME {what}")
        assert int((~hits).sum()) == want, f"{name} FLAME {what} capacity {capacity}"
