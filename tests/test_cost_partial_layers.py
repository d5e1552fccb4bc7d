"""Traces of a known model that log only some of its MoE layers replay unpriced, never refused."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from moesim.cli import cli
from moesim.costmodel.pricing import cost_for_trace
from moesim.errors import MoesimError
from moesim.traces import TraceMeta

OLMOE = "allenai/OLMoE-1B-7B-0924"  # preset olmoe-1b-7b: 16 MoE layers, top-8 of 64


def meta(**kw):
    base = {"model_id": OLMOE, "family": "olmoe", "n_experts": 64, "top_k": 8, "moe_layers": tuple(range(16)),
            "n_candidates": 8}
    return TraceMeta(**{**base, **kw})


def test_partial_layers_are_unpriced_with_a_note():
    cost, note = cost_for_trace(meta())
    assert cost is not None and "olmoe-1b-7b" in note
    cost, note = cost_for_trace(meta(moe_layers=(7,)))
    assert cost is None and note.startswith("the trace logs 1 of olmoe-1b-7b's 16 MoE layers: replayed unpriced")
    cost, note = cost_for_trace(meta(moe_layers=(7,)), model="olmoe-1b-7b")  # asked for, still not refused
    assert cost is None


def test_geometry_mismatch():
    cost, note = cost_for_trace(meta(top_k=4, n_candidates=4))  # found by id: unpriced
    assert cost is None and "replayed unpriced" in note
    with pytest.raises(MoesimError, match="does not match the trace"):  # named explicitly: an error
        cost_for_trace(meta(top_k=4, n_candidates=4), model="olmoe-1b-7b")


def test_one_layer_log_simulates_and_sweeps(tmp_path):
    src = tmp_path / "layer7.jsonl"
    lines = [json.dumps({"type": "meta", "model": OLMOE})]
    lines += [json.dumps({"layer": 7, "pos": p, "topk_ids": [(p * 3 + j * 7) % 64 for j in range(8)]})
              for p in range(60)]
    src.write_text("\n".join(lines) + "\n")
    runner = CliRunner()
    out = tmp_path / "t.parquet"
    assert runner.invoke(cli, ["import", "jsonl", str(src), "-o", str(out)]).exit_code == 0
    res = runner.invoke(cli, ["simulate", str(out), "-e", "lru", "-m", "threshold:0.125", "-b", "0.25"])
    assert res.exit_code == 0, res.output
    assert "not priced: the trace logs 1 of olmoe-1b-7b's 16 MoE layers" in res.stdout
    assert "substituted 0 + dropped 0" in res.stdout  # w = 1/8 exactly, so θ = 0.125 fetches every miss
    res = runner.invoke(cli, ["sweep", str(out), "--budget", "0.25", "--top", "2", "--jobs", "1"])
    assert res.exit_code == 0, res.output
    assert "ranked by 1st-choice class, then hit rate (not priced)" in " ".join(res.stdout.split())
