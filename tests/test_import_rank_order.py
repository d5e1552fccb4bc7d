"""Sources without gate weights: weights exactly 1/k, the source's order kept as the rank order
(trace metadata tie_order = stored), and what a threshold rule then does."""

from __future__ import annotations

import numpy as np

from moesim.simulator import simulate
from moesim.traces import TraceMeta, TraceWriter, load_routing
from moesim.traces.importers.table import import_table


def selected_only_table(path, T=400, E=32, k=4, seed=11):
    """Top-4 ids per token, listed first choice first; some rows with ids in descending order."""
    rng = np.random.default_rng(seed)
    rows = ["seq,pos,layer,experts"]
    for t in range(T):
        ids = rng.choice(E, size=k, replace=False)
        rows.append(f"0,{t},0,{';'.join(map(str, ids))}")
    path.write_text("\n".join(rows) + "\n")
    return path


def test_weights_are_exactly_one_over_k_and_the_first_id_ranks_first(tmp_path):
    src = selected_only_table(tmp_path / "in.csv")
    import_table(src, tmp_path / "t.parquet", n_experts=32)
    r = load_routing(tmp_path / "t.parquet")
    assert r.meta.tie_order == "stored" and (r.w == np.float32(0.25)).all()
    want = np.array([[int(x) for x in line.split(",")[3].split(";")] for line in src.read_text().split()[1:]])
    np.testing.assert_array_equal(r.sel[:, 0], want)  # not re-sorted by expert id


def test_threshold_at_one_over_k_fetches_every_miss(tmp_path):
    """w = 1/k >= θ = 1/k: the threshold rule fetches every miss, as with true 1/k weights.
    The old encoding (scores lowered 1e-6 per rank, no weights column) put ranks 1..k-1
    just below 1/k, so the same rule substituted them."""
    src = selected_only_table(tmp_path / "in.csv")
    import_table(src, tmp_path / "t.parquet", n_experts=32)
    r = load_routing(tmp_path / "t.parquet")
    new = simulate(r, eviction="lru", miss="threshold:0.25", slots=8).totals()
    base = simulate(r, eviction="lru", miss="fetch-all", slots=8).totals()
    assert new["substitutions"] == 0 and new["drops"] == 0 and new["hits"] == base["hits"]

    old_meta = r.meta.replace(tie_order="lower_id")
    ids = r.sel[:, 0].astype(np.int64)
    with TraceWriter(tmp_path / "old.parquet", old_meta, selected=True) as w:
        w.write(seq=np.zeros(len(ids), dtype=int), pos=np.arange(len(ids)), layer=0, top_ids=ids,
                top_logits=np.broadcast_to(-1e-6 * np.arange(4), ids.shape), lse=np.log(4.0), selected=ids)
    old = load_routing(tmp_path / "old.parquet")
    np.testing.assert_array_equal(old.sel, r.sel)  # same rank order...
    assert (old.w[:, :, 2:] < 0.25).all()          # ...but the last ranks just below 1/k
    t = simulate(old, eviction="lru", miss="threshold:0.25", slots=8).totals()
    assert t["substitutions"] + t["drops"] > 0  # no other candidates are stored: substituting drops


def test_tie_order_only_changes_ties(tmp_path):
    """The same rows under both tie orders: identical except where weights tie."""
    meta = TraceMeta(model_id="m", family="f", n_experts=8, top_k=2, moe_layers=(0,), layout="sparse",
                     n_candidates=2)
    sel = np.array([[7, 3], [5, 1], [2, 6]])
    wts = np.array([[0.5, 0.5], [0.2, 0.8], [0.5, 0.5]])
    out = {}
    for order in ("lower_id", "stored"):
        with TraceWriter(tmp_path / f"{order}.parquet", meta.replace(tie_order=order), selected=True,
                         weights=True) as w:
            w.write(seq=np.zeros(3, dtype=int), pos=np.arange(3), layer=0, top_ids=sel, top_logits=np.log(wts),
                    lse=0.0, selected=sel,
                    weights=wts)
        out[order] = load_routing(tmp_path / f"{order}.parquet")
    assert out["lower_id"].sel[:, 0].tolist() == [[3, 7], [1, 5], [2, 6]]
    assert out["stored"].sel[:, 0].tolist() == [[7, 3], [1, 5], [2, 6]]
    assert out["stored"].cand[:, 0].tolist() == [[7, 3], [1, 5], [2, 6]]


def test_which_imports_have_candidate_scores(tmp_path):
    """Logits, or weights of a softmax router (log weights: the logits shifted per step), are candidate
    scores a step policy can use; a selected-only source (placeholder scores) and a sigmoid router's
    weights are not: the metadata says scores: false and the routing has no logits."""
    from moesim.traces.importers.common import write_topk_trace

    rng = np.random.default_rng(3)
    T, E, k = 12, 16, 3
    ids = np.array([rng.choice(E, k, replace=False) for _ in range(T)])
    logits = rng.normal(size=(T, k))
    w = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    keys = dict(seq=np.zeros(T, int), pos=np.arange(T), layer=np.zeros(T, int), phase="decode", ids=ids, where="t")
    for gating, kw, scored in [("softmax", {"logits": logits}, True), ("softmax", {"weights": w}, True),
                               ("softmax_topk", {"weights": w}, True), ("sigmoid", {"weights": w}, False),
                               ("softmax", {}, False)]:
        meta = TraceMeta(model_id="m", family="f", n_experts=E, top_k=k, moe_layers=(0,), gating=gating,
                         n_candidates=k)
        out = tmp_path / f"{gating}-{len(kw)}-{scored}.parquet"
        res = write_topk_trace(out, meta, **keys, **kw)
        r = load_routing(out)
        assert res.meta.has_scores == scored == r.has_scores, (gating, kw.keys())
        if scored:
            # the logits of the candidates in rank order; with weights, log w: the logits up to a shift per step
            x = r.logits[:, 0].astype(np.float64)
            want = np.take_along_axis(logits, np.argsort(-logits, axis=1, kind="stable"), axis=1)
            np.testing.assert_allclose(x - x[:, :1], want - want[:, :1], atol=1e-5)
