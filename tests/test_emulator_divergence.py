"""Quality beyond perplexity on a tiny random checkpoint (no network): the next-token KL divergence from
the unmodified model and the top-1 agreement are what their definitions give from the two passes' logits,
zero and one where no output changes, and chunking the vocabulary changes nothing."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the [torch] extra (torch, transformers) is not installed")
pytest.importorskip("transformers", reason="the [torch] extra (transformers) is not installed")

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
import tiny_moe  # noqa: E402

from moesim.emulator import Emulator  # noqa: E402
from moesim.emulator.perplexity import token_divergence  # noqa: E402
from moesim.simulator import SimConfig  # noqa: E402


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    d = tmp_path_factory.mktemp("div")
    tok = tiny_moe.make_tokenizer()
    model_dir, model, _ = tiny_moe.build("qwen3_moe", d / "model", tokenizer=tok, seed=3)
    (d / "a.txt").write_text(tiny_moe.PROSE)
    (d / "b.txt").write_text(tiny_moe.CODE)
    return Emulator(model, tok, [d / "a.txt", d / "b.txt"], window=40, max_tokens=70, model_dir=model_dir)


def by_definition(logits, base, lengths):
    kl, top1 = [], []
    for b, n in enumerate(lengths):
        p = torch.softmax(base[b, : n - 1].double(), -1)
        q = torch.softmax(logits[b, : n - 1].double(), -1)
        kl.append((p * (p.log() - q.log())).sum(-1).numpy())
        top1.append((p.argmax(-1) == q.argmax(-1)).numpy())
    return np.concatenate(kl), np.concatenate(top1)


def test_kl_and_top1_are_their_definitions(emulator):
    _, _, base, _ = emulator.baseline()
    run = emulator.run(SimConfig(eviction="lru", miss="substitute", admit=0.5, slots=2), keep_logits=True)
    assert run.emulated == "forward" and run.result.totals()["substitutions"] > 0
    kl, top1 = by_definition(run.logits, base, emulator.lengths)
    assert len(run.kl_tokens) == len(run.nll) == len(kl)
    np.testing.assert_allclose(run.kl_tokens, np.maximum(kl, 0), rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(run.top1_tokens, top1)
    assert run.kl > 0 and 0 <= run.top1_agreement <= 1
    assert run.kl == pytest.approx(float(np.mean(kl)), rel=1e-9)
    doc = run.to_dict(emulator.setup)
    assert doc["kl"] == run.kl and doc["top1_agreement"] == run.top1_agreement


def test_no_changed_output_is_kl_zero_and_full_agreement(emulator):
    for shortcut in (True, False):   # the exact shortcut, and fetch-all forced through the pass
        run = emulator.run(SimConfig(eviction="lru", miss="fetch-all", slots=2), shortcut=shortcut)
        assert run.emulated.startswith("exact") == shortcut
        assert run.kl == 0.0 and run.top1_agreement == 1.0
        assert len(run.kl_tokens) == emulator.setup.scored_tokens


def test_chunking_the_vocabulary_changes_nothing(emulator):
    _, _, base, _ = emulator.baseline()
    run = emulator.run(SimConfig(eviction="lru", miss="first-choice", admit=0.5, slots=2), keep_logits=True)
    whole = token_divergence(torch, run.logits, base, emulator.lengths)
    V = run.logits.shape[-1]
    bits = token_divergence(torch, run.logits, base, emulator.lengths, chunk=3 * V)  # 3 rows at a time
    np.testing.assert_array_equal(whole[0], bits[0])
    np.testing.assert_array_equal(whole[1], bits[1])
