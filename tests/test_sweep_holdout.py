"""A sweep that ranks a learned static placement learns it out of sample: from a holdout prefix that no row counts
(sweeps/holdout.py), stated in the table's title; --holdout 0 learns in sample; bad fractions are one line."""

import pytest
from sweep_helpers import TOKENS, run_cli, small_trace

from moesim import api
from moesim.simulator import SimConfig, simulate
from moesim.traces import load_routing


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return small_trace(tmp_path_factory.mktemp("holdout"))


def test_every_row_counts_the_tokens_after_the_holdout(trace):
    rows = api.sweep(trace, budgets=0.25, evictions=["lru", "static", "static:30"], misses=["fetch-all", "cpu"],
                     admits=[None], presets=False)
    held = TOKENS // 4
    assert set(rows["holdout_tokens"]) == {held} and set(rows["warmup_tokens"]) == {held}
    assert set(rows["counted_tokens"]) == {TOKENS - held}
    evictions = set(rows["eviction"])
    assert f"static:{held}" in evictions and "static:30" in evictions and "static" not in evictions
    # the row is the replay of static learned from the prefix, counted after it
    routing = load_routing(trace)
    row = rows.filter((rows["eviction"] == f"static:{held}") & (rows["miss"] == "cpu")).row(0, named=True)
    want = simulate(routing, SimConfig(eviction=f"static:{held}", miss="cpu", budget=0.25, warmup_tokens=held))
    assert row["hits"] == want.totals()["hits"]
    inside = simulate(routing, SimConfig(eviction="static", miss="cpu", budget=0.25, warmup_tokens=held))
    assert row["hits"] <= inside.totals()["hits"]  # in sample it could only look better


def test_holdout_zero_learns_in_sample_and_no_learned_placement_means_no_holdout(trace):
    rows = api.sweep(trace, budgets=0.25, evictions=["lru", "static"], misses=["fetch-all"], admits=[None],
                     presets=False, holdout=0)
    assert set(rows["eviction"]) == {"lru", "static"} and set(rows["warmup_tokens"]) == {0}
    rows = api.sweep(trace, budgets=0.25, evictions=["lru", "fifo"], misses=["fetch-all"], admits=[None],
                     presets=False)
    assert set(rows["holdout_tokens"]) == {0} and set(rows["counted_tokens"]) == {TOKENS}
    rows = api.sweep(trace, budgets=0.25, evictions=["lru"], misses=["fetch-all"], admits=[None], presets=False,
                     holdout=0.5)
    assert set(rows["counted_tokens"]) == {TOKENS // 2}


def test_the_title_says_so(trace):
    out = run_cli("sweep", trace, "--budget", "0.25", "-e", "static", "-e", "lru", "-m", "cpu", "--admit", "none")
    text = " ".join(line.strip() for line in out.output.splitlines())
    assert f"first {TOKENS // 4} tokens not counted (static placements learned from the first {TOKENS // 4}: out of " \
           "sample)" in text


@pytest.mark.parametrize("value", ["1", "-0.1", "nan", "1.5", "x"])
def test_bad_holdout_is_one_line(trace, value):
    out = run_cli("sweep", trace, "--budget", "0.25", "--holdout", value, ok=False)
    assert out.exit_code == 2, out.output
    lines = [x for x in out.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("moesim: error: "), out.output


def test_measured_quality_joins_the_rows_of_a_holdout_sweep(trace, tmp_path):
    """The holdout changes the replayed configs' keys (warm-up, static's prefix), not the policy whose quality
    was measured: --quality joins on the grid's key."""
    import json

    from quality_helpers import write_quality

    q = write_quality(tmp_path / "q.parquet")
    out = run_cli("sweep", trace, "--budget", "0.25", "-e", "lru", "-e", "static", "-m", "fetch-all", "-m",
                  "first-choice", "--admit", "none", "--quality", q, "--format", "json")
    rows = json.JSONDecoder().raw_decode(out.output[out.output.index("{"):])[0]["rows"]  # (notes follow on stderr)
    assert {r["holdout_tokens"] for r in rows} == {TOKENS // 4}
    lru = {r["miss"]: r for r in rows if r["eviction"] == "lru"}
    assert lru["first-choice"]["dppl_source"] == "measured" and lru["first-choice"]["dppl_pct"] == pytest.approx(2.0)
    assert lru["first-choice"]["grid_key"] == SimConfig(eviction="lru", miss="first-choice", budget=0.25).key()
