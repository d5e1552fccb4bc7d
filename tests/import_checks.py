"""The replay checks every imported fixture goes through: the kernel against the plain-Python reference,
count for count (stream and engine step semantics), and fetch-all misses against libCacheSim."""

from __future__ import annotations

import numpy as np
from reference_replay import COUNTERS, reference_replay

from moesim.simulator import SimConfig, simulate

CONFIGS = [  # eviction, miss, step_pin, max_uploads
    ("lru", "fetch-all", False, None),
    ("lfu", "threshold:0.3", False, None),
    ("belady", "substitute", False, None),
    ("fifo", "first-choice", False, None),
    ("lru", "fetch-all", True, 1),
]


def check_replays(routing, tmp_path=None) -> None:
    E, L = routing.n_experts, routing.n_layers
    reset = routing.n_sequences > 1
    for eviction, miss, pin, cap in CONFIGS:
        for slots in sorted({1, max(1, E // 4), E // 2}):
            config = SimConfig(eviction=eviction, miss=miss, slots=slots, reset_per_sequence=reset, step_pin=pin,
                               max_uploads=cap)
            res = simulate(routing, config)
            ms, _, arg = miss.partition(":")
            ref_layers, ref_tokens = reference_replay(
                routing.sel, routing.w, routing.cand, routing.seq, E, eviction=eviction, miss=ms,
                theta=float(arg or 0), slots=slots, reset_per_sequence=reset, step_pin=pin, max_uploads=cap)
            for i, name in enumerate(COUNTERS):
                got = res.counts[:, i].tolist()
                want = [ref_layers[l][name] for l in range(L)]
                assert got == want, f"{config.label()}: {name} {got} != reference {want}"
                assert res.token_counts[:, i].tolist() == [t[name] for t in ref_tokens], f"{config.label()}: {name}"
            np.testing.assert_allclose(res.mass, [ref_layers[l]["mass"] for l in range(L)], rtol=1e-9, atol=1e-9)
    if tmp_path is None:
        return
    try:
        import libcachesim  # noqa: F401
    except ImportError:
        return
    from replay_helpers import libcachesim_misses, oracle_trace

    for policy in ("lru", "fifo", "lfu"):
        for slots in (2, E // 2):
            res = simulate(routing, SimConfig(eviction=policy, miss="fetch-all", slots=slots))
            for l in range(L):
                stream = routing.sel[:, l, :].reshape(-1).astype(np.int64)
                oracle_trace(tmp_path / "s.oracle", stream)
                want = libcachesim_misses(tmp_path / "s.oracle", policy, slots, len(stream))
                assert int(res.counts[l, COUNTERS.index("misses")]) == want, f"{policy} slots={slots} layer {l}"
