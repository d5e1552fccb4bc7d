"""`moesim hw`, `moesim models`, `moesim estimate` through the CLI."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from moesim.cli import cli
from moesim.costmodel.hardware import _preset_dir


def run(*args):
    return CliRunner().invoke(cli, list(args), prog_name="moesim")


def test_hw_list_and_show():
    r = run("hw", "list", "--format", "json")
    assert r.exit_code == 0, r.output
    names = {row["name"] for row in json.loads(r.output)}
    assert {"rtx3090-pcie4", "rtx3070-8g-ddr4-nvme", "apple-m2-ultra-192g"} <= names
    r = run("hw", "show", "rtx3070-8g-ddr4-nvme")
    assert r.exit_code == 0 and "measured: the second study's 2.4 GB/s" in r.output
    d = json.loads(run("hw", "show", "h100-pcie", "--format", "json").output)
    assert d["effective"]["link_raw_gb_s"] == pytest.approx(63.0, rel=1e-3)
    assert "CPU sockets" not in r.output
    r = run("hw", "show", "dual-xeon-6138")  # a two-socket machine: where its process runs, the remote rate's basis
    assert r.exit_code == 0 and "CPU sockets  2, a process runs on 1" in r.output
    assert "remote_gb_s = 29.556  # default: measured: Intel MLC" in r.output


def test_models_list_and_show():
    rows = json.loads(run("models", "list", "--format", "json").output)
    assert len(rows) >= 7 and all(r["total_b"] > r["active_b"] > 0 for r in rows)
    r = run("models", "show", "qwen3-235b-a22b")
    assert r.exit_code == 0 and "q4_k_m" in r.output and "235.09B total" in r.output
    d = json.loads(run("models", "show", "gpt-oss-120b", "--quant", "mxfp4", "--format", "json").output)
    assert list(d["bytes_per_expert"]) == ["mxfp4"]


def test_estimate_json_keys():
    r = run("estimate", "--model", "qwen3-235b-a22b", "--quant", "q4_k_m", "--hw", "rtx3070-8g-ddr4-nvme",
            "--miss", "cpu", "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    for key in ("s_per_token", "tok_per_s", "bytes_per_token", "vram_hit", "ram_hit", "cost_params"):
        assert key in d
    assert set(d["bytes_per_token"]) == {"vram", "ram", "nvme", "link", "cpu"}
    cold = json.loads(run("estimate", "--model", "qwen3-235b-a22b", "--quant", "q4_k_m", "--hw",
                          "rtx3070-8g-ddr4-nvme", "--cold", "--format", "json").output)
    assert cold["tok_per_s"] < d["tok_per_s"] and cold["reads_fraction"]["nvme"] == 1.0


def test_estimate_table_and_user_files(tmp_path):
    hw = tmp_path / "mine.toml"
    hw.write_text((_preset_dir() / "rtx3090-pcie4.toml").read_text().replace('name = "rtx3090-pcie4"', 'name = "mine"'))
    r = run("estimate", "--model", "qwen3-next-80b-a3b", "--quant", "q4_k_m", "--hw", str(hw),
            "--vram-hit", "0.9", "--ram-hit", "1", "--batch", "2")
    assert r.exit_code == 0, r.output
    assert "tokens/s" in r.output and "mine" in r.output


@pytest.mark.parametrize("args,message", [
    (("estimate", "--model", "nope", "--hw", "rtx3090-pcie4"), "unknown model preset 'nope'"),
    (("estimate", "--model", "qwen3-30b-a3b", "--hw", "gtx"), "unknown hardware preset 'gtx'"),
    (("estimate", "--model", "qwen3-30b-a3b", "--hw", "rtx3090-pcie4", "--vram-hit", "2"), "--vram-hit"),
    (("hw", "show", "nope.toml"), "hardware preset file not found"),
])
def test_errors_are_one_line(args, message):
    r = run(*args)
    assert r.exit_code == 2
    err = r.stderr if hasattr(r, "stderr") else r.output
    assert message in err and err.strip().count("\n") == 0 and "Traceback" not in err
