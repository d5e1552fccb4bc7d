"""`moesim profile --budget`: the second study's Table 3 (fetch-all hit rate of lru, lfu, static and
belady at one budget, overall and per layer); and profiles of frequency-only traces."""

import json

import numpy as np
from click.testing import CliRunner
from conftest import FIXTURES

from moesim.cli import cli
from moesim.simulator import simulate
from moesim.traces import load_routing
from moesim.traces.importers.moe_infinity import import_moe_infinity
from moesim.traces.synthetic import synthesize


def test_profile_budget_table_equals_replays(tmp_path):
    path = synthesize("qwen3-30b-a3b", 300, seqs=2, seed=3, path=tmp_path / "t.parquet")
    out = CliRunner().invoke(cli, ["profile", str(path), "--budget", "0.134", "--format", "json"])
    assert out.exit_code == 0, out.output
    cache = json.loads(out.output)["cache"]
    assert cache["slots_per_layer"] == 17
    routing = load_routing(path)
    for ev in ("lru", "lfu", "static", "belady"):
        res = simulate(routing, eviction=ev, miss="fetch-all", slots=17)
        assert cache["hit_rate"][ev] == res.totals()["hit_rate"]
        assert [row[ev] for row in cache["layers"]] == [r["hit_rate"] for r in res.layer_rows()]
    assert cache["hit_rate"]["belady"] >= max(cache["hit_rate"][ev] for ev in ("lru", "lfu"))
    table = CliRunner().invoke(cli, ["profile", str(path), "--slots", "17"])
    assert "17 slots per layer" in table.output and "belady" in table.output


def test_frequency_only_trace_profiles_from_counts(tmp_path):
    out = tmp_path / "mi.parquet"
    import_moe_infinity(FIXTURES / "moe_infinity_counts.npy", out, top_k=2)
    res = CliRunner().invoke(cli, ["profile", str(out), "--format", "json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    counts = np.load(FIXTURES / "moe_infinity_counts.npy").sum(axis=0)  # [layers, experts]
    f = counts / (counts[0].sum() / 2)
    assert d["frequency_only"] is True and d["reuse_next_token"] is None and d["gate"] is None
    assert d["reuse_chance_marginal"] == np.mean((f ** 2).sum(axis=1) / 2)
    bad = CliRunner().invoke(cli, ["profile", str(out), "--budget", "0.25"])
    assert bad.exit_code == 2 and "frequency-only" in bad.output
