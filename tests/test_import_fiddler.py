"""`moesim import fiddler`: Fiddler expert-usage JSON (Qwen1.5-MoE-A2.7B, top-4 of 60)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from moesim.cli import cli
from moesim.traces import load_routing
from moesim.traces.importers.fiddler import import_fiddler

REQ0 = FIXTURES / "fiddler_req0.json"  # {"0": [prefill, step, step], ...}
REQ1 = FIXTURES / "fiddler_req1.json"  # {"layers": {"layer_0": {"prefill": ..., "decode": ...}}}


def expected(path):
    doc = json.loads(path.read_text())
    doc = doc.get("layers", doc)
    out = {}
    for key, entry in doc.items():
        layer = int(key.split("_")[-1])
        if isinstance(entry, dict):
            steps = entry["prefill"] + entry["decode"]
            n_prefill = len(entry["prefill"])
        else:
            steps = entry[0] + entry[1:]
            n_prefill = len(entry[0])
        out[layer] = (steps, n_prefill)
    return out


def test_two_requests_two_forms(tmp_path):
    out = tmp_path / "t.parquet"
    res = import_fiddler([REQ0, REQ1], out)
    r = load_routing(out)
    m = r.meta
    assert (m.model_id, m.family, m.n_experts, m.top_k, m.moe_layers) == ("Qwen/Qwen1.5-MoE-A2.7B", "qwen2_moe",
                                                                          60, 4, (0, 1))
    assert m.norm_topk_prob is False and m.synthetic is False and "exactly 1/k" in m.source["weights"]
    assert res.tokens == 5 + 3 and res.sequences == 2 and res.phases == {"decode": 3, "prefill": 5}
    for s, path in enumerate((REQ0, REQ1)):
        exp = expected(path)
        rows = np.flatnonzero(r.seq == s)
        for l, layer in enumerate(m.moe_layers):
            steps, n_prefill = exp[layer]
            assert len(rows) == len(steps)
            for i, t in enumerate(rows):
                assert r.pos[t] == i
                assert r.phase[t] == (0 if i < n_prefill else 1)
                # no weights in the source: 1/k each, the file's order kept (its first id = rank 0)
                assert r.sel[t, l].tolist() == steps[i]
    assert (r.w == 0.25).all() and m.tie_order == "stored"  # exactly 1/k, no rank offsets


def test_cli(tmp_path):
    result = CliRunner().invoke(cli, ["import", "fiddler", str(REQ0), "-o", str(tmp_path / "t.parquet")])
    assert result.exit_code == 0, result.output
    assert "5 tokens in 1 sequence(s)" in result.stdout and "top-4 of 60" in result.stdout


BAD = {
    "not json": ("{oops", "not valid JSON"),
    "wrong k": ('{"0": [[[1, 2, 3]], [4, 5, 6, 7]]}', "entry 0 has 4 expert ids, expected top-k=3"),
    "id out of range": ('{"0": [[[1, 2, 3, 60]], [4, 5, 6, 7]]}', "expert id 60 is outside 0..59"),
    "repeated id": ('{"0": [[[1, 1, 3, 4]]]}', "appears twice"),
    "layers disagree": ('{"0": [[[1, 2, 3, 4]], [4, 5, 6, 7]], "1": [[[1, 2, 3, 4]]]}',
                        "0 prompt tokens|1 prompt tokens and 0 decode steps, but layer 0 has 1 and 1"),
    "flat prefill": ('{"0": [[1, 2, 3, 4, 5, 6, 7, 8], [4, 5, 6, 7]]}', "flat list of 8 ids"),
    "bad key": ('{"zero": [[[1, 2, 3, 4]]]}', "key 'zero' is not a layer index"),
    "bad entry": ('{"0": 5}', "expected \\[prefill entry"),
    "non-integer id": ('{"0": [[[1, 2, 3, 4.5]]]}', "not a list of integer expert ids"),
    "unexpected keys": ('{"0": {"prefill": [[1, 2, 3, 4]], "decoding": []}}', "expected keys 'prefill' and 'decode'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed(case, tmp_path):
    text, pattern = BAD[case]
    src = tmp_path / "in.json"
    src.write_text(text)
    out = tmp_path / "out.parquet"
    result = CliRunner().invoke(cli, ["import", "fiddler", str(src), "-o", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("moesim: error: ") and "Traceback" not in result.output
    assert re.search(pattern, lines[0]), lines[0]
    assert not out.exists()


def test_requests_must_share_layers(tmp_path):
    other = tmp_path / "other.json"
    other.write_text('{"0": [[[1, 2, 3, 4]]], "5": [[[1, 2, 3, 4]]]}')
    result = CliRunner().invoke(cli, ["import", "fiddler", str(REQ0), str(other), "-o", str(tmp_path / "o.parquet")])
    assert result.exit_code == 2 and "layers differ" in result.stderr


PASSES = FIXTURES / "fiddler_passes.json"  # the recorder's {pass: {layer: flat ids}}: 3 prompt tokens, 2 steps


def test_pass_major_layout(tmp_path):
    out = tmp_path / "t.parquet"
    res = import_fiddler([PASSES], out)
    r = load_routing(out)
    doc = json.loads(PASSES.read_text())
    assert r.meta.top_k == 4 and r.meta.moe_layers == (0, 1) and "pass-major" in r.meta.source["format"]
    assert res.tokens == 5 and res.phases == {"decode": 2, "prefill": 3}
    for l, layer in enumerate(("0", "1")):
        prompt = doc["0"][layer]
        steps = [prompt[i:i + 4] for i in range(0, len(prompt), 4)] + [doc["1"][layer], doc["2"][layer]]
        assert r.sel[:, l].tolist() == steps  # k per token in token order; the file's order is the rank order
    assert r.phase.tolist() == [0, 0, 0, 1, 1] and (r.w == 0.25).all()


def test_pass_major_top_k_option(tmp_path):
    """--top-k splits the prompt pass; it must agree with the decode steps."""
    result = CliRunner().invoke(cli, ["import", "fiddler", str(PASSES), "--top-k", "2", "-o",
                                      str(tmp_path / "t.parquet")])
    assert result.exit_code == 2 and "entry 0 has 4 expert ids, expected top-k=2" in result.stderr
    src = tmp_path / "prompt_only.json"
    src.write_text('{"0": {"0": [1, 2, 3, 4, 5, 6]}}')
    result = CliRunner().invoke(cli, ["import", "fiddler", str(src), "-o", str(tmp_path / "a.parquet")])
    assert result.exit_code == 2 and "give --top-k" in result.stderr
    result = CliRunner().invoke(cli, ["import", "fiddler", str(src), "--top-k", "2", "-o", str(tmp_path / "b.parquet")])
    assert result.exit_code == 0 and "3 tokens in 1 sequence(s)" in result.stdout


PASS_BAD = {
    "missing pass": ('{"0": {"0": [1, 2, 3, 4]}, "2": {"0": [1, 2, 3, 4]}}', "forward pass 1 is missing"),
    "layers differ": ('{"0": {"0": [1, 2, 3, 4], "1": [1, 2, 3, 4]}, "1": {"0": [1, 2, 3, 4]}}',
                      "forward pass 1 has different layers from pass 0 \\(layer 1"),
    "prompt not a multiple of k": ('{"0": {"0": [1, 2, 3, 4, 5]}, "1": {"0": [1, 2, 3, 4]}}',
                                   "the prompt pass holds 5 ids, not a positive multiple of top-k=4"),
    "prompt lengths differ": (('{"0": {"0": [1, 2, 3, 4], "1": [1, 2, 3, 4, 5, 6, 7, 8]}, '
                               '"1": {"0": [1, 2, 3, 4], "1": [1, 2, 3, 4]}}'), "2 prompt tokens, but layer 0 has 1"),
    "string id": ('{"0": {"0": [1, 2, 3, "4"]}, "1": {"0": [1, 2, 3, 4]}}', "'4' is not an integer expert id"),
    "deeply nested": ('{"0": ' + "[" * 100000 + "]" * 100000 + "}", "JSON nested too deeply"),
    "id out of range": ('{"0": {"0": [1, 2, 3, 60]}, "1": {"0": [1, 2, 3, 4]}}', "expert id 60 is outside 0..59"),
}


@pytest.mark.parametrize("case", sorted(PASS_BAD))
def test_pass_major_malformed(case, tmp_path):
    BAD[case] = PASS_BAD[case]
    try:
        test_malformed(case, tmp_path)
    finally:
        del BAD[case]
