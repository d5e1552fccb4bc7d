"""The one-pass LRU curve equals replaying every size (simulate: lru, fetch-all, slots=N), per layer
and for a global pool, exactly; `moesim mrc` prints and writes the curves."""

import json

import numpy as np
import polars as pl
import pytest
from replay_helpers import fast_random_routing
from sweep_helpers import run_cli, small_trace

from moesim.simulator import simulate
from moesim.simulator.counters import HITS, REQUESTS
from moesim.sweeps.mrc import lru_hits, mrc


@pytest.mark.parametrize("T, L, E, k, n_seq, warmup, reset", [
    (300, 3, 16, 4, 1, 0, False),
    (250, 2, 12, 6, 3, 0, True),    # k > some sizes; sequences start cold
    (200, 2, 32, 2, 2, 40, False),  # warm-up tokens replayed, not counted
    (150, 3, 8, 3, 3, 10, True),
])
def test_one_pass_equals_every_per_size_replay(T, L, E, k, n_seq, warmup, reset):
    routing = fast_random_routing(np.random.default_rng(T * E + k), T, L, E, k, n_seq=n_seq)
    lru = lru_hits(routing, warmup, reset)
    for n in range(1, E + 1):
        opts = dict(eviction="lru", miss="fetch-all", slots=n, warmup_tokens=warmup, reset_per_sequence=reset)
        per_layer = simulate(routing, **opts)
        assert per_layer.counts[:, HITS].tolist() == lru["per_layer"][:, n - 1].tolist(), f"per-layer, {n} slots"
        assert per_layer.counts[:, REQUESTS].tolist() == lru["requests"].tolist()
        pooled = simulate(routing, allocation="global", **opts)
        assert pooled.counts[:, HITS].tolist() == lru["pooled"][:, n - 1].tolist(), f"global, {n} x {L} slots"
    # the curves are monotone and reach the compulsory-miss bound
    assert (np.diff(lru["per_layer"], axis=1) >= 0).all()
    assert (np.diff(lru["pooled_any"], axis=1) >= 0).all()
    assert (lru["pooled"][:, -1] == lru["per_layer"][:, -1]).all()  # everything fits either way


def test_mrc_frames_agree_with_replays_on_a_real_geometry(tmp_path):
    from moesim.traces import load_routing

    routing = load_routing(small_trace(tmp_path))
    curve, layers = mrc(routing, evictions=["lru", "belady"], slots=[8, 16], jobs=1)
    E, L = routing.n_experts, routing.n_layers
    lru = curve.filter(pl.col("eviction") == "lru")
    assert lru.height == 2 * E and set(lru["method"]) == {"stack-distance"}
    assert set(curve.filter(pl.col("eviction") == "belady")["method"]) == {"replay"}
    assert layers.height == curve.height * L
    for alloc in ("per-layer", "global"):
        for n in (8, 16):
            res = simulate(routing, eviction="lru", miss="fetch-all", slots=n, allocation=alloc)
            row = lru.filter((pl.col("allocation") == alloc) & (pl.col("slots_per_layer") == n)).row(0, named=True)
            assert row["hits"] == res.totals()["hits"] and row["requests"] == res.totals()["requests"]
            b = simulate(routing, eviction="belady", miss="fetch-all", slots=n, allocation=alloc)
            brow = curve.filter((pl.col("eviction") == "belady") & (pl.col("allocation") == alloc)
                                & (pl.col("slots_per_layer") == n)).row(0, named=True)
            assert brow["hit_rate"] == pytest.approx(b.totals()["hit_rate"])
            assert brow["hit_rate"] >= row["hit_rate"]  # Belady is the offline optimum


def test_mrc_command_table_json_and_files(tmp_path):
    trace = small_trace(tmp_path)
    res = run_cli("mrc", trace, "-e", "lru", "-e", "static", "--slots-grid", "8,16,32", "-o", tmp_path / "c.parquet")
    text = res.stdout
    assert text.count("SYNTHETIC trace") == 2 and "per-layer allocation" in text and "global allocation" in text
    assert "lru hit %" in text and "static hit %" in text
    assert [line.split()[0] for line in text.splitlines() if line[:12].strip().isdigit()] == ["8", "16", "32"] * 2
    curve = pl.read_parquet(tmp_path / "c.parquet")
    assert pl.read_parquet(tmp_path / "c.layers.parquet").height == curve.height * 48
    js = json.loads(run_cli("mrc", trace, "-e", "lru", "--format", "json").stdout)
    assert js["synthetic"] is True and len(js["rows"]) == 2 * 128
    tex = run_cli("mrc", trace, "-e", "lru", "--allocation", "global", "--format", "latex").stdout
    assert tex.count(r"\begin{tabular}{rrr}") == 1 and "SYNTHETIC" in tex
    bad = run_cli("mrc", trace, "--slots-grid", "0,8", ok=False)
    assert bad.exit_code == 2 and "between 1 and E=128" in bad.output
