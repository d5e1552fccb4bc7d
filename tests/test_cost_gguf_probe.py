"""GGUF header/tensor-index models, hw probe and calibrate through the CLI."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from moesim.cli import cli

gguf = pytest.importorskip("gguf")


def _tiny_gguf(path):
    L, E, k, H, F, V = 2, 4, 2, 16, 8, 32
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_name("tiny")
    w.add_block_count(L)
    w.add_embedding_length(H)
    w.add_expert_count(E)
    w.add_expert_used_count(k)
    w.add_expert_feed_forward_length(F)
    w.add_feed_forward_length(F)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_key_length(8)
    w.add_value_length(8)
    w.add_vocab_size(V)
    w.add_tensor("token_embd.weight", np.zeros((V, H), np.float16))
    w.add_tensor("output.weight", np.zeros((V, H), np.float32))
    w.add_tensor("output_norm.weight", np.zeros(H, np.float32))
    for layer in range(L):
        for n in ("ffn_gate_exps", "ffn_up_exps"):
            w.add_tensor(f"blk.{layer}.{n}.weight", np.zeros((E, F, H), np.float16))
        w.add_tensor(f"blk.{layer}.ffn_down_exps.weight", np.zeros((E, H, F), np.float16))
        w.add_tensor(f"blk.{layer}.ffn_gate_inp.weight", np.zeros((E, H), np.float32))
        for n, rows in (("attn_q", 16), ("attn_k", 8), ("attn_v", 8)):
            w.add_tensor(f"blk.{layer}.{n}.weight", np.zeros((rows, H), np.float16))
        w.add_tensor(f"blk.{layer}.attn_output.weight", np.zeros((H, 16), np.float16))
        w.add_tensor(f"blk.{layer}.attn_norm.weight", np.zeros(H, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_gives_exact_bytes(tmp_path):
    from moesim.costmodel.gguf import load_gguf, read_index

    p = _tiny_gguf(tmp_path / "t.gguf")
    m = load_gguf(p)
    _, tensors = read_index(p)
    assert (m.n_moe_layers, m.n_experts, m.top_k, m.hidden_size) == (2, 4, 2, 16)
    assert m.bytes_per_expert("gguf") == 3 * 8 * 16 * 2  # f16 experts
    assert m.file_bytes("gguf") == sum(t[3] for t in tensors)
    r = CliRunner().invoke(cli, ["estimate", "--model", str(p), "--hw", "rtx3090-pcie4", "--format", "json"])
    assert r.exit_code == 0, r.output


def test_quant_mixes_are_data():
    from moesim.costmodel.models import load_model

    assert load_model("gpt-oss-120b").file_bytes("mxfp4") / 2**30 == pytest.approx(59.02, rel=0.002)
    assert load_model("qwen3-235b-a22b").file_bytes("q4_k") / 2**30 == pytest.approx(123.49, rel=0.005)
    assert load_model("gpt-oss-20b").file_bytes("mxfp4") / 2**30 == pytest.approx(11.27, rel=0.002)


def test_probe_and_calibrate(tmp_path):
    out = tmp_path / "me.toml"
    r = CliRunner().invoke(cli, ["hw", "probe", "-o", str(out), "--quick", "--dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "measured: moesim hw probe" in out.read_text()
    runs = tmp_path / "runs.csv"
    runs.write_text("model,quant,placement,tok_s\nqwen3-30b-a3b,q4_k_m,n-cpu-moe=36,36.7\n"
                    "qwen3-30b-a3b,q4_k_m,n-cpu-moe=20,45\nqwen3-30b-a3b,q4_k_m,vram,60\n")
    cal = tmp_path / "cal.toml"
    r = CliRunner().invoke(cli, ["calibrate", str(runs), "--hw", "rtx2080-i9-10900x", "-o", str(cal)])
    assert r.exit_code == 0, r.output
    assert "->" in r.output and "fitted: moesim calibrate" in cal.read_text()
