"""Many policies per model load, quality results keyed like sweep rows, the sweep's quality column
(measured, or estimated from the mass fit for the always-fetch-first class only) and the report's
dppl-vs-mass chart, on a tiny random checkpoint."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

pytest.importorskip("torch", reason="the [torch] extra (torch, transformers) is not installed")
pytest.importorskip("transformers", reason="the [torch] extra (transformers) is not installed")

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
import tiny_moe  # noqa: E402

from moesim.cli import cli  # noqa: E402
from moesim.simulator import SimConfig  # noqa: E402

GRID = """
evictions = ["lru"]
misses = ["threshold:0.1", "threshold:0.2", "threshold:0.3", "first-choice", "substitute"]
admits = ["none", 0.5]
slots = [4]
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("quality")
    tok = tiny_moe.make_tokenizer()
    model_dir, _, _ = tiny_moe.build("qwen3_moe", d / "model", tokenizer=tok, seed=11)
    text = d / "code.txt"
    text.write_text(tiny_moe.CODE + tiny_moe.PROSE)
    src = [str(model_dir), "--text", str(text), "--max-tokens", "96"]
    grid = d / "grid.toml"
    grid.write_text(GRID)
    q = d / "quality.parquet"
    run = CliRunner().invoke(cli, ["emulate", *src, "--window", "48", "--grid", str(grid), "-o", str(q)])
    assert run.exit_code == 0, run.output
    trace = d / "trace.parquet"
    res = CliRunner().invoke(cli, ["trace", "hf", *src, "--seq-len", "48", "-o", str(trace)])
    assert res.exit_code == 0, res.output
    return d, src, q, trace, run.output


def test_grid_rows_are_keyed_like_sweep_rows(setup):
    _, _, q, _, output = setup
    df = pl.read_parquet(q)
    assert df.height == df["config_key"].n_unique() >= 10
    assert "lru / threshold:0.2 / admit 0.5" in output
    row = df.filter((pl.col("miss") == "threshold:0.2") & (pl.col("admit") == 0.5)).row(0, named=True)
    assert row["config_key"] == SimConfig(eviction="lru", miss="threshold:0.2", admit=0.5, slots=4).key()
    assert row["fetches_first"] and row["ppl"] > 0 and row["tokens"] == 94
    presets = set(df["preset"].to_list())
    assert {"quality-first", "speed-first", "fetch-all", "llama.cpp"} <= presets
    assert df.filter(pl.col("miss") == "fetch-all")["dppl_pct"].abs().max() == 0
    assert not df.filter(pl.col("miss") == "substitute")["fetches_first"].any()


def test_a_rerun_recomputes_nothing_and_keeps_every_row(setup):
    d, src, q, _, _ = setup
    before = pl.read_parquet(q)
    res = CliRunner().invoke(cli, ["emulate", *src, "--window", "48", "--grid", str(d / "grid.toml"), "-o", str(q)])
    assert res.exit_code == 0, res.output
    assert "0 configs emulated" in res.output
    assert pl.read_parquet(q).height == before.height


def test_sweep_quality_column_measured_estimated_or_empty(setup):
    _, _, q, trace, _ = setup
    res = CliRunner().invoke(cli, ["sweep", str(trace), "--slots", "4", "--jobs", "1", "--quality", str(q),
                                   "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    qdf = pl.read_parquet(q)
    measured = dict(zip(qdf["config_key"].to_list(), qdf["dppl_pct"].to_list()))
    seen = set()
    for r in rows:
        fetches_first = r["miss"].split(":")[0] in ("fetch-all", "threshold", "first-choice", "cpu") \
            and not (r.get("reroute") or "none").startswith("bias:")   # a bias may replace the first choice
        key = r.get("grid_key") or r["config_key"]  # the join's key: the config as the grid names it (holdout)
        if key in measured:
            assert r["dppl_source"] == "measured" and r["dppl_pct"] == pytest.approx(measured[key])
            seen.add("measured")
        elif fetches_first:
            assert r["dppl_source"].startswith("estimate") and "n=" in r["dppl_source"]
            seen.add("estimate")
        else:
            assert r["dppl_pct"] is None and r["dppl_source"] is None   # never invent a number
            seen.add("none")
    assert seen == {"measured", "estimate", "none"}
    table = CliRunner().invoke(cli, ["sweep", str(trace), "--slots", "4", "--jobs", "1", "--quality", str(q)])
    assert "dppl %" in table.output and "~" in table.output and "estimate" in table.output


def test_max_dppl_ranks_only_configs_within(setup):
    _, _, q, trace, _ = setup
    res = CliRunner().invoke(cli, ["sweep", str(trace), "--slots", "4", "--jobs", "1", "--quality", str(q),
                                   "--max-dppl", "0", "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    assert rows and all(r["dppl_pct"] is not None and r["dppl_pct"] <= 0 for r in rows)
    assert sorted(r["rank"] for r in rows) == list(range(1, len(rows) + 1))
    bad = CliRunner().invoke(cli, ["sweep", str(trace), "--slots", "4", "--max-dppl", "1"])
    assert bad.exit_code == 2 and "--quality" in bad.output


def test_report_draws_dppl_against_mass_per_class(setup, tmp_path):
    _, _, q, _, _ = setup
    res = CliRunner().invoke(cli, ["report", str(q), "-o", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert "dppl_vs_mass" in manifest["files"]["charts"]
    assert (tmp_path / "rep" / manifest["files"]["charts"]["dppl_vs_mass"]["png"]).is_file()
    note = next(n for n in manifest["notes"] if "Pearson r" in n)
    assert "always fetch the first choice" in note and "n=" in note


def test_grid_rows_carry_kl_and_top1(setup):
    _, _, q, _, _ = setup
    df = pl.read_parquet(q)
    assert df["kl"].null_count() == 0 and df["kl"].min() >= 0
    assert df["top1_agreement"].min() >= 0 and df["top1_agreement"].max() <= 1
    fetch_all = df.filter(pl.col("miss") == "fetch-all")
    assert fetch_all["kl"].max() == 0 and fetch_all["top1_agreement"].min() == 1
    assert df.filter(pl.col("miss") == "substitute")["kl"].min() > 0


def test_max_kl_keeps_only_measured_configs_within(setup):
    _, _, q, trace, _ = setup
    limit = float(pl.read_parquet(q)["kl"].median())
    res = CliRunner().invoke(cli, ["sweep", str(trace), "--slots", "4", "--jobs", "1", "--quality", str(q),
                                   "--max-kl", str(limit), "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    assert rows and all(r["kl"] is not None and r["kl"] <= limit for r in rows)
    assert sorted(r["rank"] for r in rows) == list(range(1, len(rows) + 1))
    table = CliRunner().invoke(cli, ["sweep", str(trace), "--slots", "4", "--jobs", "1", "--quality", str(q)])
    assert " KL " in table.output and "KL divergence" in table.output
    bad = CliRunner().invoke(cli, ["sweep", str(trace), "--slots", "4", "--max-kl", "0.1"])
    assert bad.exit_code == 2 and "--max-kl needs --quality" in bad.output
    neg = CliRunner().invoke(cli, ["sweep", str(trace), "--slots", "4", "--quality", str(q), "--max-kl", "-1"])
    assert neg.exit_code == 2


def test_quality_files_written_before_kl_still_read(setup, tmp_path):
    _, _, q, trace, _ = setup
    old = tmp_path / "old.parquet"
    pl.read_parquet(q).drop("kl", "top1_agreement", "displaced_mass_per_step", "steps").write_parquet(old)
    from moesim.emulator.quality import read_quality

    df = read_quality(old)
    assert df["kl"].null_count() == df.height and df["top1_agreement"].null_count() == df.height
    res = CliRunner().invoke(cli, ["sweep", str(trace), "--slots", "4", "--jobs", "1", "--quality", str(old),
                                   "--format", "json"])
    assert res.exit_code == 0, res.output
    assert all(r["kl"] is None for r in json.loads(res.stdout)["rows"])
    rep = CliRunner().invoke(cli, ["report", str(old), "-o", str(tmp_path / "rep")])
    assert rep.exit_code == 0, rep.output
    charts = json.loads((tmp_path / "rep" / "report.json").read_text())["files"]["charts"]
    assert "dppl_vs_mass" in charts and "kl_vs_mass" not in charts


def test_report_draws_kl_against_moved_mass(setup, tmp_path):
    _, _, q, _, _ = setup
    res = CliRunner().invoke(cli, ["report", str(q), "-o", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert (tmp_path / "rep" / manifest["files"]["charts"]["kl_vs_mass"]["png"]).is_file()
    note = next(n for n in manifest["notes"] if "KL vs" in n)
    assert "KL vs substituted mass" in note   # no config here reroutes: the substituted mass alone


def test_moved_mass_names_the_displaced_mass_when_the_results_have_it():
    from moesim.emulator.quality import moved_mass

    # the replay's mass per step already holds the displaced mass (docs/replay-semantics.md)
    df = pl.DataFrame({"mass_per_step": [0.1, 0.25, 0.3], "displaced_mass_per_step": [None, 0.05, 0.3]},
                      schema_overrides={"displaced_mass_per_step": pl.Float64})
    out, what = moved_mass(df)
    assert what == "displaced + substituted" and out["moved_per_step"].to_list() == [0.1, 0.25, 0.3]
    out, what = moved_mass(df.with_columns(pl.lit(0.0, dtype=pl.Float64).alias("displaced_mass_per_step")))
    assert what == "substituted" and out["moved_per_step"].to_list() == [0.1, 0.25, 0.3]
