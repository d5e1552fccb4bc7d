"""The emulator and the transformers tracer under hostile input (issue 33): the documented default-grid
pipeline runs, and broken checkpoints (weights that disagree with config.json, a truncated safetensors
file, a string where a number belongs, no tokenizer) are one `moesim: error:` line."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from test_hostile_input import one_line

pytest.importorskip("torch", reason="the [torch] extra (torch, transformers) is not installed")
pytest.importorskip("transformers", reason="the [torch] extra (transformers) is not installed")

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
import tiny_moe  # noqa: E402

from moesim.cli import cli  # noqa: E402


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile-model")
    model_dir, _, _ = tiny_moe.build("qwen3_moe", d / "model", tokenizer=tiny_moe.make_tokenizer(), seed=5)
    text = d / "text.txt"
    text.write_text(tiny_moe.CODE)
    return Path(model_dir), text


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_the_documented_default_grid_pipeline_runs(model, tmp_path):
    model_dir, text = model
    q = tmp_path / "quality.parquet"
    res = invoke("emulate", model_dir, "--text", text, "--grid", "default", "--budget", "0.25", "--max-tokens", "40",
                 "-o", q)
    assert res.exit_code == 0, res.output
    notes = [x for x in res.stderr.splitlines() if x.startswith("note:")]
    assert len(notes) == 1 and "left out the grid's 3 prefetch configs" in notes[0], res.stderr
    rows = pl.read_parquet(q)
    # 37 policies and the default grid's 8 reroute variants (lru and freq x bias 0.1 / 0.25 / 0.5, keep:2)
    assert rows.height == 45 and rows["label"].str.contains("pf ").sum() == 0
    assert rows["reroute"].is_not_null().sum() == 8


def test_window_zero_is_refused(model):
    model_dir, text = model
    one_line(invoke("emulate", model_dir, "--text", text, "-b", "0.25", "--window", "0"),
             "--window must be at least 2 tokens, got 0")


def test_model_ids_are_shown_escaped(model):
    model_dir, text = model
    res = invoke("emulate", model_dir, "--text", text, "-b", "0.25", "--max-tokens", "20", "--model-id",
                 "m\x1b]0;pwned\x07")
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.output and "\x07" not in res.output and "\\x1b]0;pwned\\x07" in res.output


def _config_edit(key: str, value):
    def edit(d: Path):
        cfg = json.loads((d / "config.json").read_text())
        assert key in cfg, key
        cfg[key] = value
        (d / "config.json").write_text(json.dumps(cfg))
    return edit


def _truncate(d: Path):
    st = d / "model.safetensors"
    st.write_bytes(st.read_bytes()[: st.stat().st_size // 2])


def _no_tokenizer(d: Path):
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (d / f).unlink(missing_ok=True)


@pytest.mark.parametrize("case, edit, pattern", [
    ("more experts than the weights", _config_edit("num_local_experts", 32),
     "cannot load the model \\(its weights do not match config.json: .* mismatch"),
    ("another hidden size", _config_edit("hidden_size", 128), "its weights do not match config.json"),
    ("truncated safetensors", _truncate, "cannot load the model \\(.*(header|incomplete|deserializ)"),
    ("a string for a number", _config_edit("num_experts_per_tok", "4"),
     "config.json: transformers refuses it \\(.*num_experts_per_tok.* expected int, got str"),
    ("no tokenizer", _no_tokenizer, "its tokenizer turns text into no tokens"),
])
@pytest.mark.parametrize("cmd", ["emulate", "trace"])
def test_broken_checkpoints_are_one_line(cmd, case, edit, pattern, model, tmp_path):
    model_dir, text = model
    broken = shutil.copytree(model_dir, tmp_path / "broken")
    edit(broken)
    args = (["emulate", broken, "-b", "0.25"] if cmd == "emulate" else
            ["trace", "hf", broken, "-o", tmp_path / "t.parquet"])
    one_line(invoke(*args, "--text", text, "--max-tokens", "20"), pattern)
