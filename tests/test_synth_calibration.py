"""The synthetic presets reproduce the published routing profiles (docs/synthetic.md, "Calibration"),
and the shipped trace is exactly what its recorded command produces."""

from __future__ import annotations

import hashlib
import shlex

import numpy as np
import pytest

from moesim.reports.profile import profile, profile_trace
from moesim.traces import TraceFile, load_routing
from moesim.traces.synthetic import synthesize


@pytest.fixture(scope="module")
def qwen3_30b(tmp_path_factory):
    # Exactly `moesim synth --preset qwen3-30b-a3b --tokens 2000` (seed 0, default domains).
    path = synthesize("qwen3-30b-a3b", 2000, path=tmp_path_factory.mktemp("cal") / "q30.parquet")
    return profile(load_routing(path))


def test_qwen3_30b_reuse_working_set_and_chance(qwen3_30b):
    p = qwen3_30b
    assert p["synthetic"] is True and p["tokens"] == 2000
    assert p["reuse_next_token"] == pytest.approx(0.444, abs=0.03)
    assert p["reuse_chance_marginal"] == pytest.approx(0.223, abs=0.03)
    assert p["working_set_95"] == pytest.approx(0.525, abs=0.05)
    assert p["reuse_chance_uniform"] == pytest.approx(8 / 128)


def test_qwen3_30b_code_is_nearly_disjoint(qwen3_30b):
    sim = qwen3_30b["domain_similarity"]
    names, m = sim["domains"], np.asarray(sim["matrix"])
    assert sorted(names) == ["code", "math", "medical", "prose"]
    c = names.index("code")
    others = [i for i in range(len(names)) if i != c]
    code_vs = [m[c, j] for j in others]
    among = [m[i, j] for i in others for j in others if i < j]
    assert all(0.1 <= x <= 0.2 for x in code_vs), code_vs
    assert all(0.3 <= x <= 0.4 for x in among), among


def test_shipped_trace(shipped_trace):
    assert shipped_trace.exists()
    assert shipped_trace.stat().st_size <= 10 * 2**20
    tf = TraceFile(shipped_trace)
    m = tf.meta
    assert m.synthetic and m.layout == "ranked" and m.model_id == "Qwen/Qwen3-Next-80B-A3B-Instruct"
    assert (m.n_experts, m.top_k, m.n_layers) == (512, 10, 48)
    assert m.source["command"].startswith("moesim synth --preset qwen3-next-80b-a3b")
    p = profile_trace(shipped_trace)
    assert p["tokens"] >= 1000 and len(p["domain_similarity"]["domains"]) >= 3
    assert p["reuse_next_token"] > 2 * p["reuse_chance_marginal"]


def test_shipped_trace_is_reproducible(shipped_trace, tmp_path, monkeypatch):
    """Running the command recorded in the trace (from the repository root) rebuilds it byte for byte."""
    from click.testing import CliRunner

    from moesim.cli import cli

    cmd = TraceFile(shipped_trace).meta.source["command"]
    args = shlex.split(cmd)[1:]
    out = args[args.index("-o") + 1]
    # Same relative output path (it is part of the recorded metadata), inside a scratch directory.
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    digest = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()  # noqa: E731
    assert digest(tmp_path / out) == digest(shipped_trace)
