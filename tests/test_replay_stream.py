"""Streamed replay (a chunk of tokens per kernel call, the state carried over) equals the in-memory
replay count for count, per layer and per token, clocked too, for every eviction and the options that
carry state across tokens; and a trace file read in token order equals its in-memory decoding."""

import dataclasses
import itertools

import numpy as np
import pytest
from reference_replay import random_routing_arrays
from replay_helpers import make_routing, seeded_rng
from test_replay_timed import fake_cost

from moesim.errors import MoesimError
from moesim.policies import registry
from moesim.simulator import SimConfig, simulate
from moesim.simulator.config import STEP_PIN_REFUSED
from moesim.simulator.counters import COUNTER_NAMES
from moesim.traces import TraceMeta, TraceWriter, load_routing
from moesim.traces.stream import DecodedStore

EVICTIONS = [n for n in registry.names() if not registry.get(n).schedules]  # re-pinning: test_repin.py


def assert_same(a, b, label):
    np.testing.assert_array_equal(a.counts, b.counts, err_msg=f"{label}: per-layer counters")
    np.testing.assert_array_equal(a.token_counts, b.token_counts, err_msg=f"{label}: per-token counters")
    np.testing.assert_allclose(a.mass, b.mass, rtol=1e-12, atol=1e-12, err_msg=f"{label}: mass")
    np.testing.assert_allclose(a.token_mass, b.token_mass, rtol=1e-12, atol=1e-12, err_msg=f"{label}: token mass")
    np.testing.assert_array_equal(a.token_seconds, b.token_seconds, err_msg=f"{label}: seconds per token")
    np.testing.assert_array_equal(a.token_stall, b.token_stall, err_msg=f"{label}: stall per token")
    assert a.counted_tokens == b.counted_tokens
    if a.timing is not None:
        for key in ("s_per_token", "stall_per_token", "s_per_step"):
            assert b.timing[key] == pytest.approx(a.timing[key], rel=1e-12), f"{label}: {key}"
        assert a.timing["bytes_per_token"] == pytest.approx(b.timing["bytes_per_token"], rel=1e-12)


def configs(eviction):
    """Options that carry state across tokens: warm start, warm-up, reset per sequence, admission,
    a global pool, static:W, a decay half-life."""
    spec = {"static": "static:7", "freq": "freq:5"}.get(eviction, eviction)
    for miss, alloc, warm, warmup, reset, admit in [("fetch-all", "per-layer", False, 0, False, None),
                                                    ("threshold:0.3", "global", True, 5, False, 0.4),
                                                    ("first-choice", "per-layer", False, 0, True, 0.6),
                                                    ("substitute", "per-layer", True, 3, True, 0.3),
                                                    ("cpu", "global", False, 0, True, None)]:
        yield SimConfig(eviction=spec if warmup else eviction, miss=miss, slots=3, admit=admit, allocation=alloc,
                        warm=warm, warmup_tokens=warmup, reset_per_sequence=reset)
    # engine step semantics and low-bit fetches (docs/replay-semantics.md)
    pin = eviction not in STEP_PIN_REFUSED
    yield SimConfig(eviction=eviction, miss="lowbit:q2_k", slots=3, admit=0.5, warmup_tokens=2, reset_per_sequence=True,
                    step_pin=pin, max_uploads=1)
    yield SimConfig(eviction=eviction, miss="threshold:0.3", slots=2, allocation="global", admit=0.4, step_pin=pin,
                    max_uploads=2)
    yield SimConfig(eviction=eviction, miss="first-choice", slots=4, admit=0.5, warmup_tokens=1, step_pin=pin,
                    lowbit_share=0.5, lowbit_quant="q2_k", reset_per_sequence=True)


@pytest.mark.parametrize("eviction", EVICTIONS)
def test_streamed_equals_in_memory(eviction):
    with seeded_rng("stream", eviction) as rng:
        # sequences of 1..9 tokens: chunk boundaries fall inside sequences and at their starts
        sel, w, cand, seq = random_routing_arrays(rng, 45, 3, 10, 3, 7, 8)
        routing = make_routing(sel, w, cand, seq, 10)
        costs = [None, fake_cost(3, 10, rng, 12, engine_costs=True)]
        with DecodedStore.from_routing(routing) as store:
            for config, cost in itertools.product(configs(eviction), costs):
                if config.lowbit_share is not None and cost is None:
                    continue  # the low-bit tier is sized by bytes: priced replays only
                want = simulate(routing, config, cost=cost)
                for chunk in (1, 4, 7, 45):
                    got = simulate(store, config, cost=cost, chunk_tokens=chunk)
                    assert_same(want, got, f"{config.label()} priced={cost is not None} chunk={chunk}")


@pytest.mark.parametrize("prefetch", ["prev-token", "next-layer", "oracle"])
def test_streamed_prefetch_and_overlap_equal_in_memory(prefetch):
    """Prefetch state (copies in flight, landed-unused experts, the previous token's selection) and the
    overlapped clock carry across chunks."""
    with seeded_rng("stream-prefetch", prefetch) as rng:
        sel, w, cand, seq = random_routing_arrays(rng, 45, 3, 10, 3, 7, 8)
        routing = make_routing(sel, w, cand, seq, 10)
        costs = [None, fake_cost(3, 10, rng, 12, engine_costs=True)]
        with DecodedStore.from_routing(routing) as store:
            for (ev, miss, alloc, warm, warmup, reset, admit), overlap, cost in itertools.product(
                    [("lru", "fetch-all", "per-layer", False, 0, False, None),
                     ("belady", "first-choice", "global", True, 5, True, 0.4),
                     ("s3fifo", "substitute", "per-layer", False, 3, True, 0.3)],
                    ["none", "layer", "cross-layer"], costs):
                config = SimConfig(eviction=ev, miss=miss, slots=3, admit=admit, allocation=alloc, warm=warm,
                                   warmup_tokens=warmup, reset_per_sequence=reset, prefetch=prefetch,
                                   prefetch_depth=2 if ev == "belady" else 1, overlap=overlap)
                want = simulate(routing, config, cost=cost)
                for chunk in (1, 7, 45):
                    got = simulate(store, config, cost=cost, chunk_tokens=chunk)
                    assert_same(want, got, f"{config.label()} priced={cost is not None} chunk={chunk}")


def test_streamed_refuses_lookahead():
    rng = np.random.default_rng(2)
    routing = make_routing(*random_routing_arrays(rng, 12, 2, 6, 2, 4, 1), 6)
    routing.lookahead = np.full_like(routing.sel, -1)
    with pytest.raises(MoesimError, match="in memory only"):
        simulate(routing, eviction="lru", slots=2, prefetch="lookahead", stream=True)


def test_streamed_without_series_keeps_totals_and_timing():
    rng = np.random.default_rng(4)
    sel, w, cand, seq = random_routing_arrays(rng, 30, 2, 8, 2, 5, 3)
    routing = make_routing(sel, w, cand, seq, 8)
    cost = fake_cost(2, 8, rng, 6)
    config = SimConfig(eviction="belady", miss="threshold:0.3", slots=2, admit=0.5, warmup_tokens=4)
    want = simulate(routing, config, cost=cost)
    got = simulate(routing, config, cost=cost, stream=True, chunk_tokens=6, tokens=False)
    assert got.token_counts.shape == (0, len(COUNTER_NAMES))
    assert got.totals() == want.totals()
    assert got.layer_rows() == want.layer_rows()
    assert got.timing["s_per_token"] == pytest.approx(want.timing["s_per_token"], rel=1e-12)


def test_streamed_refuses_batch_and_record():
    rng = np.random.default_rng(1)
    routing = make_routing(*random_routing_arrays(rng, 12, 1, 6, 2, 4, 4), 6)
    with pytest.raises(MoesimError, match="batch"):
        simulate(routing, eviction="lru", slots=2, batch=2, stream=True)
    with pytest.raises(MoesimError, match="record"):
        simulate(routing, eviction="lru", slots=2, stream=True, record=True)


def write_trace(path, routing, rows_per_group, shuffle_layers=None):
    """A sparse trace file of ``routing`` (token order; each token's layer rows in the given order)."""
    T, L, k = routing.sel.shape
    M = routing.cand.shape[2]
    meta = TraceMeta(model_id="stream-test", family="test", n_experts=routing.n_experts, top_k=k,
                     moe_layers=tuple(range(0, 2 * L, 2)), layout="sparse", n_candidates=M, synthetic=True)
    order = np.arange(L) if shuffle_layers is None else np.asarray(shuffle_layers)
    with TraceWriter(path, meta, row_group_size=rows_per_group) as wr:
        for t in range(T):
            top = ((-0.25 * np.arange(M))[None, :] + np.round(routing.w[t, :, :1], 1)).astype(np.float32)
            wr.write(seq=np.full(L, routing.seq[t])[order], pos=np.full(L, routing.pos[t])[order],
                     layer=np.arange(0, 2 * L, 2)[order], phase=np.array(["decode"] * L),
                     top_ids=routing.cand[t][order], top_logits=top[order], lse=np.full(L, 5.0, np.float32))
    return path


@pytest.mark.parametrize("rows_per_group", [5, 12, 64])
def test_trace_file_streams_in_token_chunks(tmp_path, rows_per_group):
    rng = np.random.default_rng(9)
    routing = make_routing(*random_routing_arrays(rng, 40, 3, 12, 3, 8, 5), 12)
    path = write_trace(tmp_path / "t.parquet", routing, rows_per_group, shuffle_layers=[2, 0, 1])
    whole = load_routing(path)
    cost = fake_cost(3, 12, rng, 20)
    for eviction in ("lru", "belady", "static:9"):
        for miss in ("fetch-all", "threshold:0.3"):
            config = SimConfig(eviction=eviction, miss=miss, slots=3, admit=0.4 if miss != "fetch-all" else None,
                               reset_per_sequence=True)
            want = simulate(whole, config, cost=cost)
            got = simulate(path, config, cost=cost, stream=True, chunk_tokens=3)
            assert_same(want, got, f"{config.label()} rows/group={rows_per_group}")


def test_trace_file_out_of_token_order_is_refused(tmp_path):
    rng = np.random.default_rng(2)
    routing = make_routing(*random_routing_arrays(rng, 6, 2, 6, 2, 4, 1), 6)
    routing = dataclasses.replace(routing, pos=routing.pos[::-1].copy())  # positions descending
    path = write_trace(tmp_path / "t.parquet", routing, 4)
    assert simulate(path, eviction="lru", slots=2).totals()["requests"] == 24  # in memory: any order
    with pytest.raises(MoesimError, match="token order"):
        simulate(path, eviction="lru", slots=2, stream=True)


def test_sweep_streamed_equals_in_memory(monkeypatch, shipped_trace):
    """The default sweep of the shipped trace, streamed by two forked workers, gives the in-memory rows."""
    import moesim

    monkeypatch.setenv("MOESIM_STREAM_TOKENS", "300")  # 7 chunks

    cols = ["row_key", "requests", "hits", "fetches", "substitutions", "drops", "cpu", "admissions", "evictions",
            "copies", "mass", "ms_per_token"]
    want = moesim.sweep(shipped_trace, budgets=0.25, jobs=1, stream=False).sort("row_key").select(cols)
    got = moesim.sweep(shipped_trace, budgets=0.25, jobs=2, stream=True).sort("row_key").select(cols)
    assert want.drop("mass", "ms_per_token").equals(got.drop("mass", "ms_per_token"))
    np.testing.assert_allclose(got["mass"].to_numpy(), want["mass"].to_numpy(), rtol=1e-12)
    np.testing.assert_allclose(got["ms_per_token"].to_numpy(), want["ms_per_token"].to_numpy(), rtol=1e-12)


def test_ranked_layout_streams(tmp_path):
    """moesim synth's ranked layout streams like any other."""
    from moesim.traces.synthetic import synthesize

    path = synthesize("qwen3-30b-a3b", 120, seqs=3, seed=1, path=tmp_path / "s.parquet")
    whole = load_routing(path)
    for eviction in ("lru", "belady"):
        config = SimConfig(eviction=eviction, miss="threshold:0.15", budget=0.25, admit=0.5, reset_per_sequence=True)
        want = simulate(whole, config)
        got = simulate(path, config, stream=True, chunk_tokens=17)
        assert_same(want, got, f"ranked layout {config.label()}")


@pytest.mark.parametrize("layout", ["ranked", "sparse"])
def test_logits_through_the_store(tmp_path, layout):
    """A store keeps the candidates' logits when asked (DecodedStore.from_file(..., logits=True), or a
    Routing that carries them) and its chunks give them with what=(..., "logits"), equal to the in-memory
    decode; a store without them says so in one line."""
    from moesim.traces.synthetic import synthesize

    path = synthesize("qwen3-next-80b-a3b", 50, seqs=2, seed=4, path=tmp_path / "t.parquet", layout=layout)
    whole = load_routing(path)
    assert whole.has_scores and whole.logits.shape == whole.cand.shape
    stores = [DecodedStore.from_file(path, tmp_path / "f", logits=True, chunk_tokens=7),
              DecodedStore.from_routing(whole, tmp_path / "r")]
    for store in stores:
        assert store.has_scores
        got = {a: [] for a in ("sel", "w", "cand", "logits")}
        for c in store.chunks(9, what=tuple(got)):
            for a in got:
                got[a].append(getattr(c, a).copy())
        for a, parts in got.items():
            np.testing.assert_array_equal(np.concatenate(parts), getattr(whole, a), err_msg=a)
        assert next(store.chunks(9)).logits.shape[2] == 0  # not asked for: empty
    plain = DecodedStore.from_file(path, tmp_path / "p")  # the default: no logits on disk
    assert not plain.has_scores and not (tmp_path / "p" / "logits.bin").exists()
    with pytest.raises(MoesimError, match="no candidate scores"):
        next(plain.chunks(9, what=("sel", "logits")))
    with pytest.raises(MoesimError, match="no array 'next'"):
        next(plain.chunks(9, what=("next",)))


def test_decode_cache_keeps_logits(tmp_path, monkeypatch):
    from moesim.traces.decode_cache import load_decoded
    from moesim.traces.synthetic import synthesize

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("MOESIM_DECODE_CACHE", "1")
    path = synthesize("olmoe-1b-7b", 30, seed=2, path=tmp_path / "t.parquet")
    want = load_routing(path)
    first, second = load_decoded(path), load_decoded(path)  # the second from the cache
    assert list((tmp_path / "cache" / "moesim" / "decoded").glob("*.npz"))
    for r in (first, second):
        np.testing.assert_array_equal(r.logits, want.logits)
        np.testing.assert_array_equal(r.cand, want.cand)
    few = load_decoded(path, candidates=10)
    np.testing.assert_array_equal(few.logits, want.logits[:, :, :10])
    assert load_decoded(path, logits=False).logits is None and load_decoded(path, logits=False).cand.shape[2] == 32
    assert load_routing(path, logits=False).logits is None
