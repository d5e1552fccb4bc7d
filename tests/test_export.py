"""moesim export: static placements as llama.cpp flags (checked against a GGUF's tensor names), pin lists
and JSON, with the replay's expected hit rate."""

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

from moesim.cli import cli
from moesim.reports.placement import LLAMA_EXPS_REGEX, block_pattern, on_cpu, placement


def _tiny_gguf_names(path, n_blocks=6, dense=(0,)):
    """Tensor names of a GGUF written with the gguf package: a llama.cpp-style MoE model whose first blocks
    are dense (no expert tensors), with split and fused expert projections."""
    gguf = pytest.importorskip("gguf", reason="the gguf package (extra [llama]) writes the test GGUF")
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    tiny = np.zeros((2, 2), np.float32)
    w.add_tensor("token_embd.weight", tiny)
    for b in range(n_blocks):
        w.add_tensor(f"blk.{b}.attn_q.weight", tiny)
        if b in dense:
            w.add_tensor(f"blk.{b}.ffn_up.weight", tiny)
            continue
        w.add_tensor(f"blk.{b}.ffn_gate_inp.weight", tiny)
        for proj in ("gate", "up", "down"):
            w.add_tensor(f"blk.{b}.ffn_{proj}_exps.weight", np.zeros((2, 2, 2), np.float32))
        w.add_tensor(f"blk.{b}.ffn_gate_up_exps.bias", np.zeros((2, 2), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return [t.name for t in gguf.GGUFReader(str(path)).tensors]


def test_patterns_match_exactly_the_expert_tensors_of_the_cpu_blocks(tmp_path):
    names = _tiny_gguf_names(tmp_path / "tiny.gguf", n_blocks=12)
    cpu_blocks = [1, 2, 10]
    pattern = block_pattern(cpu_blocks)
    hit = {n for n in names if on_cpu(n, pattern)}
    want = {n for n in names if re.match(r"blk\.(1|2|10)\.ffn_\w+_exps\.", n)}
    assert hit == want and len(want) == 3 * 4
    # llama.cpp's own --n-cpu-moe N is one llm_ffn_exps_block_regex(i) per block i < N: same tensors
    for n_cpu_moe in (3, 11):
        ncmoe = {n for n in names if any(re.search(rf"blk\.{i}{LLAMA_EXPS_REGEX}", n) for i in range(n_cpu_moe))}
        ours = {n for n in names if on_cpu(n, block_pattern(list(range(n_cpu_moe))))}
        assert ours == ncmoe
    assert not any(on_cpu(n, block_pattern([1])) for n in names if n.startswith("blk.10.") or n.startswith("blk.11."))


def test_static_layers_export_keeps_the_last_layers_on_the_gpu(shipped_trace, tmp_path):
    p = placement(shipped_trace, budget=0.25)
    assert p.policy == "static-layers" and len(p.layers) == 48
    assert p.cpu_blocks == list(range(36)) and p.n_cpu_moe == 36
    assert all(len(p.gpu_experts[layer]) == 512 for layer in range(36, 48))
    assert p.expected["hit_rate"] == pytest.approx(0.25)
    text = p.render("llama.cpp")
    assert "--n-cpu-moe 36" in text and 'blk\\.(0|1|' in text and "SYNTHETIC" in text


def test_static_export_pins_the_most_requested_experts(shipped_trace, tmp_path):
    from moesim.traces.routing import load_routing

    routing = load_routing(shipped_trace)
    counts = routing.request_counts()
    p = placement(routing, slots=16, policy="static")
    for layer in (0, 47):
        top = set(np.lexsort((np.arange(512), -counts[layer]))[:16].tolist())
        assert set(p.gpu_experts[layer]) == top
    rows = p.pins_csv().splitlines()
    assert rows[0] == "layer,expert" and len(rows) == 1 + 48 * 16
    doc = json.loads(p.render("json"))
    assert doc["synthetic"] is True and len(doc["gpu_experts"]["0"]) == 16 and doc["expected"]["hit_rate"] > 0.3


def test_cli_export_formats_and_refusals(shipped_trace, tmp_path):
    run = CliRunner().invoke
    out = tmp_path / "flags.txt"
    r = run(cli, ["export", str(shipped_trace), "-b", "0.25", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "--n-cpu-moe 36" in r.output and "expected hit rate 25.0%" in r.output
    assert out.read_text().count("--n-cpu-moe 36") == 1
    r = run(cli, ["export", str(shipped_trace), "-b", "0.25", "--policy", "static", "-o", str(tmp_path / "x.txt")])
    assert r.exit_code == 2 and r.stderr.startswith("moesim: error: ") and "whole layers" in r.stderr
    assert not (tmp_path / "x.txt").exists()
    r = run(cli, ["export", str(shipped_trace), "-b", "0.25", "--policy", "lru", "--format", "json",
                  "-o", str(tmp_path / "x.json")])
    assert r.exit_code == 2 and "static placement" in r.stderr
