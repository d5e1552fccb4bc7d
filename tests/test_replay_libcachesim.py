"""Fetch-all replay against libCacheSim's C replay of the same request stream.

Per layer, a layer's flattened (token, rank) stream with capacity = slots; with a
global pool, the whole (token, layer, rank) stream of (layer, expert) objects with
capacity = slots * L. libCacheSim's Belady needs next-access times in the file."""

import numpy as np
import pytest
from replay_helpers import fast_random_routing, libcachesim_misses, oracle_trace

from moesim.policies import registry
from moesim.simulator import simulate

pytest.importorskip("libcachesim", reason="libcachesim (test extra) is not installed")

POLICIES = list(registry.libcachesim_twins())


def per_layer_stream(routing, layer):
    return routing.sel[:, layer, :].reshape(-1).astype(np.int64)


def global_stream(routing):
    E = routing.n_experts
    objs = routing.sel.astype(np.int64) + (np.arange(routing.n_layers) * E)[None, :, None]
    return objs.reshape(-1)


def check_against_libcachesim(routing, tmp_path, policy, slots):
    res = simulate(routing, eviction=policy, miss="fetch-all", slots=slots)
    for l in range(routing.n_layers):
        stream = per_layer_stream(routing, l)
        path = tmp_path / f"layer{l}.oracle"
        oracle_trace(path, stream)
        want = libcachesim_misses(path, policy, slots, len(stream))
        assert int(res.counts[l, 2]) == want, f"{policy} slots={slots} layer {l}: moesim {res.counts[l, 2]} != {want}"
    glob = simulate(routing, eviction=policy, miss="fetch-all", slots=slots, allocation="global")
    stream = global_stream(routing)
    oracle_trace(tmp_path / "global.oracle", stream)
    want = libcachesim_misses(tmp_path / "global.oracle", policy, slots * routing.n_layers, len(stream))
    assert glob.totals()["misses"] == want, f"{policy} global slots={slots}: {glob.totals()['misses']} != {want}"


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("geometry", [(400, 3, 32, 4), (300, 2, 64, 8), (600, 2, 8, 2)])
def test_fetch_all_equals_libcachesim(tmp_path, policy, geometry):
    T, L, E, k = geometry
    routing = fast_random_routing(np.random.default_rng(T + E), T, L, E, k)
    for slots in sorted({1, 2, E // 8 or 1, E // 4, E // 2, E - 1}):
        check_against_libcachesim(routing, tmp_path, policy, slots)
