"""`moesim sweep`: the ranked table, JSON/CSV/Markdown/LaTeX outputs, presets, the keyed Parquet files."""

import csv
import io
import json
import math
import re

import polars as pl
import pytest
from sweep_helpers import run_cli, small_trace

from moesim.sweeps.ranking import pareto_front
from moesim.sweeps.store import ROW_SCHEMA, layers_path


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return small_trace(tmp_path_factory.mktemp("sweep"))


@pytest.fixture(scope="module")
def swept(trace, tmp_path_factory):
    """One default sweep at two budgets, stored; the format tests print from the stored rows."""
    out = tmp_path_factory.mktemp("out") / "r.parquet"
    res = run_cli("sweep", trace, "--budget", "0.125", "--budget", "0.25", "-o", out, "--jobs", "2")
    return out, res.stdout


def parse_tables(text):
    """The terminal tables back into dicts: columns are where the dashes under the header are."""
    tables = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("-") and set(line) <= {"-", " "}:
            spans = [m.span() for m in re.finditer(r"-+", line)]
            head = lines[i - 1]
            names = [head[a:b if j < len(spans) - 1 else None].strip() for j, (a, b) in enumerate(spans)]
            rows = []
            for row in lines[i + 1:]:
                if not row or not row[:spans[0][1]].strip().isdigit():
                    break
                cells = [row[a:spans[j + 1][0] if j + 1 < len(spans) else None].strip()
                         for j, (a, _) in enumerate(spans)]
                rows.append(dict(zip(names, cells)))
            tables.append((lines[i - 2], rows))
    return tables


def test_table_is_ranked_by_time_per_token_with_presets_and_synthetic_title(swept):
    out, text = swept
    tables = parse_tables(text)
    assert len(tables) == 2
    for title, rows in tables:
        assert "SYNTHETIC trace" in title and "ranked by time per token" in title
        assert len(rows) == 42 and [r["#"] for r in rows] == [str(i) for i in range(1, 43)]
        ms = [float(r["ms/token"]) for r in rows]
        assert ms == sorted(ms)
        presets = {r["preset"]: r["policy"] for r in rows if r["preset"]}
        assert presets == {"quality-first": "freq / threshold:0.15 / admit 0.5",
                           "speed-first": "freq / first-choice / admit 0.5",
                           "fetch-all": "lru / fetch-all", "llama.cpp": "static-layers / cpu"}
        assert {r["policy"] for r in rows if r["speed-up"] == "1.00"} >= {"lru / fetch-all", "belady / fetch-all"}
    assert "budget 0.125 (16 slots per layer)" in tables[0][0] and "budget 0.25 (32 slots per layer)" in tables[1][0]


def test_parquet_rows_and_layers_keyed_by_trace_config_and_cost(swept, trace):
    out, _ = swept
    df = pl.read_parquet(out)
    lay = pl.read_parquet(layers_path(out))
    assert df.height == 84 and df["row_key"].n_unique() == 84
    assert list(df.columns[: len(ROW_SCHEMA)]) == list(ROW_SCHEMA)
    assert df["synthetic"].all() and df["priced"].all()
    assert (df["row_key"] == df["trace_digest"] + ":" + df["config_key"] + ":" + df["cost_key"]).all()
    assert lay.height == 84 * 48 and set(lay["row_key"]) == set(df["row_key"])
    # layer rows add up to the config's totals
    sums = lay.group_by("row_key").agg(pl.col("hits").sum(), pl.col("requests").sum())
    j = df.join(sums, on="row_key", suffix="_l")
    assert (j["hits"] == j["hits_l"]).all() and (j["requests"] == j["requests_l"]).all()
    # the speed-up divides by fetch-all with the same eviction and budget
    for r in df.filter(pl.col("miss") == "first-choice").to_dicts():
        base = df.filter((pl.col("eviction") == r["eviction"]) & (pl.col("miss") == "fetch-all")
                         & (pl.col("budget") == r["budget"]))
        assert base.height == 1
        assert r["speedup_vs_fetch_all"] == pytest.approx(base["s_per_token"][0] / r["s_per_token"])
    # ranks are 1..42 in each budget, best time first
    for b in (0.125, 0.25):
        part = df.filter(pl.col("budget") == b).sort("rank")
        assert part["rank"].to_list() == list(range(1, 43))
        assert part["s_per_token"].is_sorted()


def test_pareto_flags_match_a_brute_force_check(swept):
    df = pl.read_parquet(swept[0]).filter(pl.col("budget") == 0.25)
    pts = list(zip(df["s_per_token"], df["mass_per_step"]))
    for (x, y), flag in zip(pts, df["pareto"]):
        dominated = any(a <= x and b <= y and (a < x or b < y) for a, b in pts)
        assert flag == (not dominated)
    assert df["pareto"].any()
    assert pareto_front([(1.0, 2.0), (2.0, 1.0), (2.0, 2.0), (1.0, 2.0), (math.nan, 0.0)]) == \
        [True, True, False, True, False]


def test_rerun_prints_the_same_rows_from_the_file_in_every_format(swept, trace):
    out, _ = swept
    args = ["sweep", trace, "--budget", "0.125", "--budget", "0.25", "-o", out]
    js = json.loads(run_cli(*args, "--format", "json").stdout)
    assert js["synthetic"] is True and js["ranked_by"] == ["time per token"]
    assert len(js["rows"]) == 84 and {r["row_key"] for r in js["rows"]} == set(pl.read_parquet(out)["row_key"])
    rows = list(csv.DictReader(io.StringIO(run_cli(*args, "--format", "csv").stdout)))
    assert len(rows) == 84 and all(r["synthetic"] == "true" for r in rows)
    assert [r["row_key"] for r in rows] == [r["row_key"] for r in js["rows"]]
    md = run_cli(*args, "--format", "markdown", "--top", "5").stdout
    assert md.count("SYNTHETIC trace") == 2 and md.count("| 5 |") == 2 and "| 6 |" not in md


def test_latex_table_parses(swept, trace):
    tex = run_cli("sweep", trace, "--budget", "0.25", "-o", swept[0], "--format", "latex").stdout
    assert tex.count(r"\begin{tabular}") == 1 and tex.count(r"\end{tabular}") == 1
    caption = re.search(r"\\caption\{(.*)\}", tex).group(1)
    assert "SYNTHETIC trace" in caption
    spec = re.search(r"\\begin\{tabular\}\{(\w+)\}", tex).group(1)
    body = tex.split(r"\begin{tabular}")[1].split(r"\end{tabular}")[0]
    rows = [line for line in body.splitlines() if line.endswith(r"\\")]
    assert len(rows) == 43  # header + 42 configs
    for line in rows:
        cells = re.split(r"(?<!\\)&", line[: -2])
        assert len(cells) == len(spec), line
    assert "%" not in re.sub(r"\\%", "", tex)  # every percent sign escaped


def test_unpriced_trace_ranks_by_hit_rate_and_says_so(trace):
    import dataclasses

    from moesim.sweeps.grid import Grid
    from moesim.sweeps.run import run_sweep
    from moesim.traces import load_routing

    r = load_routing(trace)
    r.meta = dataclasses.replace(r.meta, model_id="someone/unknown-moe")  # no model preset matches: unpriced
    out = run_sweep(r, Grid(budgets=[0.25], evictions=["lru", "belady"]), jobs=1)
    df = out.rows
    assert not df["priced"].any() and set(df["ranked_by"]) == {"hit rate (not priced)"}
    assert df.sort("rank")["hit_rate"].is_sorted(descending=True)
    assert df["s_per_token"].is_null().all() and df["speedup_vs_fetch_all"].is_null().all()
    from moesim.reports.tables import render, sweep_tables

    text = render(sweep_tables(df), "table")
    assert "not priced" in text and "ms/token" not in text


def test_errors_are_one_line(trace, tmp_path):
    res = run_cli("sweep", trace, ok=False)
    assert res.exit_code == 2 and "--budget" in res.output
    res = run_cli("sweep", trace, "--budget", "0.25", "-o", tmp_path / "r.csv", ok=False)
    assert res.exit_code == 2 and "Parquet" in res.output
    res = run_cli("sweep", trace, "--budget", "0.001", ok=False)
    assert res.exit_code == 2 and "smallest budget" in res.output
