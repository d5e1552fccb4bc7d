"""benchmarks/locality_study.py on two tiny random checkpoints (never the demo models): the baseline's own
row costs nothing and avoids nothing, every number the tables print is in its JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the [torch] extra (torch, transformers) is not installed")
pytest.importorskip("transformers", reason="the [torch] extra (transformers) is not installed")

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
import locality_study  # noqa: E402
import tiny_moe  # noqa: E402


def test_the_study_tables_on_tiny_models(tmp_path, capsys):
    tok = tiny_moe.make_tokenizer()
    dirs = [tiny_moe.build("qwen3_moe", tmp_path / name, tokenizer=tok, seed=seed)[0]
            for name, seed in (("base", 7), ("var", 8))]
    for d, text in zip(locality_study.DOMAINS, (tiny_moe.CODE, tiny_moe.PROSE, tiny_moe.PROSE[::-1])):
        (dirs[0] / f"eval_{d}.txt").write_text(text)
    (dirs[1] / "train_manifest.json").write_text(json.dumps({"recipe": {"locality": 0.5}, "heldout": {"ppl": 9.0}}))
    out = tmp_path / "study.json"
    rc = locality_study.main([str(dirs[0]), str(dirs[1]), "--reroute", "bias:0.5", "--max-tokens", "40",
                              "--window", "32", "--json", str(out)])
    assert rc == 0
    docs = json.loads(out.read_text())
    assert [d["locality"] for d in docs] == [None, 0.5] and docs[1]["heldout_ppl"] == 9.0
    assert docs[0]["scored_tokens"] == docs[1]["scored_tokens"] > 0
    printed = capsys.readouterr().out
    assert "| baseline | - |" in printed and "| locality 0.5 | 9.00 |" in printed
    assert "| baseline | +0.00 | - |" in printed and "| locality 0.5 + bias:0.5 (stacked) |" in printed
    for d in docs:
        assert 0 <= d["lru_hit_rate"] <= 1 and 0 <= d["static_hit_rate"] <= 1 and d["lru_misses"] > 0
        assert d["rerouted"]["bias:0.5"]["misses"] <= d["lru_misses"] * 1.5
