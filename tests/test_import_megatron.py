"""`moesim import megatron`: Megatron-LM router traces and their logits sidecar (docs/importers.md, "Megatron-LM").
The fixture was written by Megatron-LM's own RouterTracer (tests/fixtures/megatron_trace.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import FIXTURES
from import_checks import check_replays

from moesim.cli import cli
from moesim.traces import load_routing
from moesim.traces.importers.megatron import bf16_to_float32, import_megatron

DIR = FIXTURES / "peers" / "megatron"
TRACE = DIR / "router_trace_rank0.jsonl"  # 3 steps (6, 3, 3 tokens) x decoder layers 0, 1, 3 (+ MTP), top-2 of 16


def records():
    return [json.loads(x) for x in TRACE.read_text().splitlines()]


def run(args):
    return CliRunner().invoke(cli, ["import", "megatron", *map(str, args)])


def test_steps_selection_and_logits(tmp_path):
    res = import_megatron(TRACE, tmp_path / "t.parquet")
    r = load_routing(tmp_path / "t.parquet")
    m = r.meta
    assert (m.layout, m.n_experts, m.top_k, m.moe_layers) == ("dense", 16, 2, (0, 1, 3))
    assert res.sequences == 3 and res.tokens == 12 and any("skipped 3 MTP record(s)" in n for n in res.notes)
    raw = (DIR / "logits_rank0.bin").read_bytes()
    at = {}
    for rec in records():
        if rec["block"] != "decoder":
            continue
        lg = bf16_to_float32(raw[rec["logit_offset"]:rec["logit_offset"] + rec["logit_bytes"]]).reshape(
            rec["logit_shape"])
        for i, ids in enumerate(rec["top_indices"]):
            at[(rec["step"], i, rec["layer"])] = (ids, lg[i])
    for t in range(r.n_tokens):
        for l, layer in enumerate(m.moe_layers):
            ids, lg = at[(int(r.seq[t]), int(r.pos[t]), layer)]
            assert sorted(r.sel[t, l].tolist()) == sorted(ids)  # the router's own selection
            order = np.lexsort((np.arange(16), -lg))
            assert r.cand[t, l].tolist() == order.tolist()  # all 16 candidates kept in score order
            p = np.exp(lg[ids] - lg[ids].max())
            np.testing.assert_allclose(np.sort(r.w[t, l]), np.sort(p / p.sum()), rtol=1e-5)


def test_megatrons_own_reader_agrees(tmp_path):
    """Megatron's load_logits_for_record reads the sidecar to the logits the trace stores (needs torch and a
    Megatron-LM checkout in MEGATRON_LM), and its tracer rewrites the fixture byte for byte."""
    pytest.importorskip("torch", reason="torch is not installed")
    root = os.environ.get("MEGATRON_LM")
    if not root or not (Path(root) / "megatron/core/transformer/moe/router_trace.py").is_file():
        pytest.skip("set MEGATRON_LM to a Megatron-LM checkout")
    sys.path.insert(0, str(FIXTURES))
    import megatron_trace

    rt = megatron_trace.load_tracer_module(Path(root))
    import_megatron(TRACE, tmp_path / "t.parquet")
    r = load_routing(tmp_path / "t.parquet")
    for rec in records()[:3]:
        theirs = rt.load_logits_for_record(rec, str(DIR)).float().numpy()
        ours = bf16_to_float32((DIR / "logits_rank0.bin").read_bytes()[rec["logit_offset"]:][:rec["logit_bytes"]])
        np.testing.assert_array_equal(theirs.reshape(-1), ours)
    megatron_trace.main(Path(root), tmp_path / "again")
    for f in ("router_trace_rank0.jsonl", "logits_rank0.bin"):
        assert (tmp_path / "again" / f).read_bytes() == (DIR / f).read_bytes()
    assert r.n_tokens == 12


def test_without_logits(tmp_path):
    res = import_megatron(TRACE, tmp_path / "t.parquet", no_logits=True, n_experts=16)
    r = load_routing(tmp_path / "t.parquet")
    assert r.meta.layout == "sparse" and r.meta.n_candidates == 2 and (r.w == 0.5).all() and res.tokens == 12
    s = import_megatron(TRACE, tmp_path / "s.parquet", candidates=4)
    assert s.meta.layout == "sparse" and s.meta.n_candidates == 4


def test_replay_checks(tmp_path):
    import_megatron(TRACE, tmp_path / "t.parquet")
    check_replays(load_routing(tmp_path / "t.parquet"), tmp_path)


def _variant(tmp_path, name, edit=None, sidecar=None):
    d = tmp_path / name
    d.mkdir()
    recs = records()
    if edit:
        edit(recs)
    (d / "router_trace_rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    raw = (DIR / "logits_rank0.bin").read_bytes()
    if sidecar is not False:
        (d / "logits_rank0.bin").write_bytes(raw if sidecar is None else sidecar(raw))
    return d / "router_trace_rank0.jsonl"


def _set(i, key, value):
    def edit(recs):
        recs[i][key] = value
    return edit


BAD = {
    "truncated sidecar": (None, lambda raw: raw[:-100], r"logits_rank0\.bin: truncated: line \d+'s logits end at byte"),
    "missing sidecar": (None, False, r"logits_rank0\.bin: no such file"),
    "id out of range": (_set(0, "top_indices", [[3, 50]] + records()[0]["top_indices"][1:]), None,
                        r"expert id 50 is outside 0\.\.15"),
    "shape": (_set(1, "num_tokens", 5), None, r"line 2: top_indices has shape \(6, 2\), the record says num_tokens 5"),
    "layer twice": (_set(1, "layer", 0), None, r"line 2: step 0 has layer 0 twice"),
    "logit shape": (_set(0, "logit_shape", [6, 8]), None, r"line 1: logit_shape \[6, 8\] / logit_bytes 192"),
    "bad step": (_set(0, "step", -1), None, r"line 1: step must be a non-negative integer"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed(case, tmp_path):
    edit, sidecar, pattern = BAD[case]
    src = _variant(tmp_path, "in", edit, sidecar)
    out = tmp_path / "out.parquet"
    result = run([src, "-o", out])
    assert result.exit_code == 2, result.output
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("moesim: error: ") and "Traceback" not in result.output
    assert re.search(pattern, err[0]), err[0]
    assert not out.exists() and not list(tmp_path.glob(".*partial"))


def test_not_json_and_layers_differ(tmp_path):
    d = tmp_path / "x"
    shutil.copytree(DIR, d)
    lines = (d / "router_trace_rank0.jsonl").read_text().splitlines()
    (d / "router_trace_rank0.jsonl").write_text("\n".join(lines[:5] + ["{oops"] + lines[5:]) + "\n")
    result = run([d / "router_trace_rank0.jsonl", "-o", tmp_path / "o.parquet"])
    assert result.exit_code == 2 and "line 6: not valid JSON" in result.stderr
    (d / "router_trace_rank0.jsonl").write_text("\n".join(lines[:5] + lines[6:]) + "\n")  # step 1 loses a layer
    result = run([d / "router_trace_rank0.jsonl", "-o", tmp_path / "o.parquet"])
    assert result.exit_code == 2 and "step 1 has layers" in result.stderr
