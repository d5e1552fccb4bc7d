"""The demo trainer on a tiny architecture and a few lines of text (never the real demo model's training):
resuming from a checkpoint is bit for bit the uninterrupted run, a variant branches off the baseline's
kept state, and the two router terms of the locality study are what their docstring says."""

from __future__ import annotations

import hashlib
import json
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from moesim.emulator.demo_data import kept_split  # noqa: E402
from moesim.emulator.demo_train import Recipe, router_terms, train  # noqa: E402
from moesim.errors import MoesimError  # noqa: E402

TINY = dict(num_hidden_layers=2, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_experts=8,
            num_experts_per_tok=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
            max_position_embeddings=32, norm_topk_prob=True, tie_word_embeddings=True, rms_norm_eps=1e-6,
            mlp_only_layers=[], decoder_sparse_step=1)
RECIPE = Recipe(steps=6, seq_len=32, batch=3, vocab=300)


def texts():
    import inspect

    import moesim.emulator.demo_train as a
    import moesim.emulator.hooks as b

    train = {"code": inspect.getsource(a)[:20_000], "docs": (a.__doc__ or "") * 8, "legal": inspect.getsource(b)}
    evals = {d: t[:2_000] for d, t in train.items()}
    info = {d: {"train_sha256": hashlib.sha256(train[d].encode()).hexdigest()[:16],
                "eval_sha256": hashlib.sha256(evals[d].encode()).hexdigest()[:16]} for d in train}
    return train, evals, info


def weights_digest(out) -> str:
    return hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()


def test_resume_is_the_uninterrupted_run(tmp_path):
    whole = train(tmp_path / "whole", RECIPE, config=TINY, texts=texts(), checkpoint_every=100, log=lambda s: None)
    assert whole is not None
    assert train(tmp_path / "cut", RECIPE, config=TINY, texts=texts(), stop_at=4, log=lambda s: None) is None
    assert (tmp_path / "cut" / "train_state" / "latest.pt").exists()
    resumed = train(tmp_path / "cut", RECIPE, config=TINY, texts=texts(), log=lambda s: None)
    assert resumed is not None
    assert weights_digest(tmp_path / "whole") == weights_digest(tmp_path / "cut")
    strip = [{k: v for k, v in c.items() if "seconds" not in k} for c in whole["loss_curve"]]
    assert strip == [{k: v for k, v in c.items() if "seconds" not in k} for c in resumed["loss_curve"]]
    assert not (tmp_path / "cut" / "train_state" / "latest.pt").exists()
    assert (tmp_path / "cut" / "train_state" / "branch.pt").exists()   # kept for variants
    m = json.loads((tmp_path / "cut" / "train_manifest.json").read_text())
    assert m["heldout"]["ppl"] > 1 and m["recipe"]["steps"] == 6 and m["branch_at"] == 4
    assert [c["step"] for c in m["loss_curve"] if "loss" in c] == [0, 5]
    with pytest.raises(MoesimError, match="already holds a trained model"):
        train(tmp_path / "cut", RECIPE, config=TINY, texts=texts(), log=lambda s: None)


def test_a_run_keeps_the_text_it_trained_on(tmp_path):
    # a resume or a variant reads the kept split: installing a Debian package changes the legal domain's sources
    assert train(tmp_path / "m", RECIPE, config=TINY, texts=texts(), stop_at=2, log=lambda s: None) is None
    kept = kept_split(tmp_path / "nowhere", tmp_path / "m" / "train_state")
    assert kept is not None and kept[:2] == texts()[:2] and kept[2] == texts()[2]
    assert train(tmp_path / "m", RECIPE, config=TINY, texts=kept, log=lambda s: None) is not None
    assert kept_split(tmp_path / "nowhere") is None


def test_a_resume_with_other_settings_is_refused(tmp_path):
    train(tmp_path / "m", RECIPE, config=TINY, texts=texts(), stop_at=2, log=lambda s: None)
    other = Recipe(**{**RECIPE.__dict__, "lr": 1e-3})
    with pytest.raises(MoesimError, match="another lr"):
        train(tmp_path / "m", other, config=TINY, texts=texts(), log=lambda s: None)


def test_a_variant_branches_off_the_baseline(tmp_path):
    base = train(tmp_path / "base", RECIPE, config=TINY, texts=texts(), log=lambda s: None)
    loc = Recipe(**{**RECIPE.__dict__, "locality": 5.0})
    var = train(tmp_path / "loc", loc, config=TINY, texts=texts(), branch_from=tmp_path / "base", log=lambda s: None)
    assert base is not None and var is not None
    assert var["origin"]["kind"] == "branch" and var["origin"]["step"] == 4
    # identical up to the branch step, then the locality term lowers the routing distance
    pre = [c for c in base["loss_curve"] if c["step"] < 4]
    assert [c for c in var["loss_curve"] if c["step"] < 4] == pre
    last = [c for c in var["loss_curve"] if "locality" in c][-1]
    assert last["locality"] < [c for c in base["loss_curve"] if "locality" in c][-1]["locality"]
    assert not (tmp_path / "loc" / "train_state").exists()
    with pytest.raises(MoesimError, match="another seq_len"):
        train(tmp_path / "bad", Recipe(**{**RECIPE.__dict__, "seq_len": 16}), config=TINY, texts=texts(),
              branch_from=tmp_path / "base", log=lambda s: None)


def test_router_terms():
    E = 4
    same = torch.zeros(2 * 3, E)   # every token routed alike: no distance; uniform: domain entropy 1
    loc, dom = router_terms(torch, [same], 2, 3, [0, 1])
    assert float(loc) == pytest.approx(0.0) and float(dom) == pytest.approx(1.0)
    one_hot = torch.full((1, 2, E), -1e4)
    one_hot[0, 0, 0] = one_hot[0, 1, 1] = 0.0   # t-1 on expert 0, t on expert 1: distance 1
    loc, dom = router_terms(torch, [one_hot.view(2, E)], 1, 2, [0])
    assert float(loc) == pytest.approx(1.0) and float(dom) == pytest.approx(math.log(2) / math.log(E))


def test_bad_weights_are_refused():
    with pytest.raises(MoesimError, match="locality weight"):
        Recipe(locality=-1.0)
    with pytest.raises(MoesimError, match="domain weight"):
        Recipe(domain=float("nan"))


def test_the_command_refuses_the_repository_and_bad_settings(tmp_path, capsys):
    from pathlib import Path

    from moesim.emulator.demo_model import main

    repo = Path(__file__).resolve().parents[1]
    assert main(["--out", str(repo / "demo")]) == 2
    assert "outside the repository" in capsys.readouterr().err
    assert main(["--out", str(tmp_path / "m"), "--locality", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "demo_model: error: the locality weight" in err
    assert main(["--out", str(tmp_path / "v"), "--from", str(tmp_path / "none")]) == 2
    assert "no branch state" in capsys.readouterr().err
