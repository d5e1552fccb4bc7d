"""The Python API: moesim.load_trace / simulate / sweep / mrc return polars DataFrames that agree with
the CLI and the replay engine."""

import subprocess
import sys

import polars as pl
import pytest
from sweep_helpers import run_cli, small_trace

import moesim
from moesim.simulator import simulate as raw_simulate


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return small_trace(tmp_path_factory.mktemp("api"))


@pytest.fixture(scope="module")
def routing(trace):
    return moesim.load_trace(trace)


def test_import_moesim_stays_light():
    code = "import sys, moesim; print(sorted(m for m in ('numba', 'polars', 'pyarrow') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert {"load_trace", "simulate", "sweep", "mrc"} <= set(moesim.__all__)
    assert {"load_trace", "simulate", "sweep", "mrc", "MoesimError"} <= set(dir(moesim))


def test_simulate_is_one_row_matching_the_engine(routing):
    df = moesim.simulate(routing, eviction="freq", miss="threshold:0.15", admit=0.5, budget=0.25)
    assert isinstance(df, pl.DataFrame) and df.height == 1
    r = df.row(0, named=True)
    assert r["preset"] == "quality-first" and r["synthetic"] is True
    from moesim.costmodel.pricing import cost_for_trace

    cost, _ = cost_for_trace(routing.meta)
    res = raw_simulate(routing, eviction="freq", miss="threshold:0.15", admit=0.5, budget=0.25, cost=cost)
    base = raw_simulate(routing, eviction="lru", miss="fetch-all", budget=0.25, cost=cost)  # the fetch-all preset
    assert r["hits"] == res.totals()["hits"] and r["mass"] == pytest.approx(res.totals()["mass"])
    assert r["s_per_token"] == pytest.approx(res.timing["s_per_token"])
    assert r["speedup"] == pytest.approx(base.timing["s_per_token"] / res.timing["s_per_token"])
    assert r["baseline"] == "lru / fetch-all (fetch-all preset)" and r["keeps_first_choice"] is True
    other = moesim.simulate(routing, eviction="freq", miss="threshold:0.15", admit=0.5, budget=0.25,
                            baseline="freq/fetch-all").row(0, named=True)
    freq = raw_simulate(routing, eviction="freq", miss="fetch-all", budget=0.25, cost=cost)
    assert other["speedup"] == pytest.approx(freq.timing["s_per_token"] / res.timing["s_per_token"])
    one, layers = moesim.simulate(routing, eviction="lru", slots=8, layers=True)
    assert layers.height == routing.n_layers and layers["hits"].sum() == one["hits"][0]
    with pytest.raises(moesim.MoesimError, match="budget"):
        moesim.simulate(routing, eviction="lru")


def test_sweep_equals_the_cli_and_accepts_a_dict_grid(routing, trace, tmp_path):
    df = moesim.sweep(trace, budgets=0.25, evictions=["lru", "belady"], admits=[None, 0.5], jobs=1)
    out = tmp_path / "cli.parquet"
    run_cli("sweep", trace, "-b", "0.25", "-e", "lru", "-e", "belady", "--admit", "none", "--admit", "0.5",
            "-o", out, "--jobs", "1")
    assert df.equals(pl.read_parquet(out))
    top = moesim.sweep(routing, config={"budgets": {"start": 0.125, "stop": 0.25, "step": 0.125},
                                        "eviction": ["lru"], "miss": ["fetch-all", "first-choice"],
                                        "admit": ["none"]}, top=2, jobs=1)
    assert sorted(top["budget"].unique().to_list()) == [0.125, 0.25]
    assert top.group_by("budget").len()["len"].to_list() == [2, 2]
    capped = moesim.sweep(routing, budgets=0.25, evictions=["lru"], max_mass=0.05, rank_by="time", jobs=1)
    assert capped.height and (capped["mass_per_step"] <= 0.05).all() and capped["s_per_token"].is_sorted()


def test_mrc_returns_the_curve(routing):
    curve = moesim.mrc(routing, evictions="lru", allocations="per-layer")
    assert curve.height == routing.n_experts
    assert curve["hit_rate"].is_sorted() and curve["hit_rate"][-1] < 1.0
    curve2, layers = moesim.mrc(routing, evictions=["fifo"], slots=[16], layers=True)
    assert curve2["method"].to_list() == ["replay", "replay"] and layers.height == 2 * routing.n_layers
