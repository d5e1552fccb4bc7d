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
    """The terminal tables back into (header text, rows): columns are where the dashes under the header
    are; the header text is every line from the table's start (after a blank line) to the column names."""
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
            start = i - 2
            while start > 0 and lines[start - 1].strip():
                start -= 1
            tables.append((" ".join(x.strip() for x in lines[start:i - 1]), rows))
    return tables


def test_table_is_ranked_by_class_then_time_with_presets_and_synthetic_title(swept):
    out, text = swept
    tables = parse_tables(text)
    assert len(tables) == 2
    assert max(len(line) for line in text.splitlines()) <= 120  # fits a 120-column terminal
    for title, rows in tables:
        assert "SYNTHETIC trace" in title and "ranked by 1st-choice class, then time per token" in title
        # what the times assume: model, quantization, machine, and the one baseline
        assert "priced as qwen3-30b-a3b bf16 on rtx3090-pcie4" in title
        assert "speed-up over lru / fetch-all (fetch-all preset)" in title
        assert len(rows) == 48 and [r["#"] for r in rows] == [str(i) for i in range(1, 49)]
        kept = [r for r in rows if r["1st choice"] == "kept"]
        lost = [r for r in rows if r["1st choice"] == "may lose"]
        assert kept and lost and rows == kept + lost  # the class that keeps the first choice first
        for part in (kept, lost):
            ms = [float(r["ms/tok"]) for r in part]
            assert ms == sorted(ms)
        # static is learned out of sample: from a holdout prefix no row counts (sweeps/holdout.py)
        held = re.search(r"first (\d+) tokens not counted \(static placements learned from the first \1: out of "
                         r"sample\)", title)
        assert held, title
        assert {r["policy"] for r in lost} == {f"{e} / substitute / admit 0.5" for e in ("lru", "lfu", "freq", "fifo",
                                                                                         "belady")} | {
            f"static:{held[1]} / substitute"} | {f"{e} / fetch-all / reroute bias:{b}" for e in ("lru", "freq")
                                      for b in ("0.1", "0.25", "0.5")}
        assert {r["policy"] for r in kept if "reroute" in r["policy"]} == {"lru / fetch-all / reroute keep:2",
                                                                            "freq / fetch-all / reroute keep:2"}
        presets = {r["preset"]: r["policy"] for r in rows if r["preset"]}
        assert presets == {"quality-first": "freq / threshold:0.15 / admit 0.5",
                           "speed-first": "freq / first-choice / admit 0.5",
                           "fetch-all": "lru / fetch-all", "llama.cpp": "static-layers / cpu"}
        assert [r["policy"] for r in rows if r["speed-up"] == "1.00"] == ["lru / fetch-all"]
        assert [r["policy"] for r in rows if r["hit%"] == "0.0"] == ["no cache / cpu"]  # one never-cached row
        assert all("drop%" in r for r in rows)
    assert "budget 0.125 (16 slots per layer)" in tables[0][0] and "budget 0.25 (32 slots per layer)" in tables[1][0]


def test_parquet_rows_and_layers_keyed_by_trace_config_and_cost(swept, trace):
    out, _ = swept
    df = pl.read_parquet(out)
    lay = pl.read_parquet(layers_path(out))
    assert df.height == 96 and df["row_key"].n_unique() == 96
    assert list(df.columns[: len(ROW_SCHEMA)]) == list(ROW_SCHEMA)
    assert df["synthetic"].all() and df["priced"].all()
    assert (df["row_key"] == df["trace_digest"] + ":" + df["config_key"] + ":" + df["cost_key"]).all()
    assert lay.height == 96 * 48 and set(lay["row_key"]) == set(df["row_key"])
    # layer rows add up to the config's totals
    sums = lay.group_by("row_key").agg(pl.col("hits").sum(), pl.col("requests").sum())
    j = df.join(sums, on="row_key", suffix="_l")
    assert (j["hits"] == j["hits_l"]).all() and (j["requests"] == j["requests_l"]).all()
    # every speed-up divides by the one baseline of its budget: lru / fetch-all
    assert set(df["baseline"]) == {"lru / fetch-all (fetch-all preset)"}
    for b in (0.125, 0.25):
        part = df.filter(pl.col("budget") == b)
        base = part.filter((pl.col("eviction") == "lru") & (pl.col("miss") == "fetch-all")
                           & (pl.col("prefetch") == "none") & (pl.col("reroute") == "none"))
        assert base.height == 1
        assert part["speedup"].to_list() == pytest.approx((base["s_per_token"][0] / part["s_per_token"]).to_list())
        # ranks are 1..48, the first-choice class first, best time first within it
        part = part.sort("rank")
        assert part["rank"].to_list() == list(range(1, 49))
        assert part["keeps_first_choice"].to_list() == sorted(part["keeps_first_choice"].to_list(), reverse=True)
        for keeps in (True, False):
            assert part.filter(pl.col("keeps_first_choice") == keeps)["s_per_token"].is_sorted()
    # the class is the miss policy's and the reroute's: substitute (and drop) may lose the first choice, so may
    # bias:λ (the router's top choice may be biased away); keep:J never does
    loses = df["miss"].is_in(["substitute", "drop"]) | df["reroute"].str.starts_with("bias:")
    assert (df["keeps_first_choice"] == ~loses).all()
    assert (df.filter(pl.col("keeps_first_choice"))["first_choice_substitutions"] == 0).all()


def test_identical_replays_get_identical_numbers(swept):
    """Rows whose replays are alike (same time per token) get the same speed-up: one baseline for all."""
    df = pl.read_parquet(swept[0]).filter(pl.col("budget") == 0.25)
    by_time: dict[float, set] = {}
    for r in df.to_dicts():
        by_time.setdefault(r["s_per_token"], set()).add(round(r["speedup"], 12))
    assert all(len(v) == 1 for v in by_time.values())


def test_pareto_flags_match_a_brute_force_check_within_each_class(swept):
    df = pl.read_parquet(swept[0]).filter(pl.col("budget") == 0.25)
    for keeps in (True, False):
        part = df.filter(pl.col("keeps_first_choice") == keeps)
        pts = list(zip(part["s_per_token"], part["mass_per_step"]))
        for (x, y), flag in zip(pts, part["pareto"]):
            dominated = any(a <= x and b <= y and (a < x or b < y) for a, b in pts)
            assert flag == (not dominated)
        assert part["pareto"].any()
    assert pareto_front([(1.0, 2.0), (2.0, 1.0), (2.0, 2.0), (1.0, 2.0), (math.nan, 0.0)]) == \
        [True, True, False, True, False]


def test_rerun_prints_the_same_rows_from_the_file_in_every_format(swept, trace):
    out, _ = swept
    args = ["sweep", trace, "--budget", "0.125", "--budget", "0.25", "-o", out]
    js = json.loads(run_cli(*args, "--format", "json").stdout)
    assert js["synthetic"] is True and js["ranked_by"] == ["1st-choice class, then time per token"]
    assert js["baseline"] == ["lru / fetch-all (fetch-all preset)"] and js["fits_in_vram"] is True
    assert js["priced_as"][0] == "qwen3-30b-a3b bf16 on rtx3090-pcie4"
    assert len(js["rows"]) == 96 and {r["row_key"] for r in js["rows"]} == set(pl.read_parquet(out)["row_key"])
    rows = list(csv.DictReader(io.StringIO(run_cli(*args, "--format", "csv").stdout)))
    assert len(rows) == 96 and all(r["synthetic"] == "true" for r in rows)
    assert [r["row_key"] for r in rows] == [r["row_key"] for r in js["rows"]]
    md = run_cli(*args, "--format", "markdown", "--top", "5").stdout
    assert md.count("SYNTHETIC trace") == 2 and md.count("| 5 |") == 2 and "| 6 |" not in md


def test_baseline_rank_by_max_mass_and_wide(swept, trace):
    out, _ = swept
    args = ["sweep", trace, "--budget", "0.25", "-o", out]
    res = run_cli(*args, "--baseline", "freq/fetch-all", "--format", "json")
    js = json.loads(res.stdout)
    assert "0 computed" in res.stderr  # freq / fetch-all is in the default grid already
    rows = {r["policy"]: r for r in js["rows"]}
    assert js["baseline"] == ["freq / fetch-all"] and rows["freq / fetch-all"]["speedup"] == 1.0
    base = rows["freq / fetch-all"]["s_per_token"]
    assert rows["lru / fetch-all"]["speedup"] == pytest.approx(base / rows["lru / fetch-all"]["s_per_token"])
    by_time = json.loads(run_cli(*args, "--rank-by", "time", "--format", "json").stdout)["rows"]
    assert [r["s_per_token"] for r in by_time] == sorted(r["s_per_token"] for r in by_time)
    assert by_time[0]["keeps_first_choice"] is False  # substituting the first choice is fastest
    capped = json.loads(run_cli(*args, "--max-mass", "0.03", "--format", "json").stdout)["rows"]
    assert capped and all(r["mass_per_step"] <= 0.03 for r in capped) and len(capped) < 48
    text = run_cli(*args, "--max-mass", "0.03").stdout
    assert "above the --max-mass limit left out" in text
    (title, table), = parse_tables(text)
    assert [int(r["#"]) for r in table] == sorted(int(r["#"]) for r in table)  # the group's ranks, kept
    wide = run_cli(*args, "--wide").stdout
    (_, wide_rows), = parse_tables(wide)
    assert {"1st subst+drop", "GB/tok sync", "GB/tok bg", "VRAM GiB", "fits"} <= set(wide_rows[0])


def test_a_cache_that_does_not_fit_is_flagged(swept, trace):
    """bf16 Qwen3-30B-A3B at half its experts needs 27 GiB of VRAM; the RTX 3090 preset has 20.2 GiB free."""
    res = run_cli("sweep", trace, "--budget", "0.5", "--quant", "bf16", "-e", "lru", "-m", "fetch-all",
                  "--admit", "none")
    assert "WARNING: this cache needs 27.0 GiB of VRAM and rtx3090-pcie4 has 20.2 GiB free" in res.stdout
    (_, rows), = parse_tables(res.stdout)
    assert {r["fits"] for r in rows} == {"NO"}
    # without --quant the machine gets a quantization whose cache fits
    res = run_cli("sweep", trace, "--budget", "0.5", "-e", "lru", "-m", "fetch-all", "--admit", "none")
    assert "WARNING" not in res.stdout and "priced as qwen3-30b-a3b q8_0 on rtx3090-pcie4" in res.stdout
    assert "Quantization q8_0: the first of bf16, q8_0, q4_k_m that fits the machine" in res.stdout


def test_drops_are_shown_apart_from_substitutions(trace):
    """substitute without admission on a cold cache drops every request: subst% 0, drop% 100, mass 1."""
    res = run_cli("sweep", trace, "--budget", "0.25", "-e", "lru", "-m", "substitute", "--admit", "none",
                  "--baseline", "lru/substitute")
    (_, rows), = parse_tables(res.stdout)
    (row,) = [r for r in rows if r["policy"] == "lru / substitute"]
    assert (row["subst%"], row["drop%"], row["mass/step"], row["1st choice"]) == ("0.00", "100.00", "1.0000",
                                                                                  "may lose")


def _latex_columns(spec: str) -> int:
    return len(re.findall(r"p\{[^}]*\}|[lrc]", spec))


def test_latex_table_parses(swept, trace):
    tex = run_cli("sweep", trace, "--budget", "0.25", "-o", swept[0], "--format", "latex").stdout
    assert tex.count(r"\sbox0{\begin{tabular}") == 1  # one table (header cells stack in small tabulars)
    caption = re.search(r"\\caption\{(.*)\}", tex).group(1)
    assert "SYNTHETIC trace" in caption and "fetch-all preset" in caption
    assert r"\label" not in tex or r"\_" not in re.search(r"\\label\{([^}]*)\}", tex).group(1)
    spec = re.search(r"\\sbox0\{\\begin\{tabular\}\{((?:p\{[^}]*\}|\w)+)\}", tex).group(1)
    body = tex.split(r"\sbox0{\begin{tabular}")[1].rsplit(r"\end{tabular}}", 1)[0]
    rows = [line for line in body.splitlines() if line.endswith(r"\\")]
    assert len(rows) == 49  # header + 48 configs
    for line in rows[1:]:
        cells = re.split(r"(?<!\\)&", line[: -2])
        assert len(cells) == _latex_columns(spec), line
    text = "\n".join(line for line in tex.splitlines() if not line.startswith("%"))
    assert "%" not in re.sub(r"\\%", "", text)  # every percent sign escaped


def test_unpriced_trace_ranks_by_hit_rate_and_says_so(trace):
    import dataclasses

    from moesim.sweeps.grid import Grid
    from moesim.sweeps.run import run_sweep
    from moesim.traces import load_routing

    r = load_routing(trace)
    r.meta = dataclasses.replace(r.meta, model_id="someone/unknown-moe")  # no model preset matches: unpriced
    out = run_sweep(r, Grid(budgets=[0.25], evictions=["lru", "belady"]), jobs=1)
    df = out.rows
    assert not df["priced"].any() and set(df["ranked_by"]) == {"1st-choice class, then hit rate (not priced)"}
    for keeps in (True, False):
        part = df.filter(pl.col("keeps_first_choice") == keeps).sort("rank")
        assert part["hit_rate"].is_sorted(descending=True)
    assert df["s_per_token"].is_null().all() and df["speedup"].is_null().all()
    from moesim.reports.tables import render, sweep_tables

    text = render(sweep_tables(df), "table")
    assert "not priced" in text and "ms/tok" not in text and "drop%" in text


def test_errors_are_one_line(trace, tmp_path):
    res = run_cli("sweep", trace, ok=False)
    assert res.exit_code == 2 and "--budget" in res.output
    res = run_cli("sweep", trace, "--budget", "0.25", "-o", tmp_path / "r.csv", ok=False)
    assert res.exit_code == 2 and "Parquet" in res.output
    res = run_cli("sweep", trace, "--budget", "0.001", ok=False)
    assert res.exit_code == 2 and "smallest budget" in res.output


def test_results_written_before_the_one_baseline_still_read(swept, trace, tmp_path):
    """A file of the previous layout (speedup_vs_fetch_all, no baseline/class/quantization columns) is
    resumed: nothing recomputed, the derived columns recomputed, the retired column dropped (the file is
    rewritten only when rows are added; readers recompute the derived columns)."""
    import shutil

    out, _ = swept
    old = tmp_path / "old.parquet"
    shutil.copy(layers_path(out), layers_path(old))
    df = pl.read_parquet(out)
    df.rename({"speedup": "speedup_vs_fetch_all"}).drop(
        "baseline", "keeps_first_choice", "quant_choice", "vram_gib_free").write_parquet(old)
    res = run_cli("sweep", trace, "--budget", "0.125", "--budget", "0.25", "-o", old, "--format", "json")
    assert "0 computed, 96 already in" in res.stderr
    again = pl.DataFrame(json.loads(res.stdout)["rows"])
    assert "speedup_vs_fetch_all" not in again.columns and list(again.columns) == list(ROW_SCHEMA)
    assert again.sort("row_key")["speedup"].to_list() == pytest.approx(df.sort("row_key")["speedup"].to_list())
    assert set(again["baseline"]) == {"lru / fetch-all (fetch-all preset)"}
    # adding a row rewrites the file in the current layout
    run_cli("sweep", trace, "--budget", "0.125", "--budget", "0.25", "-o", old, "--baseline", "belady/drop")
    assert list(pl.read_parquet(old).columns) == list(ROW_SCHEMA)


def test_simulate_and_sweep_reroute_options(trace, tmp_path):
    """--reroute on the command line: the rerouted line, its class, the sweep axis; bad specs are one line."""
    res = run_cli("simulate", trace, "-e", "lru", "--budget", "0.25", "--reroute", "bias:0.5", "--format", "json")
    doc = json.loads(res.stdout)
    assert doc["config"]["reroute"] == "bias:0.5" and doc["totals"]["rerouted"] > 0
    assert doc["keeps_first_choice"] is False
    text = run_cli("simulate", trace, "-e", "lru", "--budget", "0.25", "--reroute", "keep:2",
                   "--reroute-resident", "recent:4").stdout
    assert "reroute keep:2" in text and "rerouted " in text and "always runs the router's first choice" in text
    for bad, said in ((["--reroute", "bias:x"], "bias"), (["--reroute", "keep:2", "--batch", "4"], "batch"),
                      (["--reroute-pool", "3"], "--reroute")):
        res = run_cli("simulate", trace, "-e", "lru", "--budget", "0.25", *bad, ok=False)
        assert res.exit_code == 2 and said in res.output, res.output
        assert res.output.count("\n") == 1 and res.output.startswith("moesim: error: "), res.output
    out = tmp_path / "r.parquet"
    run_cli("sweep", trace, "--budget", "0.25", "-e", "lru", "-m", "fetch-all", "--reroute", "none",
            "--reroute", "bias:0.25", "-o", out)
    df = pl.read_parquet(out)
    mine = df.filter((pl.col("eviction") == "lru") & (pl.col("miss") == "fetch-all") & (pl.col("prefetch") == "none"))
    assert sorted(mine["reroute"].to_list()) == ["bias:0.25", "none"]  # (the presets come along, never rerouted)
    base, biased = (mine.filter(pl.col("reroute") == r).row(0, named=True) for r in ("none", "bias:0.25"))
    assert biased["hit_rate"] >= base["hit_rate"] and biased["displaced_mass"] > 0 == base["displaced_mass"]
