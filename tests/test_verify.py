"""moesim verify: the replay's hit rate against what an engine's expert cache counted (docs/verify.md)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import FIXTURES
from engine_models import llama_moecache_log
from replay_helpers import fast_random_routing

from moesim.cli import cli
from moesim.errors import MoesimError
from moesim.reports.engine_logs import read_engine_log
from moesim.reports.verify import verify
from moesim.simulator import SimConfig, simulate
from moesim.traces import load_routing
from moesim.traces.importers.fitz_tec import import_fitz_tec
from moesim.traces.importers.moe_l2 import import_moe_l2

RTRACE = FIXTURES / "peers" / "fitz_tec.rtrace"
L2LOG = FIXTURES / "peers" / "moe_l2_expert.log"


@pytest.fixture(scope="module")
def fitz_trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("verify") / "fitz.parquet"
    import_fitz_tec(RTRACE, out, top_k=2)
    return out


def test_moe_l2s_own_cache_is_the_step_pinned_replay(fitz_trace, tmp_path):
    """moe-l2's L2Cache (its own code), fed the trace one step at a time with its loads landing before the next
    step, counts exactly the hits of the --step-pin replay; the stream replay differs."""
    cache_mod = pytest.importorskip("moe_l2.cache", reason="moe-l2 (and gguf) not installed")
    r = load_routing(fitz_trace)
    cache = cache_mod.L2Cache(n_layers=r.n_layers, slots_per_layer=4, expert_size=1, l2_dir=tmp_path / "l2",
                              loader_workers=1)
    try:
        for t in range(r.n_tokens):
            for layer in range(r.n_layers):
                cache.request_batch([(layer, int(e)) for e in r.sel[t, layer]])
                cache.wait_for_pending()
        stats = cache.stats()
    finally:
        cache.close()
    (tmp_path / "stats.json").write_text(json.dumps(stats))
    v = verify(fitz_trace, tmp_path / "stats.json", slots=4)
    assert v.log.format == "moe-l2" and v.config.step_pin and v.config.max_uploads is None
    assert v.realized["hits"] == stats["hits"] and v.predicted["hits"] == stats["hits"] and v.difference == 0
    stream = simulate(r, SimConfig(eviction="lru", slots=4)).totals()
    assert v.breakdown[0]["hit_rate"] == stream["hits"] / stream["requests"] != v.predicted["hit_rate"]
    out = CliRunner().invoke(cli, ["verify", str(fitz_trace), str(tmp_path / "stats.json"), "-s", "4"])
    assert out.exit_code == 0, out.output
    assert "difference  +0.00 points" in out.output and "+ engine steps (--step-pin)" in out.output


def test_moe_l2_stats_text(fitz_trace, tmp_path):
    """The 'moe-l2 stats' printout (moe_l2/cli.py cmd_stats)."""
    (tmp_path / "stats.txt").write_text("moe-l2 cache statistics\n  Active domain:    N/A\n  Requests:         240\n"
                                        "  Hits:             207\n  Misses:           33\n  Hit rate:         86.2%\n")
    real = read_engine_log(tmp_path / "stats.txt")
    assert (real.format, real.hits, real.misses) == ("moe-l2", 207, 33)


def test_llama_cpp_expert_cache_log():
    """A llama.cpp PR #27861 cache's log over 1536 decode steps: slots and inserts/step come from its start
    line, the three 512-step windows are compared, and the part the replay does not model (uploads that
    land two steps later) is what remains."""
    with np.errstate(all="ignore"):
        r = fast_random_routing(np.random.default_rng(4), 1536, 2, 16, 2)
    log = llama_moecache_log(r.sel, 16, n_slots=6, max_inserts=2)
    real_text = log.splitlines()[-1]
    v = verify(r, _write(log))
    assert v.config.slots == 6 and v.config.max_uploads == 2 and v.config.step_pin and v.tokens == "decode"
    assert v.steps == 1536 and len(v.per_window) == 3
    h, m = (int(x) for x in re.search(r"hits=(\d+) misses=(\d+)", real_text).groups())
    assert (v.realized["hits"], v.realized["misses"]) == (h, m)
    want = simulate(r, SimConfig(eviction="lru", slots=6, step_pin=True, max_uploads=2)).totals()
    assert v.predicted["hits"] == want["hits"] and v.predicted["requests"] == want["requests"] == h + m
    marks = [tuple(int(x) for x in re.search(r"steps=(\d+) hits=(\d+) misses=(\d+)", line).groups())
             for line in log.splitlines()[1:]]
    prev = (0, 0, 0)
    for w, (steps, hh, mm) in zip(v.per_window, marks):
        assert (w["first_step"], w["end_step"]) == (prev[0], steps)
        assert w["realized"] == pytest.approx((hh - prev[1]) / (hh + mm - prev[1] - prev[2]))
        prev = (steps, hh, mm)
    assert not v.notes
    assert [b["label"].split(" (")[0] for b in v.breakdown] == [
        "stream replay", "+ engine steps", "+ at most 2 uploads per layer per step"]
    assert any("published at the end of step t+1" in u for u in v.unmodelled)
    text = v.text()
    assert "where the difference comes from" in text and "0..511" in text
    doc = json.loads(json.dumps(v.document()))
    assert doc["engine_config"]["slots"] == 6 and doc["difference"] == pytest.approx(v.difference)


def test_decode_steps_only_and_request_check(tmp_path):
    """llama.cpp's cache counts decode steps only: the replay keeps the trace's decode tokens; a log whose
    counts do not fit the trace's layers says so."""
    import_moe_l2(L2LOG, tmp_path / "l2.parquet", n_experts=16)
    r = load_routing(tmp_path / "l2.parquet")
    decode = int((r.phase == 1).sum())
    log = _write(f"moe-cache: steps={decode} hits=70 misses=50 hit-rate=58.3%\n", tmp_path / "a.log")
    v = verify(tmp_path / "l2.parquet", log, slots=6)
    assert v.steps == decode == 10 and v.predicted["requests"] == 10 * 3 * 4 == v.realized["requests"]
    assert any("the PR's default 2" in n for n in v.notes)
    log = _write(f"moe-cache: steps={decode} hits=30 misses=10 hit-rate=75.0%\n", tmp_path / "b.log")
    v = verify(tmp_path / "l2.parquet", log, slots=6)
    assert any("the engine counted 40 requests, the replay 120" in n and "1 layers' worth per step" in n
               for n in v.notes)
    one = verify(tmp_path / "l2.parquet", log, slots=6, layers="3")
    assert one.layers == [3] and one.predicted["requests"] == 40
    with pytest.raises(MoesimError, match="covers 11 decode steps, the trace has 10"):
        verify(tmp_path / "l2.parquet", _write("moe-cache: steps=11 hits=1 misses=1 hit-rate=50.0%\n",
                                               tmp_path / "c.log"), slots=6)


def test_csv_per_layer_and_step(fitz_trace, tmp_path):
    """A documented CSV (hits, misses, layer, step): per-layer rows from the replay itself verify to zero."""
    r = load_routing(fitz_trace)
    res = simulate(r, SimConfig(eviction="lru", slots=5))
    rows = ["layer,hits,misses"]
    for li, layer in enumerate(r.meta.moe_layers):
        h, req = int(res.counts[li, 1]), int(res.counts[li, 0])
        rows.append(f"{layer},{h},{req - h}")
    (tmp_path / "c.csv").write_text("\n".join(rows) + "\n")
    v = verify(fitz_trace, tmp_path / "c.csv", slots=5)
    assert not v.config.step_pin and v.difference == 0 and not v.notes
    assert all(row["difference"] == 0 for row in v.per_layer) and [row["layer"] for row in v.per_layer] == [0, 1, 3]
    # per step: the first 30 of the 40 steps
    tc = res.token_counts
    rows = ["step,hits,misses"] + [f"{t},{int(tc[t, 1])},{int(tc[t, 0] - tc[t, 1])}" for t in range(30)]
    (tmp_path / "s.csv").write_text("\n".join(rows) + "\n")
    v = verify(fitz_trace, tmp_path / "s.csv", slots=5)
    assert v.steps == 30 and v.difference == 0 and v.predicted["requests"] == 30 * 3 * 2


def _write(text, path=None):
    import tempfile
    from pathlib import Path

    path = Path(path) if path else Path(tempfile.mkdtemp()) / "engine.log"
    path.write_text(text)
    return path


BAD = {
    "rate mismatch": ("moe-cache: steps=512 hits=10 misses=10 hit-rate=70.0%\n", r"hit-rate 70\.0% is not"),
    "went back": ("moe-cache: steps=512 hits=10 misses=10 hit-rate=50.0%\nmoe-cache: steps=100 hits=1 misses=1 "
                  "hit-rate=50.0%\n", r"the counters went back \(two runs in one log"),
    "enabled, no lines": ("llama_moe_cache_init: MoE expert cache enabled: 2 layers x 4 slots, 2 inserts/step, 1.0 MiB "
                          "device memory\n", r"run with -lv 5"),
    "unknown": ("hello\n", r"name it with --log-format"),
    "csv column": ("hits,misses,when\n1,2,3\n", r"unknown column 'when'"),
    "csv value": ("hits,misses\n1,x\n", r"line 2: misses 'x' is not a non-negative integer"),
    "l2 json": ('{"hits": 3}', r"misses must be a non-negative integer"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_logs(case, fitz_trace, tmp_path):
    text, pattern = BAD[case]
    log = tmp_path / "engine.log"
    log.write_text(text)
    out = CliRunner().invoke(cli, ["verify", str(fitz_trace), str(log), "-s", "4"])
    assert out.exit_code == 2, out.output
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("moesim: error: ") and "Traceback" not in out.output
    assert re.search(pattern, err[0]), err[0]


def test_needs_slots(fitz_trace, tmp_path):
    (tmp_path / "c.csv").write_text("hits,misses\n1,2\n")
    out = CliRunner().invoke(cli, ["verify", str(fitz_trace), str(tmp_path / "c.csv")])
    assert out.exit_code == 2 and "--slots N" in out.stderr

