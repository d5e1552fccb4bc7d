"""Engine-neutral tracer parts (no torch, no llama.cpp): text splitting, the recorder's
row layout, sparse candidates, CLI argument checks."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from moesim.cli import cli
from moesim.errors import MoesimError
from moesim.traces import TraceFile, load_routing
from moesim.traces.tracers.families import FAMILIES, bytes_per_expert, family_of, gating_meta, moe_layer_indices
from moesim.traces.tracers.recorder import Capture, RouterRecorder, sparse_rows
from moesim.traces.tracers.texts import split_sequences


def _chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_split_sequences_lengths_domains_and_caps(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("x" * 25)
    b.write_text("y" * 7)
    seqs = split_sequences([str(a), str(b)], ["code", "prose"], _chars, seq_len=10)
    assert [len(s.tokens) for s in seqs] == [10, 10, 5, 7]
    assert [s.domain for s in seqs] == ["code", "code", "code", "prose"]
    capped = split_sequences([str(a), str(b)], ["d"], _chars, seq_len=10, max_tokens=12)
    assert [len(s.tokens) for s in capped] == [10, 2, 7]          # at most 12 tokens of each file
    with_bos = split_sequences([str(a)], None, _chars, seq_len=10, bos=1)
    assert all(s.tokens[0] == 1 for s in with_bos) and [len(s.tokens) for s in with_bos] == [10, 10, 8]


def test_split_sequences_errors(tmp_path):
    a = tmp_path / "a.txt"
    a.write_text("abc")
    with pytest.raises(MoesimError, match="one --domain per --text"):
        split_sequences([str(a), str(a)], ["x", "y", "z"], _chars, 8)
    with pytest.raises(MoesimError, match="no such file"):
        split_sequences([str(tmp_path / "none.txt")], None, _chars, 8)
    (tmp_path / "e.txt").write_text("")
    with pytest.raises(MoesimError, match="empty"):
        split_sequences([str(tmp_path / "e.txt")], None, _chars, 8)
    with pytest.raises(MoesimError, match="seq-len"):
        split_sequences([str(a)], None, _chars, 1)


def test_sparse_rows_keep_the_selected_experts():
    logits = np.array([[5.0, 4.0, 3.0, 2.0, 1.0, 0.0]])
    ids, vals = sparse_rows(logits, 3, "softmax", None, selected=np.array([[0, 5]]))
    assert set(ids[0].tolist()) == {0, 1, 5}
    np.testing.assert_array_equal(vals[0], logits[0, ids[0]])
    ids, _ = sparse_rows(logits, 3, "softmax", None, selected=None)
    assert ids[0].tolist() == [0, 1, 2]


def test_recorder_rows_decode_to_the_captures(tmp_path):
    rng = np.random.default_rng(0)
    n, E, k = 5, 8, 2
    fields = dict(model_id="toy", family="custom", top_k=k, moe_layers=[1, 3], dense_layers=[0, 2])
    rec = RouterRecorder(tmp_path / "t.parquet", fields, candidates=4, domains=["a"])
    caps = {}
    for layer in (1, 3):
        logits = rng.normal(size=(n, E)).astype(np.float32)
        sel = np.argsort(-logits, axis=1)[:, :k]
        caps[layer] = Capture(logits, sel, np.take_along_axis(logits, sel, axis=1) * 0 + 0.5)
    rec.add(seq=np.zeros(n), pos=np.arange(n), captures=caps, token=np.arange(n) + 10, domain="a")
    rec.close()
    r = load_routing(tmp_path / "t.parquet")
    assert r.meta.moe_layers == (1, 3) and r.meta.n_candidates == 4 and r.meta.n_experts == E
    np.testing.assert_array_equal(r.token, np.arange(n) + 10)
    for li, layer in enumerate((1, 3)):
        np.testing.assert_array_equal(np.sort(r.sel[:, li], 1), np.sort(caps[layer].selected, 1))
    assert TraceFile(tmp_path / "t.parquet").columns[-2:] == ["selected", "weights"]


def test_recorder_refuses_missing_layers_and_domain(tmp_path):
    rec = RouterRecorder(tmp_path / "t.parquet", dict(model_id="m", family="f", top_k=1), domains=["a"])
    cap = Capture(np.zeros((2, 4), np.float32) + np.arange(4))
    with pytest.raises(MoesimError, match="set the recorder's domain"):
        rec.add(seq=[0, 0], pos=[0, 1], captures={0: cap, 1: cap})
    with pytest.raises(MoesimError, match="do not match the MoE layers"):
        rec.add(seq=[0, 0], pos=[0, 1], captures={0: cap}, domain="a")
    rec.abort()
    assert not (tmp_path / "t.parquet").exists()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_metadata_from_released_configs(family):
    """Gating facts for the real checkpoints' config values (no download: the numbers are
    the released config.json fields)."""
    configs = {
        "qwen3_moe": dict(num_hidden_layers=48, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                          hidden_size=2048, moe_intermediate_size=768, mlp_only_layers=[], decoder_sparse_step=1),
        "qwen3_next": dict(num_hidden_layers=48, num_experts=512, num_experts_per_tok=10, norm_topk_prob=True,
                           hidden_size=2048, moe_intermediate_size=512, shared_expert_intermediate_size=512),
        "qwen2_moe": dict(num_hidden_layers=24, num_experts=60, num_experts_per_tok=4, norm_topk_prob=False,
                          hidden_size=2048, moe_intermediate_size=1408, shared_expert_intermediate_size=5632),
        "mixtral": dict(num_hidden_layers=32, num_local_experts=8, num_experts_per_tok=2, hidden_size=4096,
                        intermediate_size=14336),
        "olmoe": dict(num_hidden_layers=16, num_experts=64, num_experts_per_tok=8, norm_topk_prob=False,
                      hidden_size=2048, intermediate_size=1024),
        "deepseek_v3": dict(num_hidden_layers=61, n_routed_experts=256, num_experts_per_tok=8, norm_topk_prob=True,
                            hidden_size=7168, moe_intermediate_size=2048, first_k_dense_replace=3, n_group=8,
                            topk_group=4, routed_scaling_factor=2.5, n_shared_experts=1),
        "gpt_oss": dict(num_hidden_layers=36, num_local_experts=128, num_experts_per_tok=4, hidden_size=2880,
                        intermediate_size=2880),
        # DeepSeek-V2-Lite (DeepSeek-V2 paper, arXiv 2405.04434, appendix B: 27 layers, 2 shared + 64 routed
        # experts, 6 activated, every FFN but the first one MoE; greedy top-k, no renormalization)
        "deepseek_v2": dict(num_hidden_layers=27, n_routed_experts=64, num_experts_per_tok=6, n_shared_experts=2,
                            first_k_dense_replace=1, hidden_size=2048, moe_intermediate_size=1408,
                            topk_method="greedy", norm_topk_prob=False, routed_scaling_factor=1.0),
        # GLM-4.5 (355B-A32B: 3 dense + 89 MoE layers, 160 experts, top-8, 1 shared, sigmoid + expert bias,
        # scale 2.5, as in slime's scripts/models/glm4.5-355B-A32B.sh)
        "glm4_moe": dict(num_hidden_layers=92, n_routed_experts=160, num_experts_per_tok=8, n_shared_experts=1,
                         first_k_dense_replace=3, hidden_size=5120, moe_intermediate_size=1536, norm_topk_prob=True,
                         routed_scaling_factor=2.5),
        # dots.llm1 (technical report, arXiv 2506.05767: 62 layers, 128 routed + 2 shared experts, top-6)
        "dots1": dict(num_hidden_layers=62, n_routed_experts=128, num_experts_per_tok=6, n_shared_experts=2,
                      first_k_dense_replace=1, hidden_size=4096, moe_intermediate_size=1408, norm_topk_prob=True),
        # Granite-3.0-3B-A800M (Granite 3.0 report, model table: 32 layers, 40 experts of 512, top-8)
        "granitemoe": dict(num_hidden_layers=32, num_local_experts=40, num_experts_per_tok=8, hidden_size=1536,
                           intermediate_size=512),
        # MiniMax-M2 (the released config's values, which transformers' MiniMaxM2Config defaults carry:
        # 62 layers, 256 experts, top-8, hidden 3072, expert size 1536)
        "minimax_m2": dict(num_hidden_layers=62, num_local_experts=256, num_experts_per_tok=8, hidden_size=3072,
                           intermediate_size=1536),
    }
    cfg = configs[family]
    fam = family_of(family)
    g = gating_meta(cfg, fam)
    moe, dense = moe_layer_indices(cfg, fam)
    sigmoid = ("deepseek_v3", "glm4_moe", "dots1", "minimax_m2")
    assert g["gating"] == {"mixtral": "softmax_topk", "gpt_oss": "softmax_topk", "granitemoe": "softmax_topk"}.get(
        family, "sigmoid" if family in sigmoid else "softmax")
    assert g["norm_topk_prob"] == (family not in ("qwen2_moe", "olmoe", "deepseek_v2"))
    assert dense == list(range(cfg.get("first_k_dense_replace", 0)))
    assert len(moe) + len(dense) == cfg["num_hidden_layers"]
    assert g["n_shared_experts"] == cfg.get("n_shared_experts", 1 if family in ("qwen2_moe", "qwen3_next") else 0)
    if family == "qwen3_moe":   # Qwen3-30B-A3B: 3 x 2048 x 768 bf16 weights per expert
        assert bytes_per_expert(cfg, fam)["bf16"] == 3 * 2048 * 768 * 2
    if family == "deepseek_v3":
        assert (g["n_group"], g["topk_group"], g["routed_scaling_factor"]) == (8, 4, 2.5)


def test_cli_argument_errors(tmp_path):
    (tmp_path / "t.txt").write_text("hello")
    runner = CliRunner()
    res = runner.invoke(cli, ["trace", "hf", str(tmp_path), "--text", str(tmp_path / "t.txt"), "--dense",
                              "--candidates", "4", "-o", str(tmp_path / "o.parquet")])
    assert res.exit_code == 2 and "exclude each other" in res.output
    res = runner.invoke(cli, ["trace", "llama", str(tmp_path / "m.gguf"), "--text", str(tmp_path / "t.txt"),
                              "-o", str(tmp_path / "o.parquet")])
    assert res.exit_code == 2 and ("no such GGUF file" in res.output or "pip install 'moesim[llama]'" in res.output)


def test_llama_without_the_extra_says_how_to_install(tmp_path, monkeypatch):
    import sys

    (tmp_path / "t.txt").write_text("hello")
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    res = CliRunner().invoke(cli, ["trace", "llama", str(tmp_path / "m.gguf"), "--text", str(tmp_path / "t.txt"),
                                   "-o", str(tmp_path / "o.parquet")])
    assert res.exit_code == 2 and "pip install 'moesim[llama]'" in res.output
    assert len(res.output.strip().splitlines()) == 1
