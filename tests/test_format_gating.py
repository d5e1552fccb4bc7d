"""Decoding per gating family, checked against independent per-row computations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from moesim.traces import TraceMeta, TraceWriter, load_routing

LAYERS = (0, 2)


def write_dense(path, logits, *, selected=None, weights=None, **meta_kw):
    T, L, E = logits.shape
    meta = TraceMeta(model_id="m", family="f", n_experts=E, moe_layers=LAYERS, layout="dense", **meta_kw)
    with TraceWriter(path, meta, selected=selected is not None, weights=weights is not None,
                     row_group_size=7) as w:
        for l, layer in enumerate(LAYERS):
            kw = {}
            if selected is not None:
                kw["selected"] = selected[:, l]
            if weights is not None:
                kw["weights"] = weights[:, l]
            w.write(seq=np.zeros(T, dtype=int), pos=np.arange(T), layer=layer, logits=logits[:, l], **kw)
    return load_routing(path)


def ranked(scores):
    """Ids by score descending, equal scores: lower id first."""
    return sorted(range(len(scores)), key=lambda e: (-scores[e], e))


def softmax(x):
    m = max(x)
    ex = [math.exp(v - m) for v in x]
    return [v / sum(ex) for v in ex]


def sig(x):
    return 1.0 / (1.0 + math.exp(-x))


def check(r, expect_sel, expect_w):
    for t in range(r.n_tokens):
        for l in range(len(LAYERS)):
            assert r.sel[t, l].tolist() == expect_sel[t][l], (t, l)
            np.testing.assert_allclose(r.w[t, l], expect_w[t][l], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(r.w.sum(axis=2), 1.0, rtol=1e-6)
    assert (np.diff(r.w, axis=2) <= 1e-7).all()  # rank 0 = highest weight


@pytest.fixture
def logits():
    return np.random.default_rng(5).normal(size=(12, len(LAYERS), 16)).astype(np.float32)


@pytest.mark.parametrize("norm", [True, False])
def test_softmax_top_k(tmp_path, logits, norm):
    # softmax over all E, top-k, weights renormalized over the k (the trace's convention,
    # whatever norm_topk_prob says: it only tells whether the model's own sum is 1)
    k = 4
    r = write_dense(tmp_path / "t.parquet", logits, top_k=k, gating="softmax", norm_topk_prob=norm)
    es, ew = [], []
    for t in range(len(logits)):
        es.append([]), ew.append([])
        for l in range(len(LAYERS)):
            p = softmax(logits[t, l].astype(float).tolist())
            s = ranked(p)[:k]
            es[-1].append(s)
            ew[-1].append([p[e] / sum(p[x] for x in s) for e in s])
    check(r, es, ew)
    assert r.meta.norm_topk_prob is norm


def test_softmax_topk_mixtral_gpt_oss(tmp_path, logits):
    # top-k of the raw logits, softmax over those k
    k = 2
    r = write_dense(tmp_path / "t.parquet", logits, top_k=k, gating="softmax_topk")
    es, ew = [], []
    for t in range(len(logits)):
        es.append([]), ew.append([])
        for l in range(len(LAYERS)):
            x = logits[t, l].astype(float).tolist()
            s = ranked(x)[:k]
            es[-1].append(s)
            ew[-1].append(softmax([x[e] for e in s]))
    check(r, es, ew)


def test_sigmoid_with_selection_bias(tmp_path, logits):
    k, E = 4, logits.shape[2]
    bias = np.random.default_rng(9).normal(scale=0.5, size=(len(LAYERS), E))
    r = write_dense(tmp_path / "t.parquet", logits, top_k=k, gating="sigmoid", selection_bias=bias)
    es, ew = [], []
    differs = 0
    for t in range(len(logits)):
        es.append([]), ew.append([])
        for l in range(len(LAYERS)):
            x = logits[t, l].astype(float).tolist()
            biased = [sig(v) + bias[l, e] for e, v in enumerate(x)]
            s = ranked(biased)[:k]
            differs += set(s) != set(ranked(x)[:k])
            es[-1].append(s)
            raw = [sig(x[e]) for e in s]  # weights from the unbiased sigmoid
            w = [v / sum(raw) for v in raw]
            order = sorted(range(k), key=lambda i: (-w[i], s[i]))
            es[-1][-1] = [s[i] for i in order]
            ew[-1].append([w[i] for i in order])
    assert differs > 0  # the bias really changes the selection in this data
    check(r, es, ew)
    # candidates are ranked by the biased selection score
    t, l = 0, 1
    x = logits[t, l].astype(float).tolist()
    assert r.cand[t, l].tolist() == ranked([sig(v) + bias[l, e] for e, v in enumerate(x)])


def test_deepseek_v3_group_limited(tmp_path, logits):
    k, E, n_group, topk_group = 4, logits.shape[2], 4, 2
    bias = np.random.default_rng(2).normal(scale=0.3, size=(len(LAYERS), E))
    r = write_dense(tmp_path / "t.parquet", logits, top_k=k, gating="sigmoid", selection_bias=bias,
                    n_group=n_group, topk_group=topk_group, routed_scaling_factor=2.5)
    size = E // n_group
    es, ew = [], []
    differs = 0
    for t in range(len(logits)):
        es.append([]), ew.append([])
        for l in range(len(LAYERS)):
            x = logits[t, l].astype(float).tolist()
            s_b = [sig(v) + bias[l, e] for e, v in enumerate(x)]
            group_score = [sum(sorted(s_b[g * size:(g + 1) * size], reverse=True)[:2]) for g in range(n_group)]
            keep = ranked(group_score)[:topk_group]
            allowed = [e for e in range(E) if e // size in keep]
            s = sorted(allowed, key=lambda e: (-s_b[e], e))[:k]
            differs += set(s) != set(ranked(s_b)[:k])
            raw = [sig(x[e]) for e in s]
            w = [v / sum(raw) for v in raw]  # routed_scaling_factor cancels in the normalized weights
            order = sorted(range(k), key=lambda i: (-w[i], s[i]))
            es[-1].append([s[i] for i in order])
            ew[-1].append([w[i] for i in order])
    assert differs > 0  # group limiting matters for this data
    check(r, es, ew)


def test_stored_selected_wins(tmp_path, logits):
    k = 3
    # the model's own choice: the k *worst* logits (as a router with a bias would)
    chosen = np.argsort(logits, axis=2)[:, :, :k]
    r = write_dense(tmp_path / "t.parquet", logits, top_k=k, gating="softmax", selected=chosen)
    es, ew = [], []
    for t in range(len(logits)):
        es.append([]), ew.append([])
        for l in range(len(LAYERS)):
            x = logits[t, l].astype(float).tolist()
            s = sorted(chosen[t, l].tolist(), key=lambda e: (-x[e], e))
            es[-1].append(s)
            ew[-1].append(softmax([x[e] for e in s]))
    check(r, es, ew)
    assert r.cand[0, 0, 0] == ranked(logits[0, 0].astype(float).tolist())[0]


def test_stored_weights_win(tmp_path, logits):
    k = 3
    rng = np.random.default_rng(11)
    chosen = np.stack([np.stack([rng.choice(16, k, replace=False) for _ in LAYERS]) for _ in range(len(logits))])
    weights = rng.uniform(0.1, 5.0, size=chosen.shape)
    r = write_dense(tmp_path / "t.parquet", logits, top_k=k, gating="softmax", selected=chosen, weights=weights)
    es, ew = [], []
    for t in range(len(logits)):
        es.append([]), ew.append([])
        for l in range(len(LAYERS)):
            w32 = weights[t, l].astype(np.float32).astype(float)
            order = sorted(range(k), key=lambda i: (-w32[i], chosen[t, l, i]))
            es[-1].append([int(chosen[t, l, i]) for i in order])
            ew[-1].append([w32[i] / w32.sum() for i in order])
    check(r, es, ew)


def test_ties_rank_the_lower_id_first(tmp_path):
    E, k = 8, 3
    logits = np.zeros((3, len(LAYERS), E), dtype=np.float32)
    logits[1, :, [6, 2, 4]] = 1.0  # three equal winners
    logits[2, :, :] = np.array([0, 5, 1, 5, 1, 5, 1, 5], dtype=np.float32)
    r = write_dense(tmp_path / "t.parquet", logits, top_k=k, gating="softmax")
    assert r.sel[0, 0].tolist() == [0, 1, 2] and r.cand[0, 0].tolist() == list(range(E))
    assert r.sel[1, 0].tolist() == [2, 4, 6]
    assert r.cand[1, 0].tolist() == [2, 4, 6, 0, 1, 3, 5, 7]
    assert r.sel[2, 1].tolist() == [1, 3, 5]
    assert r.cand[2, 1].tolist() == [1, 3, 5, 7, 2, 4, 6, 0]
    np.testing.assert_allclose(r.w[:, :, :], 1 / 3, rtol=1e-6)


def test_tied_stored_weights_rank_the_lower_id_first(tmp_path):
    E, k = 8, 2
    logits = np.zeros((1, len(LAYERS), E), dtype=np.float32)
    sel = np.array([[[7, 3], [5, 1]]])
    r = write_dense(tmp_path / "t.parquet", logits, top_k=k, selected=sel, weights=np.full((1, 2, 2), 0.4))
    assert r.sel[0].tolist() == [[3, 7], [1, 5]]
    np.testing.assert_allclose(r.w, 0.5)


def test_sparse_candidates_in_any_order(tmp_path):
    meta = TraceMeta(model_id="m", family="f", n_experts=10, top_k=2, moe_layers=(3,), layout="sparse",
                     n_candidates=4)
    ids = np.array([[9, 1, 4, 7], [2, 3, 0, 8]])
    lg = np.array([[0.5, 2.0, 2.0, -1.0], [1.0, 3.0, 1.0, 0.0]], dtype=np.float32)
    lse = np.log(np.exp(lg.astype(float)).sum(axis=1)) + 1.0  # the other 6 experts carry mass too
    path = tmp_path / "t.parquet"
    with TraceWriter(path, meta) as w:
        w.write(seq=[0, 0], pos=[0, 1], layer=3, top_ids=ids, top_logits=lg, lse=lse)
    r = load_routing(path)
    assert r.cand[0, 0].tolist() == [1, 4, 9, 7] and r.sel[0, 0].tolist() == [1, 4]
    assert r.cand[1, 0].tolist() == [3, 0, 2, 8] and r.sel[1, 0].tolist() == [3, 0]
    np.testing.assert_allclose(r.w[0, 0], [0.5, 0.5], rtol=1e-6)
    np.testing.assert_allclose(r.w[1, 0], softmax([3.0, 1.0]), rtol=1e-6)
