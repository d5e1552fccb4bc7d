"""moesim report: the directory it writes (charts, tables, offline HTML), the numbers in the paper
tables, atomic replacement and the command's errors. The browser test is test_report_browser.py."""

from __future__ import annotations

import json
import re

import polars as pl
import pytest
from click.testing import CliRunner
from report_helpers import BUDGETS, built_report, ink_fraction, read_png

from moesim.cli import cli
from moesim.errors import MoesimError

CHARTS = {"hit_rate_vs_budget", "time_vs_mass", "speedup", "layer_hit_rate", "rolling_hit_rate",
          "domain_similarity", "gate_weights"}


@pytest.fixture(scope="module")
def rep():
    return built_report()


def _titles(spec) -> list[str]:
    """Every title text in a Vega-Lite spec (chart, concat and facet levels)."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            t = node.get("title")
            if isinstance(t, str):
                found.append(t)
            elif isinstance(t, dict) and isinstance(t.get("text"), str):
                found.append(t["text"])
            for k, v in node.items():
                if k not in ("encoding", "datasets", "data"):
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(spec)
    return found


def test_every_chart_in_three_formats(rep):
    out, files = rep["out"], rep["manifest"]["files"]
    assert set(files["charts"]) == CHARTS
    for name, f in files["charts"].items():
        svg = (out / f["svg"]).read_text()
        assert svg.startswith("<svg") and "<path" in svg, name
        img = read_png(out / f["png"])
        assert img.shape[0] > 200 and img.shape[1] > 300, name
        # a chart with axes, marks and text inks well over 2% of its pixels; a blank render inks none
        assert ink_fraction(img) > 0.02, f"{name}.png looks blank"
        json.loads((out / f["spec"]).read_text())


def test_synthetic_in_every_chart_title_and_rows_aggregated(rep):
    out = rep["out"]
    for name, f in rep["manifest"]["files"]["charts"].items():
        spec = json.loads((out / f["spec"]).read_text())
        top = spec["title"]["text"] if isinstance(spec.get("title"), dict) else spec.get("title")
        assert top and "synthetic" in top, f"{name}: title {top!r} does not say synthetic"
        for ds, rows in spec.get("datasets", {}).items():
            assert len(rows) <= 5000, f"{name}: dataset {ds} has {len(rows)} rows"
        assert "values" not in json.dumps(spec.get("data", {})) or len(spec["data"]["values"]) <= 5000


def test_axis_titles_carry_units(rep):
    out = rep["out"]
    spec = json.loads((out / "charts" / "hit_rate_vs_budget.vl.json").read_text())
    text = json.dumps(spec)
    assert "hit rate (% of expert requests)" in text and "cache budget (% of each layer's experts)" in text
    text = (out / "charts" / "time_vs_mass.vl.json").read_text()
    assert "time per token (ms" in text


def _walk(node, key):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                yield v
            if k not in ("datasets", "data"):
                yield from _walk(v, key)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v, key)


def test_charts_are_sized_for_reading(rep):
    """Plots at least 600 px wide and axis, legend and mark text of at least 12 px, in every chart (the
    browser test measures the rendered page as well)."""
    out = rep["out"]
    for name, f in rep["manifest"]["files"]["charts"].items():
        spec = json.loads((out / f["spec"]).read_text())
        widths = [w for w in _walk(spec, "width") if isinstance(w, (int, float))]
        assert widths and min(widths) >= 600, (name, widths)
        cfg = spec["config"]
        assert cfg["axis"]["labelFontSize"] >= 12 and cfg["axis"]["titleFontSize"] >= 12, name
        assert cfg["legend"]["labelFontSize"] >= 12 and cfg["title"]["subtitleFontSize"] >= 12, name
        sizes = [v for v in _walk(spec, "fontSize") if isinstance(v, (int, float))]
        assert min(sizes) >= 12, (name, sizes)


def test_time_vs_mass_is_cut_above_the_baseline_and_names_what_it_leaves_out(rep):
    spec = json.loads((rep["out"] / "charts" / "time_vs_mass.vl.json").read_text())
    results = pl.read_parquet(rep["results"])
    panels = spec["vconcat"]
    assert [p["title"]["text"] for p in panels] == [f"budget {100 * b:g}%" for b in BUDGETS]
    for b, panel in zip(BUDGETS, panels):
        rows = spec["datasets"][panel["data"]["name"]]
        part = results.filter(pl.col("budget") == b)
        base_ms = 1e3 * part.filter(pl.col("preset") == "fetch-all")["s_per_token"][0]
        assert max(r["ms_per_token"] for r in rows) <= 1.08 * base_ms + 1e-9
        assert len(rows) == part.filter(1e3 * pl.col("s_per_token") <= 1.08 * base_ms).height
        slower = part.filter(1e3 * pl.col("s_per_token") > 1.08 * base_ms)
        said = " ".join(panel["title"].get("subtitle", []))
        assert all(p in said for p in slower["policy"].to_list()), (b, said)
    assert "no cache / cpu" in json.dumps([p["title"] for p in panels])


def test_html_is_self_contained(rep):
    html = (rep["out"] / "index.html").read_text()
    assert "<script src" not in html.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html, re.I), "remote reference in the page"
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    assert "window.vegaEmbed=" in html  # the bundle is inlined
    assert html.count('<div class="chart"') == len(CHARTS)
    assert "Synthetic trace" in html
    manifest = json.loads((rep["out"] / "report.json").read_text())
    assert manifest["synthetic"] is True and manifest["files"]["html"] == "index.html"


def test_tables_in_markdown_latex_csv(rep):
    out = rep["out"]
    for name, f in rep["manifest"]["files"]["tables"].items():
        md = (out / f["Markdown"]).read_text()
        rows = [ln for ln in md.splitlines() if ln.startswith("|")]
        assert len(rows) >= 3 and len({ln.count(" | ") for ln in rows[:1] + rows[2:]}) == 1, name
        tex = (out / f["LaTeX"]).read_text()
        assert tex.count(r"\sbox0{\begin{tabular}") == 1 and tex.count(r"\end{table}") == 1
        spec = re.search(r"\\sbox0\{\\begin\{tabular\}\{((?:p\{[^}]*\}|[lr])+)\}", tex).group(1)
        n_cols = len(re.findall(r"p\{[^}]*\}|[lr]", spec))
        body = tex.split(r"\sbox0{\begin{tabular}")[1].rsplit(r"\end{tabular}}", 1)[0]
        lines = [ln for ln in body.splitlines() if ln.endswith(r"\\")]
        assert lines and all(len(re.findall(r"(?<!\\)&", ln)) == n_cols - 1 for ln in lines), name
        assert re.search(r"\\label\{tab:moesim-[a-z0-9-]+\}", tex), f"{name}: label needs no escapes"
        assert "SYNTHETIC" in tex and "SYNTHETIC" in md
        assert tex.isascii(), f"{name}.tex: non-ASCII text breaks pdflatex"
        csv = pl.read_csv(out / f["CSV"])
        assert csv.height == len(rows) - 2


def test_routing_profile_table_matches_replays(rep):
    from moesim.reports.profile import profile
    from moesim.simulator import SimConfig, simulate
    from moesim.traces import load_routing

    r = load_routing(rep["trace"])
    table = pl.read_csv(rep["out"] / "tables" / "routing_profile.csv")
    assert table["budget (%)"].to_list() == [100 * b for b in BUDGETS]
    prof = profile(r)
    assert table["reuse next"][0] == pytest.approx(prof["reuse_next_token"])
    assert table["WS95 (%)"][0] == pytest.approx(100 * prof["working_set_95"])
    for i, b in enumerate(BUDGETS):
        for ev, col in (("lru", "LRU (%)"), ("static", "static (%)"), ("belady", "Belady (%)")):
            want = 100 * simulate(r, SimConfig(eviction=ev, budget=b)).totals()["hit_rate"]
            assert table[col][i] == pytest.approx(want), (ev, b)
    # Belady is the offline optimum among the cold-start evictions
    assert (table["Belady (%)"] >= table["LRU (%)"]).all()


def test_policy_table_rows(rep):
    table = pl.read_csv(rep["out"] / "tables" / "policies.csv", infer_schema_length=0)
    presets = set(table["preset"].to_list())
    assert {"quality-first", "speed-first", "fetch-all", "llama.cpp"} <= presets
    assert table["ΔPPL (%)"].is_null().all()  # left for the user's own measurement
    rows = pl.read_parquet(rep["results"])
    fa = rows.filter((pl.col("preset") == "fetch-all") & (pl.col("budget") == 0.25)).row(0, named=True)
    mine = table.filter((pl.col("preset") == "fetch-all") & (pl.col("budget (%)") == "25.0")).row(0, named=True)
    assert float(mine["ms/token"]) == pytest.approx(1e3 * fa["s_per_token"])
    assert float(mine["speed-up (×)"]) == pytest.approx(1.0)
    assert float(mine["subst. (%)"]) == 0.0 and float(mine["drop (%)"]) == 0.0
    # speed-up: the sweep's one baseline (the fetch-all preset) at the same budget over the row's, as in the
    # sweep's own table and JSON
    at25 = table.filter(pl.col("budget (%)") == "25.0")
    ms = at25["ms/token"].cast(float)
    assert at25["speed-up (×)"].cast(float).to_list() == pytest.approx((float(mine["ms/token"]) / ms).to_list())
    # the class that always runs the first choice first, fastest first within a class
    assert at25["1st choice"].to_list() == sorted(at25["1st choice"].to_list())
    for klass in ("kept", "may lose"):
        part = at25.filter(pl.col("1st choice") == klass)["ms/token"].cast(float).to_list()
        assert part == sorted(part)
    # the numbers are what the caption says: substitutions and drops apart, mass of both
    by_policy = {(r["policy"], r["budget"]): r for r in rows.to_dicts()}
    for r in table.to_dicts():
        src = by_policy[(r["policy"], float(r["budget (%)"]) / 100)]
        assert float(r["subst. (%)"]) == pytest.approx(100 * src["substitution_rate"], abs=0.05)
        assert float(r["drop (%)"]) == pytest.approx(100 * src["drop_rate"], abs=0.05)
        assert float(r["mass/step"]) == pytest.approx(src["mass_per_step"], abs=5e-5)
    caption = json.loads((rep["out"] / "report.json").read_text())
    qf = table.filter(pl.col("preset") == "quality-first")
    assert (qf["subst. (%)"].cast(float) > 0).all()
    md = (rep["out"] / "tables" / "policies.md").read_text()
    assert "ΔPPL" in md and r"$\Delta$PPL" in (rep["out"] / "tables" / "policies.tex").read_text()
    assert "served by a substitute expert" in md and "share dropped" in md and "substitute or dropped" not in md
    assert caption["synthetic"] is True


def test_rebuild_replaces_atomically_and_refuses_foreign_dirs(rep, tmp_path):
    from moesim.reports.report import build_report

    out = tmp_path / "rep"
    build_report(out, trace=rep["trace"], budgets=[0.25])  # trace-only builds: quicker, same publishing
    (out / "index.html").write_text("an older page")  # named by the old report.json: replaced
    build_report(out, trace=rep["trace"], budgets=[0.25])
    assert "an older page" not in (out / "index.html").read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temporary directories left behind"
    (out / "notes.txt").write_text("mine")  # not written by the report: never deleted with the old report
    with pytest.raises(MoesimError, match="holds files the earlier report did not write \\(notes.txt\\)"):
        build_report(out, trace=rep["trace"], budgets=[0.25])
    assert (out / "notes.txt").read_text() == "mine"
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious")
    with pytest.raises(MoesimError, match="not a moesim report"):
        build_report(foreign, results=rep["results"])
    assert (foreign / "thesis.tex").read_text() == "precious"


def test_cli_report_and_errors(rep, tmp_path):
    runner = CliRunner()
    res = runner.invoke(cli, ["report", str(rep["results"]), "-o", str(tmp_path / "r")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "7 charts, 2 tables" in res.output and "[synthetic trace]" in res.output
    res = runner.invoke(cli, ["report", str(tmp_path / "missing.parquet"), "-o", str(tmp_path / "x")])
    assert res.exit_code == 2 and "no such results file" in res.output
    res = runner.invoke(cli, ["report", str(rep["trace"]), "-o", str(tmp_path / "x")])
    assert res.exit_code == 2 and "not a moesim sweep results file" in res.output
    res = runner.invoke(cli, ["report", "-o", str(tmp_path / "x")])
    assert res.exit_code == 2 and "give sweep RESULTS" in res.output
    assert not (tmp_path / "x").exists()


def test_trace_only_report(rep, tmp_path):
    """What `moesim profile --plot` writes: no sweep, so no time charts and no policy table."""
    from moesim.reports.report import build_report

    m = build_report(tmp_path / "p", trace=rep["trace"], budgets=[0.25])
    assert set(m["files"]["charts"]) == {"hit_rate_vs_budget", "rolling_hit_rate", "domain_similarity",
                                         "gate_weights"}
    assert set(m["files"]["tables"]) == {"routing_profile"}


def test_results_without_their_trace(rep, tmp_path):
    """The trace moved away: the sweep's charts and the policy table only, and a note saying why."""
    from moesim.reports.report import build_report
    from moesim.sweeps.store import layers_path

    rows = pl.read_parquet(rep["results"]).with_columns(pl.lit("gone/q30.parquet").alias("trace"))
    rows.write_parquet(tmp_path / "r.parquet")
    pl.read_parquet(layers_path(rep["results"])).write_parquet(layers_path(tmp_path / "r.parquet"))
    m = build_report(tmp_path / "out", results=tmp_path / "r.parquet")
    assert set(m["files"]["charts"]) == {"hit_rate_vs_budget", "time_vs_mass", "speedup", "layer_hit_rate"}
    assert set(m["files"]["tables"]) == {"policies"}
    assert any("was not found" in n for n in m["notes"])
    # the hit-rate curve falls back to the sweep's fetch-all rows: one point per eviction and budget
    spec = json.loads((tmp_path / "out" / "charts" / "hit_rate_vs_budget.vl.json").read_text())
    (data,) = [v for v in spec["datasets"].values() if v and "eviction" in v[0]]
    assert len(data) == 6 * len(BUDGETS)  # six evictions


def test_a_cache_that_does_not_fit_is_flagged_in_the_report(rep, tmp_path):
    """bf16 Qwen3-30B-A3B at half its experts needs 27 GiB of VRAM; the RTX 3090 preset has 20.2 GiB free."""
    from moesim.reports.report import build_report
    from moesim.sweeps.grid import Grid
    from moesim.sweeps.run import run_sweep

    out = run_sweep([rep["trace"]], Grid(budgets=[0.5], quants=["bf16"], evictions=["lru"],
                                         misses=["fetch-all", "first-choice"], admits=[None], presets=False), jobs=1)
    m = build_report(tmp_path / "r", results=out)
    assert any(n.startswith("WARNING: at budget 50% the cache needs 27.0 GiB of VRAM") for n in m["notes"])
    table = pl.read_csv(tmp_path / "r" / "tables" / "policies.csv")
    assert set(table["fits"]) == {"NO"}
    assert "fits = NO" in (tmp_path / "r" / "tables" / "policies.md").read_text()
    html = (tmp_path / "r" / "index.html").read_text()
    assert "WARNING: at budget 50%" in html and "quantization" in html and "bf16: given" in html
    spec = json.loads((tmp_path / "r" / "charts" / "time_vs_mass.vl.json").read_text())
    assert "does not fit" in json.dumps(spec["vconcat"][0]["title"])
