"""moesim export of re-pinning placements: repin:N[,G] and static-domain as their schedule (JSON, CSV), one
domain's table in the pin-list formats; the schedule is what the replay applies (its swaps are the replay's copies
and evictions); the formats that hold one set refuse a schedule with one line."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from click.testing import CliRunner

from moesim.cli import cli
from moesim.simulator import SimConfig, simulate
from moesim.traces import load_routing


@pytest.fixture(scope="module")
def routing(shipped_trace):
    return load_routing(shipped_trace)


def _export(trace, out, *args):
    res = CliRunner().invoke(cli, ["export", str(trace), "--slots", "16", "-o", str(out), *args])
    return res


def test_repin_schedule_is_the_replays_swaps(shipped_trace, routing, tmp_path):
    res = _export(shipped_trace, tmp_path / "s.csv", "--policy", "repin:200,3", "--format", "schedule")
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(io.StringIO((tmp_path / "s.csv").read_text())))
    assert rows and set(rows[0]) == {"token", "layer", "expert", "action"}
    replay = simulate(routing, SimConfig(eviction="repin:200,3", miss="cpu", slots=16)).totals()
    assert sum(r["action"] == "in" for r in rows) == replay["copies"] == replay["admissions"]
    assert sum(r["action"] == "out" for r in rows) == replay["evictions"]
    tokens = [int(r["token"]) for r in rows]
    assert tokens == sorted(tokens) and set(tokens) <= set(range(200, routing.n_tokens, 200))
    # replaying the file's swaps gives a pool of at most 16 experts per layer at every step
    held: dict = {}
    for r in rows:
        key = (int(r["layer"]), int(r["expert"]))
        held[key] = r["action"] == "in"
        assert sum(v for (layer, _), v in held.items() if layer == key[0]) <= 16
    doc = _export(shipped_trace, tmp_path / "s.json", "--policy", "repin:200,3", "--format", "json")
    assert doc.exit_code == 0, doc.output
    d = json.loads((tmp_path / "s.json").read_text())
    assert len(d["schedule"]) == len(rows) and d["policy"] == "repin:200,3"


def test_a_domain_table_is_that_domains_most_requested_experts(shipped_trace, routing, tmp_path):
    res = _export(shipped_trace, tmp_path / "p.csv", "--policy", "static-domain", "--domain", "math", "--format",
                  "pins")
    assert res.exit_code == 0, res.output
    assert "math table" in res.output
    got = {(int(r["layer"]), int(r["expert"])) for r in csv.DictReader(io.StringIO((tmp_path / "p.csv").read_text()))}
    d = routing.domain_names.index("math")
    sel = routing.sel[routing.domain == d]
    layers = [int(x) for x in routing.meta.moe_layers]
    want = set()
    for li, layer in enumerate(layers):
        counts = np.bincount(sel[:, li, :].reshape(-1).astype(np.int64), minlength=routing.n_experts)
        want |= {(layer, int(e)) for e in np.lexsort((np.arange(routing.n_experts), -counts))[:16]}
    assert got == want
    sched = _export(shipped_trace, tmp_path / "d.json", "--policy", "static-domain", "--format", "json")
    assert sched.exit_code == 0, sched.output
    doc = json.loads((tmp_path / "d.json").read_text())
    assert set(doc["tables"]) == set(routing.domain_names)
    assert {(int(k), e) for k, v in doc["tables"]["math"].items() for e in v} == want
    replay = simulate(routing, SimConfig(eviction="static-domain", miss="cpu", slots=16)).totals()
    assert sum(x["action"] == "in" for x in doc["schedule"]) == replay["copies"]


@pytest.mark.parametrize("args,why", [
    (["--policy", "repin:64", "--format", "pins"], "changes its pinned set"),
    (["--policy", "repin:64", "--format", "ktransformers"], "changes its pinned set"),
    (["--policy", "static-domain", "--format", "fitz-tec"], "--domain NAME"),
    (["--policy", "static-domain", "--domain", "nope", "--format", "pins"], "no domain 'nope'"),
    (["--policy", "static", "--domain", "math", "--format", "pins"], "--domain picks a table of static-domain"),
    (["--policy", "static", "--format", "schedule"], "no schedule"),
    (["--policy", "repin:0", "--format", "json"], "bad parameter"),
])
def test_refusals_are_one_line(shipped_trace, tmp_path, args, why):
    out = tmp_path / "x.out"
    res = _export(shipped_trace, out, *args)
    assert res.exit_code == 2, res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("moesim: error: ") and why in lines[0], res.output
    assert not out.exists()
