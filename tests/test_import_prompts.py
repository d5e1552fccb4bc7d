"""`moesim import prompts`: nested per-prompt routing JSON (prefill/decode [token][layer][k])."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from moesim.cli import cli
from moesim.traces import load_routing
from moesim.traces.importers.prompts import import_prompts

GRANITE = FIXTURES / "prompts_granite.json"  # 32 experts, top-2, 3 layers; prompts "code" and "math"


def run(args):
    return CliRunner().invoke(cli, ["import", "prompts", *map(str, args)])


def test_fixture(tmp_path):
    out = tmp_path / "t.parquet"
    res = import_prompts(GRANITE, out)
    r = load_routing(out)
    m = r.meta
    assert (m.model_id, m.n_experts, m.top_k, m.moe_layers) == ("ibm-granite/granite-3.0-1b-a400m-instruct", 32, 2,
                                                                (0, 1, 2))
    assert res.tokens == 4 and res.sequences == 2 and res.phases == {"decode": 1, "prefill": 3}
    doc = json.loads(GRANITE.read_text())
    for s, (name, entry) in enumerate(doc["prompts"].items()):
        steps = entry["prefill"] + entry["decode"]
        rows = [t for t in range(r.n_tokens) if r.seq[t] == s]
        assert len(rows) == len(steps)
        for i, t in enumerate(rows):
            assert r.pos[t] == i and r.domain_names[r.domain[t]] == name
            assert r.phase[t] == (0 if i < len(entry["prefill"]) else 1)
            assert r.sel[t].tolist() == steps[i]  # no weights: exactly 1/k, the file's order is the rank order
    assert (r.w == 0.5).all()


def test_layers_option(tmp_path):
    result = run([GRANITE, "--layers", "4-6", "-o", tmp_path / "t.parquet"])
    assert result.exit_code == 0, result.output
    assert load_routing(tmp_path / "t.parquet").meta.moe_layers == (4, 5, 6)


P = '{"num_experts": 8, "top_k": 2, "num_layers": 2, "prompts": {"a": %s}}'
BAD = {
    "not json": ("{oops", "not valid JSON"),
    "deeply nested": (P % ("[" * 100000 + "]" * 100000), "JSON nested too deeply"),
    "not an object": ("[1, 2]", "expected a JSON object with a 'prompts' object"),
    "no prompts": ('{"num_experts": 8}', "'prompts' must be a non-empty object"),
    "unknown key": ('{"prompts": {}, "num_expert": 8}', "unexpected top-level key 'num_expert'"),
    "bad count": ('{"num_experts": "8", "prompts": {"a": {}}}', "num_experts must be a positive integer"),
    "no prefill": (P % '{"decode": []}', "expected an object with 'prefill'"),
    "ragged layers": (P % '{"prefill": [[[1, 2], [3, 4]], [[1, 2]]]}', "token 1 has 1 layers, expected num_layers=2"),
    "wrong k": (P % '{"prefill": [[[1, 2], [3, 4, 5]]]}', "token 0 layer 1 has 3 expert ids, expected top_k=2"),
    "float id": (P % '{"prefill": [[[1, 2.5], [3, 4]]]}', "token 0 layer 0 is not a list of integer expert ids"),
    "id out of range": (P % '{"prefill": [[[1, 8], [3, 4]]]}', "expert id 8 is outside 0..7"),
    "decode k differs": (P % '{"prefill": [[[1, 2], [3, 4]]], "decode": [[[1], [2]]]}',
                         "decode: token 0 layer 0 has 1 expert ids, expected top_k=2"),
    "no tokens": (P % '{"prefill": []}', "prefill: no tokens"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed(case, tmp_path):
    text, pattern = BAD[case]
    src = tmp_path / "in.json"
    src.write_text(text)
    out = tmp_path / "out.parquet"
    result = run([src, "-o", out])
    assert result.exit_code == 2, result.output
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("moesim: error: ") and "Traceback" not in result.output
    assert re.search(pattern, err[0]), err[0]
    assert not out.exists()
