"""--ci on the commands and the API: ± in the tables, low/high columns in the results Parquet (resumed and
re-levelled without replaying, old files still read), paired speed-ups, the vs-best flag, error bars in the
chart specs, intervals in mrc and profile."""

from __future__ import annotations

import json

import polars as pl
import pytest
from sweep_helpers import run_cli, small_trace

import moesim
from moesim.sweeps.schema import INTERVAL_STATISTICS, ROW_SCHEMA


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return small_trace(tmp_path_factory.mktemp("ci"), seqs=4)


@pytest.fixture(scope="module")
def swept(trace, tmp_path_factory):
    out = tmp_path_factory.mktemp("ci-out") / "r.parquet"
    # in sample (--holdout 0): every one of the 4 sequences is a resampling unit
    res = run_cli("sweep", trace, "--budget", "0.25", "--ci", "95", "-o", out, "--jobs", "1", "--holdout", "0")
    return out, res


def test_sweep_table_shows_intervals_and_the_file_has_them(swept):
    out, res = swept
    text = res.stdout
    assert "±" in text and "vs best" in text
    assert "± = half the 95% interval: percentile bootstrap over 4 sequences (few units: a coarse interval)" in \
        " ".join(text.split())
    rows = pl.read_parquet(out)
    assert list(rows.columns) == list(ROW_SCHEMA)
    for name in INTERVAL_STATISTICS:
        assert rows[f"{name}_low"].is_not_null().all() and rows[f"{name}_high"].is_not_null().all(), name
        assert (rows[f"{name}_low"] <= rows[f"{name}_high"]).all()
    for name in ("hit_rate", "mass_per_step", "s_per_token", "speedup"):
        assert ((rows[f"{name}_low"] <= rows[name] + 1e-12) & (rows[name] <= rows[f"{name}_high"] + 1e-12)).all()
    assert set(rows["ci_level"]) == {95.0} and set(rows["ci_resamples"]) == {1000}
    assert set(rows["ci_unit"]) == {"sequence"} and set(rows["ci_units"]) == {4}
    base = rows.filter(pl.col("preset").str.contains("fetch-all")).row(0, named=True)
    assert base["speedup_low"] == base["speedup_high"] == 1.0  # paired: the baseline against itself
    best = rows.filter(pl.col("rank") == 1).row(0, named=True)
    assert best["overlaps_best"] is True
    # an unpaired reading: the rows that overlap the best are those whose time interval meets its interval
    kept = rows.filter(pl.col("keeps_first_choice"))
    meets = ((kept["s_per_token_low"] <= best["s_per_token_high"])
             & (best["s_per_token_low"] <= kept["s_per_token_high"]))
    assert (kept["overlaps_best"] == meets).all()


def test_resume_adds_intervals_and_relevels_without_replaying(trace, tmp_path):
    out = tmp_path / "r.parquet"
    run_cli("sweep", trace, "-b", "0.25", "-e", "lru", "-e", "freq", "-o", out, "--jobs", "1")
    plain = pl.read_parquet(out)
    assert plain["hit_rate_low"].is_null().all() and plain["ci_unit_sums"].is_null().all()
    res = run_cli("sweep", trace, "-b", "0.25", "-e", "lru", "-e", "freq", "--ci", "95", "-o", out, "--jobs", "1")
    assert f"{plain.height} computed, 0 already in" in res.stderr  # replayed again for their unit sums
    with_ci = pl.read_parquet(out)
    layers = pl.read_parquet(out.with_name("r.layers.parquet"))
    assert with_ci.height == plain.height and with_ci["hit_rate_low"].is_not_null().all()
    assert layers.height == plain.height * layers["layer"].n_unique()  # replaced, not duplicated
    assert with_ci.sort("row_key")["hits"].to_list() == plain.sort("row_key")["hits"].to_list()
    res = run_cli("sweep", trace, "-b", "0.25", "-e", "lru", "-e", "freq", "--ci", "80", "-o", out, "--jobs", "1")
    assert f"0 computed, {plain.height} already in" in res.stderr
    narrow = pl.read_parquet(out).sort("row_key")
    wide = with_ci.sort("row_key")
    assert set(narrow["ci_level"]) == {80.0}
    assert ((narrow["hit_rate_high"] - narrow["hit_rate_low"]) <= (wide["hit_rate_high"] - wide["hit_rate_low"])
            + 1e-15).all()
    # without --ci the rows keep their intervals and nothing is replayed
    res = run_cli("sweep", trace, "-b", "0.25", "-e", "lru", "-e", "freq", "-o", out, "--jobs", "1",
                  "--format", "json")
    assert "0 computed" in res.stderr and json.loads(res.stdout)["ci"]["levels"] == [80.0]
    # a file written before intervals existed (no ci columns) resumes and reports
    old = tmp_path / "old.parquet"
    plain.drop([c for c in plain.columns if c.startswith("ci_") or c.endswith(("_low", "_high"))
                or c == "overlaps_best"]).write_parquet(old)
    layers.write_parquet(tmp_path / "old.layers.parquet")
    res = run_cli("sweep", trace, "-b", "0.25", "-e", "lru", "-e", "freq", "-o", old, "--jobs", "1")
    assert "0 computed" in res.stderr
    from moesim.reports.report import load_results

    assert load_results(old).rows["hit_rate_low"].is_null().all()
    res = run_cli("sweep", trace, "-b", "0.25", "-e", "lru", "-o", old, "--jobs", "1", "--ci", "95")
    computed = int(res.stderr.split(" computed")[0].split()[-1])
    again = pl.read_parquet(old)
    assert again.height == plain.height and again["hit_rate_low"].is_not_null().sum() == computed > 0


def test_csv_json_markdown_latex_carry_the_intervals(swept, trace):
    out, _ = swept
    args = ["sweep", trace, "--budget", "0.25", "-o", out, "--holdout", "0"]
    csv_text = run_cli(*args, "--format", "csv").stdout
    head = csv_text.splitlines()[0].split(",")
    assert "hit_rate_low" in head and "speedup_high" in head and "ci_unit_sums" not in head
    js = json.loads(run_cli(*args, "--format", "json").stdout)
    assert js["ci"]["levels"] == [95.0] and js["ci"]["units"] == ["4 sequences"]
    assert js["rows"][0]["hit_rate_low"] is not None
    md = run_cli(*args, "--format", "markdown").stdout
    assert "±" in md and "vs best" in md
    tex = run_cli(*args, "--format", "latex").stdout
    assert r"$\pm$" in tex and "±" not in tex


def test_simulate_ci(trace):
    res = run_cli("simulate", trace, "-e", "freq", "-m", "threshold:0.15", "--admit", "0.5", "-b", "0.25",
                  "--ci", "90")
    assert "±" in res.stdout and "90% interval: percentile bootstrap over 4 sequences" in " ".join(res.stdout.split())
    doc = json.loads(run_cli("simulate", trace, "-e", "lru", "-b", "0.25", "--ci", "95", "--format", "json").stdout)
    c = doc["ci"]
    assert c["level"] == 95 and c["units"] == 4 and c["intervals"]["speedup"] == [1.0, 1.0]
    lo, hi = c["intervals"]["hit_rate"]
    assert lo <= doc["totals"]["hit_rate"] <= hi
    single = json.loads(run_cli("simulate", trace, "-e", "lru", "-b", "0.25", "--ci", "95", "--ci-unit", "block",
                                "--format", "json").stdout)["ci"]
    assert single["unit"] == "block" and single["units"] == 3 and single["block_steps"] == 66  # 200 tokens: 66, 67, 67
    bad = run_cli("simulate", trace, "-e", "lru", "-b", "0.25", "--ci-resamples", "10", ok=False)
    assert bad.exit_code == 2 and "need --ci" in bad.output
    bad = run_cli("simulate", trace, "-e", "lru", "-b", "0.25", "--ci", "99.9", ok=False)
    assert bad.exit_code == 2 and "2000 resamples" in bad.output


def test_mrc_and_profile_ci(trace, tmp_path):
    res = run_cli("mrc", trace, "-e", "lru", "-e", "fifo", "--allocation", "per-layer", "--slots-grid", "8,16",
                  "--ci", "95", "-o", tmp_path / "c.parquet", "--jobs", "1")
    assert "±" in res.stdout
    curve = pl.read_parquet(tmp_path / "c.parquet")
    assert curve["hit_rate_low"].is_not_null().all() and set(curve["ci_units"]) == {4}
    prof = run_cli("profile", trace, "--ci", "95", "--budget", "0.25")
    assert "±" in prof.stdout and "reuse chance, working set and domain similarity have none" in prof.stdout
    d = json.loads(run_cli("profile", trace, "--ci", "95", "--budget", "0.25", "--format", "json").stdout)
    assert list(d)[-1] == "ci" and "working_set_95" in d["ci"]["without_interval"]
    assert set(d["cache"]["hit_rate_interval"]) == {"lru", "lfu", "static", "belady"}


def test_api_ci(trace):
    routing = moesim.load_trace(trace)
    one = moesim.simulate(routing, eviction="freq", miss="first-choice", admit=0.5, budget=0.25, ci=95)
    r = one.row(0, named=True)
    assert r["ci_level"] == 95 and r["hit_rate_low"] <= r["hit_rate"] <= r["hit_rate_high"]
    df = moesim.sweep(routing, budgets=0.25, evictions=["lru"], misses=["fetch-all", "first-choice"],
                      admits=[None], ci=95, ci_resamples=200, jobs=1)
    assert df["s_per_token_low"].is_not_null().all() and set(df["ci_resamples"]) == {200}
    curve = moesim.mrc(routing, evictions="lru", allocations="per-layer", ci=95)
    assert curve["hit_rate_low"].is_not_null().all() and curve.height == routing.n_experts
    with pytest.raises(moesim.MoesimError, match="confidence level"):
        moesim.simulate(routing, eviction="lru", budget=0.25, ci="95")


def test_report_charts_draw_error_bars(swept, trace, tmp_path):
    out, _ = swept
    from moesim.reports.report import build_report
    from moesim.simulator.bootstrap import CI

    manifest = build_report(tmp_path / "rep", results=out, trace=trace, ci=CI(95))
    charts = manifest["files"]["charts"]
    for name in ("time_vs_mass", "speedup", "hit_rate_vs_budget"):
        spec = (tmp_path / "rep" / charts[name]["spec"]).read_text()
        assert '"errorbar"' in spec, name
    md = (tmp_path / "rep" / manifest["files"]["tables"]["policies"]["Markdown"]).read_text()
    assert "±" in md and "confidence interval" in md
    csv_head = (tmp_path / "rep" / manifest["files"]["tables"]["policies"]["CSV"]).read_text().splitlines()[0]
    assert "hit (%) low" in csv_head and "speed-up (×) high" in csv_head
    prof_md = (tmp_path / "rep" / manifest["files"]["tables"]["routing_profile"]["Markdown"]).read_text()
    assert "±" in prof_md


def test_export_ci(trace, tmp_path):
    res = run_cli("export", trace, "-b", "0.25", "--policy", "static", "--format", "json", "-o", tmp_path / "p.json",
                  "--ci", "95")
    assert "±" in res.output and "95% interval over 4 sequences" in res.output
    e = json.loads((tmp_path / "p.json").read_text())["expected"]
    lo, hi = e["intervals"]["hit_rate"]
    assert lo <= e["hit_rate"] <= hi and e["ci_level"] == 95
