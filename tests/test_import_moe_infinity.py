"""`moesim import moe-infinity`: expert-count matrices as frequency-only (counts) traces."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from moesim.cli import cli
from moesim.errors import MoesimError
from moesim.traces import load_routing
from moesim.traces.importers.moe_infinity import import_moe_infinity
from moesim.traces.info import trace_info
from moesim.traces.routing import expert_counts, validate_trace

NPY = FIXTURES / "moe_infinity_counts.npy"  # [3 requests, 2 layers, 8 experts], request 1 unused, top-2


def test_import_counts(tmp_path):
    out = tmp_path / "c.parquet"
    res = import_moe_infinity(NPY, out, top_k=2, model_id="mixtral-like", layers="1,3")
    assert res.sequences == 2 and res.tokens is None
    assert any("all-zero request" in n for n in res.notes)
    m = res.meta
    assert m.frequency_only and m.layout == "counts" and m.moe_layers == (1, 3) and m.n_experts == 8
    raw = np.load(NPY)
    assert (expert_counts(out) == raw.sum(axis=0).astype(np.int64)).all()
    d = trace_info(out)
    assert d["frequency_only"] and d["tokens"] is None and d["requests"] == 2 and d["layout"] == "counts"
    assert "counts" in d["columns"] and "phase" not in d["columns"]
    v = validate_trace(out)
    assert v["requests"] == 2 and v["steps"] == int(raw.sum()) // 2


def test_replay_refuses_and_info_works(tmp_path):
    out = tmp_path / "c.parquet"
    runner = CliRunner()
    result = runner.invoke(cli, ["import", "moe-infinity", str(NPY), "-o", str(out), "--top-k", "2"])
    assert result.exit_code == 0, result.output
    assert "frequency-only" in result.stdout and "warning: skipped 1 all-zero" in result.stderr
    with pytest.raises(MoesimError, match="frequency-only trace .* cannot be decoded"):
        load_routing(out)
    result = runner.invoke(cli, ["info", str(out), "--format", "json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["frequency_only"] is True
    result = runner.invoke(cli, ["info", str(out)])
    assert result.exit_code == 0 and "n/a (frequency-only" in result.stdout
    result = runner.invoke(cli, ["validate", str(out)])
    assert result.exit_code == 0 and "frequency-only, 2 requests" in result.stdout


def _text(p, text):
    p.write_text(text)
    return p


def _save(tmp_path, a, name="x.npy"):
    p = tmp_path / name
    np.save(p, a, allow_pickle=True)
    return p


BAD = {
    "not npy": (lambda d: _text(d / "x.npy", "hello"), ["--top-k", "2"], "not a .npy file \\(no NumPy header\\)"),
    "pickled": (lambda d: _save(d, np.array([{"a": 1}], dtype=object)), ["--top-k", "2"], "Python objects"),
    "2-D": (lambda d: _save(d, np.ones((2, 8))), ["--top-k", "2"], "expected a \\[requests, layers, experts\\]"),
    "negative": (lambda d: _save(d, -np.ones((1, 2, 8))), ["--top-k", "2"], "negative counts"),
    "fractional": (lambda d: _save(d, np.full((1, 2, 8), 0.5)), ["--top-k", "2"], "fractional counts"),
    "nan": (lambda d: _save(d, np.full((1, 2, 8), np.nan)), ["--top-k", "2"], "NaN"),
    "all zero": (lambda d: _save(d, np.zeros((2, 2, 8))), ["--top-k", "2"], "every count is zero"),
    "wrong k": (lambda d: _save(d, np.ones((1, 2, 8))), ["--top-k", "3"], "not a multiple of top-k=3"),
    "layers count": (lambda d: _save(d, np.ones((1, 2, 8))), ["--top-k", "2", "--layers", "0-4"],
                     "names 5 layers, the matrix has 2"),
    "k above E": (lambda d: _save(d, np.full((1, 2, 4), 5.0)), ["--top-k", "5"], "top-k must be"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed(case, tmp_path):
    make, args, pattern = BAD[case]
    src = make(tmp_path)
    out = tmp_path / "out.parquet"
    result = CliRunner().invoke(cli, ["import", "moe-infinity", str(src), "-o", str(out), *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("moesim: error: ") and "Traceback" not in result.output
    assert re.search(pattern, lines[0]), lines[0]
    assert not out.exists()


def test_top_k_is_required(tmp_path):
    result = CliRunner().invoke(cli, ["import", "moe-infinity", str(NPY), "-o", str(tmp_path / "o.parquet")])
    assert result.exit_code == 2 and "--top-k" in result.stderr
