"""Every LaTeX table moesim writes compiles with pdflatex in a one-column article and fits its text width:
the report's tables (routing profile, policies), the sweep's and mrc's `--format latex`. A table wider than the
text is scaled to it (\\resizebox); the natural width goes to the log, and must stay within 1.25x the
text width (a table shrunk further is too small to read). Skips where pdflatex is missing (.ci/run
installs Debian's texlive-latex-base)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from report_helpers import built_report
from sweep_helpers import run_cli

PDFLATEX = shutil.which("pdflatex")
pytestmark = pytest.mark.skipif(PDFLATEX is None, reason="pdflatex not installed "
                                                          "(apt-get install -y texlive-latex-base)")

# The article class at 10pt: \textwidth = 345pt, the width the issue measured tables against.
DOCUMENT = r"""\documentclass{article}
\usepackage{graphicx}
\begin{document}
\typeout{text width: \the\textwidth}
\input{table}
\end{document}
"""
TEXT_WIDTH = 345.0


def compile_table(tex: str, tmp_path) -> dict:
    (tmp_path / "table.tex").write_text(tex)
    (tmp_path / "doc.tex").write_text(DOCUMENT)
    res = subprocess.run([PDFLATEX, "-interaction=nonstopmode", "-halt-on-error", "doc.tex"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    log = (tmp_path / "doc.log").read_text(errors="replace")
    errors = [line for line in log.splitlines() if line.startswith("!")]
    return {"rc": res.returncode, "log": log, "errors": errors,
            "widths": [float(w) for w in re.findall(r"moesim table width: ([\d.]+)pt", log)],
            "overfull": re.findall(r"Overfull \\hbox \(([\d.]+)pt too wide\)", log)}


def check(got: dict, name: str) -> None:
    assert got["rc"] == 0 and not got["errors"], f"{name}: pdflatex failed: {got['errors'][:3]}"
    assert float(re.search(r"text width: ([\d.]+)pt", got["log"]).group(1)) == TEXT_WIDTH
    assert got["overfull"] == [], f"{name}: overfull boxes {got['overfull']}"
    assert got["widths"], f"{name}: no table width in the log"
    assert max(got["widths"]) <= 1.25 * TEXT_WIDTH, f"{name}: natural width {got['widths']} pt"


@pytest.mark.parametrize("name", ["routing_profile", "policies"])
def test_report_tables_compile_and_fit(name, tmp_path):
    rep = built_report()
    tex = (rep["out"] / rep["manifest"]["files"]["tables"][name]["LaTeX"]).read_text()
    check(compile_table(tex, tmp_path), name)


def test_sweep_latex_compiles_and_fits(tmp_path):
    rep = built_report()
    tex = run_cli("sweep", rep["trace"], "--budget", "0.25", "-o", rep["results"], "--format", "latex").stdout
    check(compile_table(tex, tmp_path), "sweep --format latex")


def test_mrc_latex_compiles_and_fits(tmp_path):
    rep = built_report()
    tex = run_cli("mrc", rep["trace"], "-e", "lru", "-e", "belady", "--format", "latex", "--jobs", "1").stdout
    check(compile_table(tex, tmp_path), "mrc --format latex")


def test_an_old_style_label_breaks_pdflatex(tmp_path):
    """The check catches what the issue saw: an escaped underscore inside \\label."""
    rep = built_report()
    tex = (rep["out"] / rep["manifest"]["files"]["tables"]["routing_profile"]["LaTeX"]).read_text()
    bad = re.sub(r"\\label\{[^}]*\}", r"\\label{tab:moesim-routing\\_profile}", tex)
    got = compile_table(bad, tmp_path)
    assert got["rc"] != 0 and any("Missing \\endcsname" in e for e in got["errors"])


def test_tables_with_intervals_compile_and_fit(tmp_path):
    """--ci: value$\\pm$half-width cells in the sweep's LaTeX and the report's policy and profile tables."""
    from moesim.reports.report import build_report
    from moesim.simulator.bootstrap import CI

    rep = built_report()
    results = tmp_path / "ci.parquet"
    tex = run_cli("sweep", rep["trace"], "--budget", "0.25", "-o", results, "--format", "latex", "--ci", "95",
                  "--jobs", "1").stdout
    assert r"$\pm$" in tex
    check(compile_table(tex, tmp_path), "sweep --format latex --ci 95")
    manifest = build_report(tmp_path / "report", results=results, trace=rep["trace"], ci=CI(95))
    for name in ("policies", "routing_profile"):
        tex = (tmp_path / "report" / manifest["files"]["tables"][name]["LaTeX"]).read_text()
        assert r"$\pm$" in tex, name
        check(compile_table(tex, tmp_path), f"{name} with intervals")
