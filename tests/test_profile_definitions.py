"""`moesim profile`: every statistic against a naive loop over small random routings."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from moesim.cli import cli
from moesim.reports.profile import profile
from moesim.traces.meta import TraceMeta
from moesim.traces.routing import Routing

KEYS = ["trace", "model", "synthetic", "frequency_only", "tokens", "sequences", "n_layers", "experts", "top_k",
        "reuse_next_token",
        "reuse_chance_uniform", "reuse_chance_marginal", "working_set_95", "layers", "domain_similarity", "gate"]


def random_routing(seed: int, T: int = 60, L: int = 3, E: int = 12, k: int = 3, skew: float = 1.2,
                   domains=("code", "math", "prose"), synthetic: bool = True) -> Routing:
    rng = np.random.default_rng(seed)
    # Several sequences, with a gap in the positions of one of them, so not every neighbour is a pair.
    seq = np.sort(rng.integers(0, 4, T)).astype(np.int32)
    pos = np.zeros(T, dtype=np.int32)
    for s in np.unique(seq):
        idx = np.flatnonzero(seq == s)
        pos[idx] = np.arange(len(idx))
        if len(idx) > 4:
            pos[idx[len(idx) // 2:]] += 3
    p = 1.0 / np.arange(1, E + 1) ** skew
    sel = np.empty((T, L, k), dtype=np.int16)
    for t in range(T):
        for l in range(L):
            sel[t, l] = rng.choice(E, size=k, replace=False, p=p / p.sum())
    w = rng.random((T, L, k)) ** 3
    w = -np.sort(-w, axis=2)
    w = (w / w.sum(axis=2, keepdims=True)).astype(np.float32)
    dom = rng.integers(-1, len(domains), T).astype(np.int16) if domains else np.full(T, -1, np.int16)
    meta = TraceMeta(model_id="test/model", family="test", n_experts=E, top_k=k, moe_layers=tuple(range(2, 2 + L)),
                     layout="sparse", n_candidates=k, synthetic=synthetic)
    return Routing(meta=meta, seq=seq, pos=pos, phase=np.ones(T, np.int8), domain=dom,
                   domain_names=list(domains), token=None, sel=sel, w=w, cand=sel.copy())


def naive(r: Routing) -> dict:
    T, L, k = r.sel.shape
    E = r.n_experts
    per_layer = []
    for l in range(L):
        overlaps = []
        for t in range(T - 1):
            if r.seq[t + 1] == r.seq[t] and r.pos[t + 1] == r.pos[t] + 1:
                overlaps.append(len(set(r.sel[t, l].tolist()) & set(r.sel[t + 1, l].tolist())) / k)
        counts = [0] * E
        for t in range(T):
            for e in r.sel[t, l]:
                counts[int(e)] += 1
        chance = sum((c / T) ** 2 for c in counts) / k
        total, covered, n = sum(counts), 0, 0
        for c in sorted(counts, reverse=True):
            if covered >= 0.95 * total:
                break
            covered += c
            n += 1
        per_layer.append((sum(overlaps) / len(overlaps) if overlaps else None, chance, n / E))
    names = [r.domain_names[c] for c in sorted(set(int(x) for x in r.domain if x >= 0))]
    mat = []
    for a in names:
        row = []
        for b in names:
            sims = []
            for l in range(L):
                pa = np.zeros(E)
                pb = np.zeros(E)
                for t in range(T):
                    if r.domain[t] >= 0 and r.domain_names[r.domain[t]] == a:
                        pa[r.sel[t, l]] += 1
                    if r.domain[t] >= 0 and r.domain_names[r.domain[t]] == b:
                        pb[r.sel[t, l]] += 1
                pa, pb = pa / pa.sum(), pb / pb.sum()
                sims.append(sum(min(x, y) for x, y in zip(pa, pb)) / sum(max(x, y) for x, y in zip(pa, pb)))
            row.append(sum(sims) / L)
        mat.append(row)
    first = [float(r.w[t, l, 0]) for t in range(T) for l in range(L)]
    allw = [float(x) for x in r.w.reshape(-1)]
    reuse = [x[0] for x in per_layer if x[0] is not None]
    return {
        "reuse_next_token": sum(reuse) / len(reuse) if reuse else None,
        "reuse_chance_marginal": sum(x[1] for x in per_layer) / L,
        "working_set_95": sum(x[2] for x in per_layer) / L,
        "layers": per_layer,
        "domains": names,
        "matrix": mat,
        "first": sum(first) / len(first),
        "ge": sum(1 for x in allw if x >= 0.15) / len(allw),
    }


@pytest.mark.parametrize("seed,E,k,skew", [(0, 12, 3, 1.2), (1, 20, 4, 0.5), (2, 8, 2, 2.0), (3, 16, 1, 1.0)])
def test_profile_matches_naive_loops(seed, E, k, skew):
    r = random_routing(seed, E=E, k=k, skew=skew)
    got = profile(r, trace="x.parquet")
    want = naive(r)
    assert list(got) == KEYS
    assert got["reuse_next_token"] == pytest.approx(want["reuse_next_token"], abs=1e-12)
    assert got["reuse_chance_uniform"] == pytest.approx(k / E)
    assert got["reuse_chance_marginal"] == pytest.approx(want["reuse_chance_marginal"], abs=1e-12)
    assert got["working_set_95"] == pytest.approx(want["working_set_95"], abs=1e-12)
    assert [x["layer"] for x in got["layers"]] == [2, 3, 4]
    for row, (reuse, chance, ws) in zip(got["layers"], want["layers"]):
        assert row["reuse_next_token"] == pytest.approx(reuse, abs=1e-12)
        assert row["reuse_chance_marginal"] == pytest.approx(chance, abs=1e-12)
        assert row["working_set_95"] == pytest.approx(ws, abs=1e-12)
    sim = got["domain_similarity"]
    assert sim["measure"] == "weighted_jaccard"
    assert sim["domains"] == want["domains"]
    np.testing.assert_allclose(sim["matrix"], want["matrix"], atol=1e-12)
    assert got["gate"]["mean_first_choice_weight"] == pytest.approx(want["first"], abs=1e-9)
    assert got["gate"]["fraction_weight_ge_0.15"] == pytest.approx(want["ge"], abs=1e-12)
    assert got["tokens"] == len(r.seq) and got["sequences"] == len(np.unique(r.seq))
    assert got["synthetic"] is True and got["model"] == "test/model"


def test_reuse_is_above_chance_only_when_routing_is_sticky():
    r = random_routing(5, T=200, E=32, k=4, skew=0.0)
    base = profile(r)
    assert abs(base["reuse_next_token"] - base["reuse_chance_marginal"]) < 0.05
    sticky = random_routing(5, T=200, E=32, k=4, skew=0.0)
    sticky.sel[1:] = sticky.sel[:1]  # the same experts every token
    p = profile(sticky)
    assert p["reuse_next_token"] == pytest.approx(1.0)
    assert p["working_set_95"] == pytest.approx(4 / 32)
    assert p["reuse_chance_marginal"] == pytest.approx(1.0)


def test_no_pairs_and_no_domains():
    r = random_routing(7, T=5, domains=())
    r.pos = np.arange(0, 10, 2, dtype=np.int32)  # no consecutive positions
    r.seq = np.zeros(5, dtype=np.int32)
    p = profile(r)
    assert p["reuse_next_token"] is None
    assert all(x["reuse_next_token"] is None for x in p["layers"])
    assert p["domain_similarity"] == {"measure": "weighted_jaccard", "domains": [], "matrix": []}


def test_working_set_boundary_is_exact():
    # 100 requests per layer: expert 0 has 95 of them -> one expert covers exactly 95%.
    T, k, E = 100, 1, 4
    sel = np.zeros((T, 1, k), dtype=np.int16)
    sel[95:, 0, 0] = 1
    r = random_routing(0, T=T, L=1, E=E, k=k)
    r.sel = sel
    assert profile(r)["working_set_95"] == pytest.approx(1 / E)
    sel[94, 0, 0] = 2  # now 94% -> two experts needed
    assert profile(r)["working_set_95"] == pytest.approx(2 / E)


def test_cli_profile_json_and_table(tmp_path):
    from moesim.traces.synthetic import synthesize

    path = synthesize("olmoe-1b-7b", 40, seqs=2, seed=3, path=tmp_path / "t.parquet")
    runner = CliRunner()
    res = runner.invoke(cli, ["profile", str(path), "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert list(doc) == KEYS
    assert doc["synthetic"] is True and doc["tokens"] == 40 and doc["sequences"] == 2 and doc["experts"] == 64
    assert len(doc["layers"]) == 16
    res = runner.invoke(cli, ["profile", str(path)])
    assert res.exit_code == 0 and "SYNTHETIC" in res.output and "working set 95%" in res.output


def test_cli_profile_bad_file(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    res = CliRunner().invoke(cli, ["profile", str(bad)], standalone_mode=True)
    assert res.exit_code != 0
