"""Sweep grids: the default grid, presets, the speed-up baseline, TOML files, flags over files."""

import pytest

from moesim.errors import MoesimError
from moesim.sweeps.grid import (
    PRESETS,
    Grid,
    axis,
    baseline_label,
    baseline_of,
    baseline_policy,
    canonical,
    expand,
    grid_from_doc,
    load_toml,
    never_cached,
)
from moesim.sweeps.run import preset_names


def configs(grid):
    return [p.config for p in expand(grid)]


def test_default_grid_has_40_distinct_configs_per_budget_with_every_preset():
    every = configs(Grid(budgets=[0.25], scored=False))
    # 6 x 5 x 2 = 60 - 15 - 5 - 4 = 36, + the llama.cpp preset (static-layers + cpu), + 3 prefetch variants
    assert len(every) == 40 and len({c.key() for c in every}) == 40
    prefetching = [(c.eviction, c.miss, c.prefetch) for c in every if c.prefetch != "none"]
    assert prefetching == [("lru", "fetch-all", "oracle"), ("lru", "fetch-all", "next-layer"),
                           ("belady", "fetch-all", "oracle")]
    cfgs = [c for c in every if c.prefetch == "none"]
    assert {c.eviction for c in cfgs} == {"lru", "lfu", "freq", "fifo", "static", "static-layers", "belady"}
    assert {c.miss for c in cfgs} == {"fetch-all", "threshold:0.15", "first-choice", "substitute", "cpu"}
    names = {n for c in cfgs for n in preset_names(c).split(",") if n}
    assert names == set(PRESETS)
    # admission only where it can act
    for c in cfgs:
        if c.admit is not None:
            assert c.miss in ("threshold:0.15", "first-choice", "substitute") and not c.pinned
    # substitute without admission on a cold unpinned cache drops everything: left out by default
    assert not [c for c in cfgs if c.miss == "substitute" and c.admit is None and not c.pinned]
    # nothing is ever cached under cpu without pinning: one replay, kept once (under lru), not five times
    assert [c.eviction for c in cfgs if c.miss == "cpu" and never_cached(c)] == ["lru"]
    assert {c.eviction for c in cfgs if c.miss == "cpu"} == {"lru", "static", "static-layers"}
    assert len(configs(Grid(budgets=[0.125, 0.25, 0.5], scored=False))) == 120
    # traces with candidate scores add 8 reroute rows per budget: lru and freq under fetch-all, bias:λ for three
    # strengths and keep:2
    scored = configs(Grid(budgets=[0.25]))
    assert sorted((c.eviction, c.reroute) for c in scored if c.reroute) == sorted(
        (e, r) for e in ("lru", "freq") for r in ("bias:0.1", "bias:0.25", "bias:0.5", "keep:2"))
    assert len(scored) == 48 and {c.miss for c in scored if c.reroute} == {"fetch-all"}
    # a prefetch axis replaces the variants: every eviction x miss x admission x prefetch
    axis = configs(Grid(budgets=[0.25], evictions=["lru"], misses=["fetch-all"], prefetches=["none", "oracle"]))
    assert [c.label() for c in axis if c.prefetch != "none"] == ["lru / fetch-all / 0.25 budget / pf oracle"]


def test_every_group_has_the_one_baseline():
    cfgs = configs(Grid(budgets=[0.25], evictions=["belady"], misses=["first-choice"], admits=[0.5]))
    keys = {c.key() for c in cfgs}
    for c in cfgs:
        assert baseline_of(c).key() in keys
    # the presets came along; the baseline is the fetch-all preset, not fetch-all under each eviction
    assert {preset_names(c) for c in cfgs} >= {"quality-first", "speed-first", "fetch-all", "llama.cpp"}
    fetch_all = {(c.eviction, c.miss) for c in cfgs if c.miss == "fetch-all" and c.prefetch == "none"}
    assert fetch_all == {("lru", "fetch-all")}
    # another baseline is added to the grid instead
    cfgs = configs(Grid(budgets=[0.25], evictions=["belady"], misses=["first-choice"], admits=[0.5], presets=False,
                        baseline="freq/fetch-all"))
    assert sorted(c.label() for c in cfgs) == ["belady / first-choice / admit 0.5 / 0.25 budget",
                                               "freq / fetch-all / 0.25 budget"]


@pytest.mark.parametrize("spec, policy, label", [
    ("fetch-all", ("lru", "fetch-all", None), "lru / fetch-all (fetch-all preset)"),
    ("lru/fetch-all", ("lru", "fetch-all", None), "lru / fetch-all (fetch-all preset)"),
    ("freq / threshold:0.15 / admit 0.5", ("freq", "threshold:0.15", 0.5),
     "freq / threshold:0.15 / admit 0.5 (quality-first preset)"),
    ("llama.cpp", ("static-layers", "cpu", None), "static-layers / cpu (llama.cpp preset)"),
    ("belady/fetch-all", ("belady", "fetch-all", None), "belady / fetch-all"),
])
def test_baseline_specs_and_labels_read_back(spec, policy, label):
    assert baseline_policy(spec) == policy and baseline_label(spec) == label
    assert baseline_policy(label) == policy  # the label stored in results files parses back


@pytest.mark.parametrize("spec", ["nope", "lru", "lru/fetch-all/admit x", "mru/fetch-all"])
def test_bad_baselines_are_one_line_errors(spec):
    with pytest.raises(MoesimError):
        baseline_policy(spec)


def test_presets_can_be_left_out_and_explicit_axes_are_kept_verbatim():
    cfgs = configs(Grid(slots=[8], evictions=["lru"], misses=["substitute", "cpu"], admits=[None], presets=False))
    assert sorted(c.label() for c in cfgs) == ["lru / cpu / 8 slots", "lru / fetch-all / 8 slots",
                                               "lru / substitute / 8 slots"]
    # explicit evictions with the default miss axis: the never-cached cpu replay is still kept once
    cfgs = configs(Grid(slots=[8], evictions=["freq", "belady"], admits=[None], presets=False))
    assert [c.eviction for c in cfgs if c.miss == "cpu"] == ["freq"]


def test_admission_that_cannot_act_is_canonicalized():
    from moesim.simulator.config import SimConfig

    a = canonical(SimConfig(eviction="static", miss="threshold:0.15", admit=0.5, budget=0.25))
    assert a.admit is None
    b = canonical(SimConfig(eviction="lru", miss="fetch-all", admit=0.5, budget=0.25))
    assert b == SimConfig(eviction="lru", miss="fetch-all", budget=0.25)


def test_toml_ranges_and_flag_override(tmp_path):
    f = tmp_path / "sweep.toml"
    f.write_text('budgets = {start = 0.1, stop = 0.3, step = 0.1}\neviction = ["lru", "freq:64"]\n'
                 'miss = ["fetch-all"]\ntheta = [0.1, 0.2]\nadmit = ["none", 0.5]\n'
                 'allocation = ["per-layer", "global"]\n'
                 'hw = ["rtx3090-pcie4", "rtx4090-pcie4"]\nwarmup_tokens = 10\n')
    g = load_toml(f)
    assert g.budgets == [0.1, 0.2, 0.3]
    assert g.evictions == ["lru", "freq:64"] and g.thetas == [0.1, 0.2] and g.admits == [None, 0.5]
    assert g.warmup_tokens == 10 and g.hws == ["rtx3090-pcie4", "rtx4090-pcie4"]
    cfgs = expand(g)
    assert {p.hw for p in cfgs} == {"rtx3090-pcie4", "rtx4090-pcie4"}
    assert {p.config.miss for p in cfgs} >= {"threshold:0.1", "threshold:0.2", "fetch-all"}
    assert all(p.config.warmup_tokens == 10 for p in cfgs)
    # a flag replaces its axis only; --budget also replaces the file's slots
    g2 = g.override(budgets=axis("budgets", ["0.5"]), evictions=None)
    assert g2.budgets == [0.5] and g2.slots == [] and g2.evictions == ["lru", "freq:64"]
    # the [sweep] table form and the dict form are the same grid
    f2 = tmp_path / "wrapped.toml"
    f2.write_text("[sweep]\nslots = \"4:16:4\"\n")
    assert load_toml(f2).slots == [4, 8, 12, 16]
    assert grid_from_doc({"slots": [4, 8]}).slots == [4, 8]


@pytest.mark.parametrize("text, msg", [
    ("bogus = 1\n", "unknown sweep key"),
    ("budgets = {start = 0.5, stop = 0.1, step = 0.1}\n", "bad range"),
    ("slots = [1.5]\n", "whole number"),
    ("budgets = [0.25\n", "not valid TOML"),
    ("warm = 3\n", "true or false"),
])
def test_bad_toml_is_one_clear_error(tmp_path, text, msg):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(MoesimError, match=msg):
        load_toml(f)


def test_no_cache_size_and_bad_values():
    with pytest.raises(MoesimError, match="cache size"):
        expand(Grid())
    with pytest.raises(MoesimError, match="unknown eviction"):
        expand(Grid(budgets=[0.25], evictions=["mru"]))
    with pytest.raises(MoesimError, match="budget must be"):
        expand(Grid(budgets=[1.5]))
