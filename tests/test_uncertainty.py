"""Confidence intervals (--ci): the bootstrap against a slow pure-Python one with the same draws, units,
zero-width intervals on identical sequences, the full-trace value inside its interval, and the per-unit
sums of one replay against the replay's own totals and against mrc's one-pass LRU counts per unit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from replay_helpers import fast_random_routing, make_routing, seeded_rng

from moesim.costmodel.timing import cost_params
from moesim.errors import MoesimError
from moesim.simulator import SimConfig, simulate
from moesim.simulator.bootstrap import CI, SEED, percentile_interval, tail_rank, weights
from moesim.simulator.units import SUM_NAMES, assign, replay_intervals, replay_units, unit_sums

# ---------------------------------------------------------------------------------------------- reference


def reference_interval(num: list[float], den: list[float], level: float, resamples: int) -> tuple[float, float]:
    """The textbook percentile bootstrap, one draw at a time: resample b draws U units with replacement
    (the generator's integers, in order), sums the drawn units' numerators and denominators in draw order,
    and the interval is the j-th smallest and j-th largest of the B ratios, j = ceil(B (100 - level) / 200)."""
    rng = np.random.default_rng(SEED)
    U = len(num)
    values = []
    for _ in range(resamples):
        drawn = [int(i) for i in rng.integers(0, U, size=U)]
        n = 0.0
        d = 0.0
        for i in drawn:
            n += num[i]
            d += den[i]
        if d != 0:
            values.append(n / d)
    values.sort()
    j = math.ceil(len(values) * (100 - level) / 200 - 1e-12)
    return values[j - 1], values[len(values) - j]


def reference_unit_sums(routing, res, config) -> dict[int, dict[str, float]]:
    """Per sequence, token by token: counted requests, hits, mass, tokens and timed seconds (batch 1)."""
    from moesim.simulator.counters import COUNTER_NAMES

    req, hit = COUNTER_NAMES.index("requests"), COUNTER_NAMES.index("hits")
    out: dict[int, dict[str, float]] = {}
    for t in range(routing.n_tokens):
        if t < config.warmup_tokens:
            continue
        u = out.setdefault(int(routing.seq[t]), {"requests": 0, "hits": 0, "mass": 0.0, "steps": 0,
                                                 "seconds": 0.0, "timed_tokens": 0})
        u["requests"] += int(res.token_counts[t, req])
        u["hits"] += int(res.token_counts[t, hit])
        u["mass"] += float(res.token_mass[t])
        u["steps"] += routing.n_layers
        u["seconds"] += float(res.token_seconds[t])
        u["timed_tokens"] += 1
    return out


def small_cost():
    """The qwen3-30b-a3b Q4_K_M seconds per operation on an RTX 3090, every expert in host RAM (the random
    traces are far smaller than the model: only the prices matter here)."""
    import dataclasses

    return dataclasses.replace(cost_params("qwen3-30b-a3b", "q4_k_m", "rtx3090-pcie4"), ram_expert_capacity=10**6)


def random_trace(name: str, n_seq: int = 6, T: int = 240):
    with seeded_rng("uncertainty", name) as rng:
        return fast_random_routing(rng, T=T, L=3, E=16, k=2, M=6, n_seq=n_seq)


# ---------------------------------------------------------------------------------------------- the bootstrap


def test_percentile_ranks_are_exact():
    assert tail_rank(95, 1000) == 25 and tail_rank(90, 1000) == 50 and tail_rank(99, 1000) == 5
    assert tail_rank(95, 2000) == 50
    with pytest.raises(MoesimError, match="at least 2000 resamples"):
        CI(level=99.9, resamples=1000)
    for bad in (0, 100, -5, float("nan")):
        with pytest.raises(MoesimError, match="between 0 and 100"):
            CI(level=bad)
    with pytest.raises(MoesimError, match="--ci-unit"):
        CI(unit="tokens")


@pytest.mark.parametrize("case", range(4))
def test_bootstrap_matches_a_pure_python_bootstrap(case):
    with seeded_rng("bootstrap", case) as rng:
        U = int(rng.integers(2, 40))
        den = rng.integers(1, 1000, size=U).astype(float)
        num = np.floor(den * rng.uniform(0, 1, size=U))
        mass = rng.uniform(0, 5, size=U)
        level = [95.0, 90.0, 99.0, 80.0][case]
        resamples = [1000, 400, 1000, 250][case]
        from moesim.simulator.bootstrap import ratio, resampled_sums

        reps = resampled_sums(np.stack([num, den, mass], axis=1), resamples)
        got = percentile_interval(ratio(reps[:, 0], reps[:, 1]), level)
        # counters: whole-number sums are exact in any order, so the intervals are identical
        assert got == reference_interval(list(num), list(den), level, resamples)
        # gate mass is a float sum: the reference adds in draw order, the matrix product by unit
        got_mass = percentile_interval(ratio(reps[:, 2], reps[:, 1]), level)
        ref_mass = reference_interval(list(mass), list(den), level, resamples)
        assert got_mass == pytest.approx(ref_mass, rel=1e-12)


def test_weights_are_the_draws_and_rows_sum_to_the_units():
    w = weights(7, 50)
    rng = np.random.default_rng(SEED)
    for b in range(50):
        assert (w[b] == np.bincount(rng.integers(0, 7, size=7), minlength=7)).all()
    assert (w.sum(axis=1) == 7).all() and not w.flags.writeable


@pytest.mark.parametrize("config", [
    SimConfig(eviction="lru", miss="fetch-all", slots=4),
    SimConfig(eviction="freq", miss="threshold:0.15", admit=0.5, slots=4),
    SimConfig(eviction="lfu", miss="first-choice", slots=6, warmup_tokens=30),
], ids=["lru", "quality-first", "lfu-warmup"])
def test_replay_intervals_match_the_reference_on_random_traces(config):
    routing = random_trace(config.eviction)
    res = simulate(routing, config, cost=small_cost())
    units = replay_units(routing, config)
    assert units.kind == "sequence" and units.n == len(np.unique(routing.seq[config.warmup_tokens:]))
    sums = unit_sums(res, units)
    ref = reference_unit_sums(routing, res, config)
    col = {n: i for i, n in enumerate(SUM_NAMES)}
    for u, seq in enumerate(sorted(ref)):
        for name in ("requests", "hits", "steps", "timed_tokens"):
            assert sums[u, col[name]] == ref[seq][name]
        assert sums[u, col["mass"]] == pytest.approx(ref[seq]["mass"], rel=1e-12)
        assert sums[u, col["seconds"]] == pytest.approx(ref[seq]["seconds"], rel=1e-12)
    # the units add up to the replay's own totals
    tot = res.totals()
    assert sums[:, col["hits"]].sum() == tot["hits"] and sums[:, col["requests"]].sum() == tot["requests"]
    ci = CI(95, 500)
    iv = replay_intervals(sums, ci)
    seqs = sorted(ref)
    assert iv["hit_rate"] == reference_interval([ref[s]["hits"] for s in seqs], [ref[s]["requests"] for s in seqs],
                                                95, 500)
    assert iv["s_per_token"] == pytest.approx(reference_interval(
        [ref[s]["seconds"] for s in seqs], [ref[s]["timed_tokens"] for s in seqs], 95, 500), rel=1e-12)
    assert iv["mass_per_step"] == pytest.approx(reference_interval(
        [ref[s]["mass"] for s in seqs], [ref[s]["steps"] for s in seqs], 95, 500), rel=1e-12, abs=1e-15)
    # the full-trace value lies inside its interval, and the derived intervals follow
    assert iv["hit_rate"][0] <= tot["hit_rate"] <= iv["hit_rate"][1]
    assert iv["mass_per_step"][0] <= tot["mass_per_step"] <= iv["mass_per_step"][1]
    assert iv["s_per_token"][0] <= res.timing["s_per_token"] <= iv["s_per_token"][1]
    assert iv["miss_rate"] == (1 - iv["hit_rate"][1], 1 - iv["hit_rate"][0])
    assert iv["ms_per_token"] == (1e3 * iv["s_per_token"][0], 1e3 * iv["s_per_token"][1])


@pytest.mark.parametrize("case", range(6))
def test_full_trace_value_lies_inside_its_interval(case):
    routing = random_trace(f"coverage{case}", n_seq=[3, 8, 20, 1, 5, 12][case], T=300)
    evictions = ["lru", "lfu", "fifo", "belady", "freq", "static"]
    config = SimConfig(eviction=evictions[case], miss=["fetch-all", "threshold:0.15", "substitute"][case % 3],
                       admit=0.5 if case % 3 else None, slots=5)
    res = simulate(routing, config)
    units = replay_units(routing, config)
    iv = replay_intervals(unit_sums(res, units), CI(95), timed=False)
    tot = res.totals()
    for name in ("hit_rate", "substitution_rate", "drop_rate", "mass_per_step"):
        lo, hi = iv[name]
        assert lo <= tot[name] + 1e-12 and tot[name] <= hi + 1e-12, (name, lo, tot[name], hi)


# ---------------------------------------------------------------------------------------------- units


def test_units_sequences_blocks_and_batch_groups():
    seq = np.repeat(np.arange(4), 50)
    u = assign(seq, 0)
    assert u.kind == "sequence" and u.n == 4 and (u.ids == seq).all() and u.describe() == "4 sequences"
    # a single sequence: blocks of max(64, ceil(T/50)) tokens, as many as fit
    one = assign(np.zeros(2000, np.int32), 0)
    assert one.kind == "block" and one.n == 31 and one.block_steps == 64
    assert one.describe() == "31 blocks of 64 tokens"
    lengths = np.bincount(one.ids)
    assert lengths.min() >= 64 and lengths.max() - lengths.min() <= 1 and lengths.sum() == 2000
    big = assign(np.zeros(10_000, np.int32), 0)
    assert big.n == 50 and big.block_steps == 200
    short = assign(np.zeros(100, np.int32), 0)
    assert short.n == 1  # shorter than two blocks: one unit, no interval
    # warm-up steps belong to no unit; --ci-unit block on a multi-sequence trace
    w = assign(seq, 72, "block")
    assert (w.ids[:72] == -1).all() and w.n == 2 and w.block_steps == 64
    forced = assign(np.zeros(300, np.int32), 0, "sequence")
    assert forced.kind == "sequence" and forced.n == 1
    routing = random_trace("batch", n_seq=5, T=200)
    cfg = SimConfig(eviction="lru", slots=4, batch=2)
    bu = replay_units(routing, cfg)
    res = simulate(routing, cfg)
    assert bu.kind == "batch group" and bu.n == 3 and len(bu.ids) == len(res.token_mass)
    sums = unit_sums(res, bu)
    assert sums[:, SUM_NAMES.index("hits")].sum() == res.totals()["hits"]


def identical_sequences(n: int = 4):
    """A routing whose n sequences are copies of one."""
    base = random_trace("identical", n_seq=1, T=120)

    def tile(a):
        return np.concatenate([a] * n)

    return make_routing(tile(base.sel), tile(base.w), tile(base.cand), np.repeat(np.arange(n), 120), 16)


@pytest.mark.parametrize("config", [
    SimConfig(eviction="lru", miss="fetch-all", slots=4, reset_per_sequence=True),
    SimConfig(eviction="freq", miss="threshold:0.15", admit=0.5, slots=4, reset_per_sequence=True),
], ids=["lru", "quality-first"])
def test_identical_sequences_give_zero_width_intervals(config):
    routing = identical_sequences()
    res = simulate(routing, config, cost=small_cost())
    iv = replay_intervals(unit_sums(res, replay_units(routing, config)), CI(95))
    tot = res.totals()
    for name in ("hit_rate", "substitution_rate", "drop_rate", "mass_per_step"):
        assert iv[name][0] == iv[name][1] == pytest.approx(tot[name], rel=1e-12, abs=1e-15)
    assert iv["s_per_token"][0] == pytest.approx(iv["s_per_token"][1], rel=1e-12)


def test_profile_and_mrc_intervals_of_identical_sequences_have_zero_width():
    from moesim.reports.profile import profile
    from moesim.sweeps.mrc import mrc

    routing = identical_sequences()
    d = profile(routing, ci=CI(95))
    for name, (lo, hi) in d["ci"]["intervals"].items():
        assert lo == pytest.approx(hi, rel=1e-12), name
    assert set(d["ci"]["intervals"]) == {"reuse_next_token", "gate.mean_first_choice_weight",
                                         "gate.fraction_weight_ge_0.15"}
    assert d["ci"]["intervals"]["reuse_next_token"][0] == pytest.approx(d["reuse_next_token"], rel=1e-12)
    curve, _ = mrc(routing, evictions=["lru", "fifo"], slots=[4, 8], reset_per_sequence=True, jobs=1, ci=CI(95))
    assert (curve["hit_rate_high"] - curve["hit_rate_low"]).abs().max() < 1e-12
    assert set(curve["ci_unit"].to_list()) == {"sequence"} and set(curve["ci_units"].to_list()) == {4}


@pytest.mark.parametrize("allocation", ["per-layer", "global"])
def test_mrc_lru_counts_per_unit_equal_lru_replays(allocation):
    from moesim.sweeps.mrc import lru_unit_hits

    routing = random_trace("mrc-units", n_seq=5, T=200)
    units = assign(routing.seq, 20)
    per_unit = lru_unit_hits(routing, units, warmup_tokens=20)
    key = "per_layer" if allocation == "per-layer" else "pooled"
    for n in (1, 3, 8, 16):
        cfg = SimConfig(eviction="lru", miss="fetch-all", slots=n, allocation=allocation, warmup_tokens=20)
        sums = unit_sums(simulate(routing, cfg), replay_units(routing, cfg))
        assert (per_unit[key][:, n - 1] == sums[:, SUM_NAMES.index("hits")]).all()
        assert (per_unit["requests"] == sums[:, SUM_NAMES.index("requests")]).all()


# ---------------------------------------------------------------------------------------------- rotated counting


@pytest.mark.parametrize("rule", ["sequence", "block"])
def test_rotated_units_add_up_to_the_replay_and_come_from_the_rotated_replay(rule):
    from moesim.simulator.rotation import rotated_routing, rotation, warm_unit_sums

    routing = random_trace("rotated" + rule, n_seq=5 if rule == "sequence" else 1, T=400)
    config = SimConfig(eviction="freq", miss="threshold:0.15", admit=0.5, slots=4, warmup_tokens=10)
    res = simulate(routing, config, cost=small_cost())
    units = replay_units(routing, config, rule)
    cold = unit_sums(res, units)
    warm, offset, method = warm_unit_sums(routing, config, units, res, small_cost())
    assert method == "rotated" and units.n >= 3
    order, h = rotation(units)
    assert h == units.n // 2 and units.ids[order[0]] == h
    again = simulate(rotated_routing(routing, order), SimConfig(eviction="freq", miss="threshold:0.15", admit=0.5,
                                                                slots=4), cost=small_cost())
    ids = units.ids[order]
    hits = SUM_NAMES.index("hits")
    for u in range(units.n):
        source, mask = (again, ids == u) if u < h else (res, units.ids == u)
        assert warm[u, hits] == source.token_counts[mask, 1].sum()
    # every resample of all units once each is the replay itself: the offset carries the cold start
    assert (warm.sum(axis=0) + offset)[hits] == cold[:, hits].sum() == res.totals()["hits"]
    assert offset[SUM_NAMES.index("requests")] == 0 and offset[hits] < 0  # a cold start loses hits
    iv = replay_intervals(warm, CI(95), offset=offset)
    assert iv["hit_rate"][0] <= res.totals()["hit_rate"] <= iv["hit_rate"][1]
    single = warm_unit_sums(routing, config, units, res, method="single")
    assert (single[0] == cold).all() and not single[1].any() and single[2] == "single"
    if rule == "sequence":
        batched = SimConfig(eviction="lru", slots=4, batch=2)
        got = warm_unit_sums(routing, batched, replay_units(routing, batched, rule), simulate(routing, batched))
        assert got[2] == "single" and not got[1].any()


def test_rotated_lru_units_of_identical_sequences_are_identical_without_a_reset():
    """LRU's state after a whole sequence is the same whichever copy precedes: counted warm, identical copies
    count alike, and only the cold start (the offset) tells the first apart."""
    routing = identical_sequences()
    config = SimConfig(eviction="lru", miss="fetch-all", slots=4)
    from moesim.simulator.rotation import warm_unit_sums

    res = simulate(routing, config)
    warm, offset, _ = warm_unit_sums(routing, config, replay_units(routing, config), res)
    assert (warm == warm[0]).all() and offset[SUM_NAMES.index("hits")] < 0
    iv = replay_intervals(warm, CI(95), timed=False, offset=offset)
    assert iv["hit_rate"][0] == iv["hit_rate"][1] == res.totals()["hit_rate"]
    plain = replay_intervals(unit_sums(res, replay_units(routing, config)), CI(95), timed=False)
    assert plain["hit_rate"][1] > plain["hit_rate"][0]  # the single replay's first copy carries the cold start


@pytest.mark.parametrize("allocation", ["per-layer", "global"])
def test_mrc_rotated_lru_counts_equal_rotated_lru_replays(allocation):
    from moesim.simulator.rotation import warm_unit_sums
    from moesim.sweeps.mrc import lru_unit_hits

    routing = random_trace("mrc-rotated", n_seq=4, T=200)
    units = assign(routing.seq, 0)
    per_unit = lru_unit_hits(routing, units, method="rotated")
    key = "per_layer" if allocation == "per-layer" else "pooled"
    hits = SUM_NAMES.index("hits")
    for n in (2, 5, 12):
        cfg = SimConfig(eviction="lru", miss="fetch-all", slots=n, allocation=allocation)
        warm, offset, _ = warm_unit_sums(routing, cfg, replay_units(routing, cfg), simulate(routing, cfg))
        assert (per_unit[key][:, n - 1] == warm[:, hits]).all() and per_unit[f"{key}_offset"][n - 1] == offset[hits]
