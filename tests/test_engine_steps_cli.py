"""--step-pin, --max-uploads and lowbit:Q on the command line and in the API: wired through simulate and sweep,
priced, and their errors one line with exit 2."""

import json

import pytest
from click.testing import CliRunner

import moesim
from moesim.cli import cli


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("engine-steps") / "q30.parquet"
    res = CliRunner().invoke(cli, ["synth", "--preset", "qwen3-30b-a3b", "--tokens", "40", "--seed", "2", "-o",
                                   str(out)])
    assert res.exit_code == 0, res.output
    return out


def _json(args):
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_simulate_takes_step_pin_max_uploads_and_lowbit(trace):
    doc = _json(["simulate", str(trace), "-e", "lru", "-m", "lowbit:q2_k", "--admit", "0.5", "-b", "0.25",
                 "--step-pin", "--max-uploads", "1", "--format", "json"])
    t = doc["totals"]
    assert t["lowbit"] == t["misses"] > 0 and t["fetches"] == 0
    assert doc["config"]["step_pin"] is True and doc["config"]["max_uploads"] == 1
    plain = _json(["simulate", str(trace), "-e", "lru", "-m", "fetch-all", "-b", "0.25", "--format", "json"])
    low = _json(["simulate", str(trace), "-e", "lru", "-m", "lowbit:q2_k", "-b", "0.25", "--format", "json"])
    assert low["timing"]["s_per_token"] < plain["timing"]["s_per_token"]  # smaller copies, nothing else changes


def test_sweep_step_pin_leaves_the_undefined_evictions_unpinned(trace, tmp_path):
    rows = moesim.sweep(trace, budgets=0.25, evictions=["lru", "arc"], misses=["fetch-all"], admits=[None],
                        step_pin=True, max_uploads=2, presets=False)
    by = {r["eviction"]: r for r in rows.iter_rows(named=True)}
    assert by["lru"]["step_pin"] is True and by["arc"]["step_pin"] is False
    assert all(r["max_uploads"] == 2 for r in by.values())


@pytest.mark.parametrize("args,msg", [
    (["-e", "arc", "--step-pin"], "--step-pin is not defined for the arc eviction"),
    (["-m", "lowbit:q9_x"], "unknown quantization"),
    (["-m", "lowbit:q8_0", "--quant", "q4_k_m"], "not smaller"),
    (["--max-uploads", "0"], "max_uploads must be a positive whole number"),
])
def test_bad_options_are_one_line_errors(trace, args, msg):
    res = CliRunner().invoke(cli, ["simulate", str(trace), "-b", "0.25", *args])
    assert res.exit_code == 2 and msg in res.output and res.output.count("\n") == 1, res.output


def test_lowbit_tier_on_the_command_line(trace):
    doc = _json(["simulate", str(trace), "-e", "lru", "-m", "fetch-all", "-b", "0.25", "--lowbit-share", "0.25",
                 "--lowbit-quant", "q2_k", "--format", "json"])
    t = doc["totals"]
    assert t["lowbit_tier"] == t["lowbit"] > 0 and t["fetches"] + t["lowbit"] == t["misses"]
    assert doc["config"]["lowbit_share"] == 0.25 and doc["config"]["lowbit_quant"] == "q2_k"
    rows = moesim.sweep(trace, budgets=0.25, evictions=["lru"], misses=["fetch-all", "lowbit:q4_k"], admits=[None],
                        lowbit_share=0.25, lowbit_quant="q2_k", presets=False)
    quants = {r["miss"]: r["lowbit_quant"] for r in rows.iter_rows(named=True)}
    assert quants == {"fetch-all": "q2_k", "lowbit:q4_k": "q4_k"}  # lowbit:Q runs every low-bit expert at its Q


def test_lowbit_bytes_are_counted_on_the_link(trace):
    from moesim.costmodel.timing import cost_params
    from moesim.simulator import SimConfig, simulate

    cost = cost_params("qwen3-30b-a3b", "q8_0", "rtx3090-pcie4")
    res = simulate(moesim.load_trace(trace), SimConfig(eviction="lru", miss="lowbit:q2_k", budget=0.25,
                                                       lowbit_share=0.25), cost=cost)
    t, by = res.totals(), res.timing["bytes_per_token"]
    tokens = res.counted_tokens
    q2 = cost.expert_bytes_by_quant["q2_k"]
    assert t["lowbit_tier"] > 0 and t["lowbit"] > t["lowbit_tier"]
    assert by["link_sync"] == pytest.approx((t["lowbit"] - t["lowbit_tier"]) * q2 / tokens)
    assert by["experts_vram"] == pytest.approx((t["hits"] * cost.bytes_per_expert + t["lowbit"] * q2) / tokens)
