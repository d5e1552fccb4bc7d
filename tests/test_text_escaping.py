"""Strings from data files are shown, never obeyed: model ids and domains holding `<!--<script>`, ANSI/OSC
escapes, newlines or table syntax reach HTML (embedded JSON and tables), Markdown, LaTeX and the terminal
escaped; a valid trace with many domains still makes a report."""

from __future__ import annotations

import html
import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

from moesim.cli import cli
from moesim.reports.tables import Column, Table, to_latex, to_markdown, to_text
from moesim.textsafe import markdown, script_json, term
from moesim.traces import TraceMeta, TraceWriter

EVIL = "m<!--<script>alert(1)</script>\x1b]0;pwned\x07\x1b[31m\n| x | & y"
N_DOMAINS = 80


def hostile_trace(path, n_domains: int = N_DOMAINS):
    """A valid trace whose model id and domain names are hostile, with ``n_domains`` domains."""
    rng = np.random.default_rng(7)
    E, K, M, T = 16, 2, 4, 640
    meta = TraceMeta(model_id=EVIL, family="evil\x1b[2J", n_experts=E, top_k=K, moe_layers=(0, 1), layout="sparse",
                     n_candidates=M)
    domains = [f"d{i}</script><!--\x1b[1m" for i in range(n_domains)]
    seq = np.repeat(np.arange(4), T // 4)
    pos = np.tile(np.arange(T // 4), 4)
    dom = np.asarray(domains, dtype=object)[rng.integers(0, n_domains, T)]
    with TraceWriter(path, meta, domains=domains) as w:
        for layer in (0, 1):
            lg = rng.normal(size=(T, E))
            ids = np.argsort(-lg, axis=1)[:, :M]
            w.write(seq=seq, pos=pos, layer=layer, domain=dom, top_ids=ids, top_logits=np.take_along_axis(lg, ids, 1),
                    lse=np.log(np.exp(lg).sum(1)))
    return path


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return hostile_trace(tmp_path_factory.mktemp("evil") / "evil.parquet")


def test_term_markdown_script_json():
    assert term("a\x1b[31mb\nc\u202ed\x07") == "a\\x1b[31mb\\nc\\u202ed\\x07"
    assert term("plain ü é 漢") == "plain ü é 漢"
    md = markdown("a|b<i>&\nc`d\\")
    assert "<" not in md and ">" not in md and "\n" not in md and "\\|" in md and "&amp;" in md
    doc = {"s": EVIL, "t": "\u2028</script>&"}
    out = script_json(doc)
    assert not re.search("[<>&\u2028]", out) and json.loads(out) == doc


def test_tables_escape_cells():
    t = Table(EVIL, [Column("a", "model", str, "l")], [[EVIL]], note=EVIL)
    text = to_text(t)
    assert "\x1b" not in text and "\x07" not in text and len(text.splitlines()) == 5
    md = to_markdown(t)
    assert "<script" not in md and "<!--" not in md and "\x1b" not in md
    assert all(line.count("|") - line.count("\\|") in (0, 2) for line in md.splitlines())
    assert "\x1b" not in to_latex(t) and "\n\n" not in to_latex(t)


@pytest.mark.parametrize("args", [["info"], ["info", "--format", "json"], ["validate"], ["profile"]])
def test_terminal_output_shows_escapes(args, trace):
    res = CliRunner().invoke(cli, [args[0], str(trace), *args[1:]])
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.output and "\x07" not in res.output
    if args == ["info"]:
        assert "\\x1b]0;pwned\\x07" in res.output


def test_sweep_tables_escape_model_ids(trace):
    for fmt in ("table", "markdown", "latex"):
        res = CliRunner().invoke(cli, ["sweep", str(trace), "--budget", "0.25", "-e", "lru", "--format", fmt])
        assert res.exit_code == 0, res.output
        assert "\x1b" not in res.stdout and "\x07" not in res.stdout, fmt
        if fmt == "markdown":
            assert "<script" not in res.stdout and "<!--" not in res.stdout


@pytest.mark.parametrize("cmd", ["sweep", "mrc"])
def test_csv_output_escapes_model_ids_and_machine_names(cmd, trace, tmp_path):
    from conftest import REPO

    hw = tmp_path / "evil-hw.toml"
    src = (REPO / "costmodel" / "presets" / "hardware" / "rtx3090-pcie4.toml").read_text()
    hw.write_text(re.sub(r'^name = ".*"$', lambda m: 'name = "box\\u001b]0;pwned\\u0007"', src, count=1,
                         flags=re.M))
    extra = ["--budget", "0.25", "-e", "lru", "-m", "fetch-all", "--hw", str(hw)] if cmd == "sweep" else ["-e", "lru"]
    res = CliRunner().invoke(cli, [cmd, str(trace), *extra, "--format", "csv"])
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.stdout and "\x07" not in res.stdout
    assert "\\x1b]0;pwned\\x07" in res.stdout


def test_exported_llama_cpp_flags_keep_every_comment_one_line(trace, tmp_path):
    named = tmp_path / "a\n--override-kv evil\rb.parquet"
    named.write_bytes(trace.read_bytes())
    out = tmp_path / "flags.txt"
    res = CliRunner().invoke(cli, ["export", str(named), "-b", "0.5", "--format", "llama.cpp", "-o", str(out)])
    assert res.exit_code == 0, res.output
    lines = out.read_text().splitlines()
    assert all(x.startswith(("#", "--n-cpu-moe ", "-ot ")) for x in lines), lines
    assert "\x1b" not in out.read_text() and "\r" not in out.read_text()


def test_error_lines_show_escapes(tmp_path):
    res = CliRunner().invoke(cli, ["info", str(tmp_path / "x\x1b[2Jy.parquet")])
    assert res.exit_code == 2 and "\x1b" not in res.stderr and "\\x1b[2J" in res.stderr


def test_report_of_a_hostile_trace_with_many_domains(trace, tmp_path):
    out = tmp_path / "rep"
    res = CliRunner().invoke(cli, ["report", "--trace", str(trace), "-o", str(out)])
    assert res.exit_code == 0, res.output + str(res.exception)
    page = (out / "index.html").read_text()
    specs = re.findall(r'<script type="application/json" id="spec-(\d+)">(.*?)</script>', page, re.S)
    manifest = json.loads((out / "report.json").read_text())
    assert len(specs) == len(manifest["files"]["charts"]) >= 4
    for _, body in specs:
        assert not re.search("[<>&]", body)
        json.loads(body)
    # the page has exactly the scripts moesim puts there: the specs, the Vega bundle and the runner
    assert page.count("<script") == len(specs) + 2
    assert EVIL not in page and html.escape(EVIL.split("\x1b")[0]) in page
    for md in (out / "tables").glob("*.md"):
        assert "<script" not in md.read_text()
    sim = json.loads((out / "charts" / "domain_similarity.vl.json").read_text())
    assert "24 domains with the most tokens of" in json.dumps(sim)
