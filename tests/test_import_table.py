"""`moesim import table`: wide and long CSV / Parquet routing tables."""

from __future__ import annotations

import csv
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from moesim.cli import cli
from moesim.errors import MoesimError
from moesim.traces import load_routing
from moesim.traces.importers.table import import_table

WIDE = FIXTURES / "table_wide.csv"
LONG = FIXTURES / "table_long.csv"


def truth():
    rows = list(csv.DictReader(open(WIDE)))
    return {(int(r["seq"]), int(r["pos"]), int(r["layer"])):
            ([int(x) for x in r["experts"].split(";")], [float(x) for x in r["weights"].split(";")],
             r["phase"], r["domain"]) for r in rows}


def check_against_truth(r):
    t = truth()
    assert r.n_tokens == 5 and r.meta.moe_layers == (0, 2) and r.meta.n_experts == 8 and r.meta.top_k == 2
    for i in range(r.n_tokens):
        for l, layer in enumerate(r.meta.moe_layers):
            ids, w, phase, domain = t[(int(r.seq[i]), int(r.pos[i]), layer)]
            order = sorted(range(2), key=lambda j: (-w[j], ids[j]))
            assert r.sel[i, l].tolist() == [ids[j] for j in order]
            np.testing.assert_allclose(r.w[i, l], [w[j] / sum(w) for j in order], rtol=1e-6)
            assert r.phase[i] == ("prefill", "decode").index(phase)
            assert r.domain_names[r.domain[i]] == domain


@pytest.mark.parametrize("src", [WIDE, LONG])
def test_wide_and_long_csv(src, tmp_path):
    out = tmp_path / "t.parquet"
    res = import_table(src, out, n_experts=8)
    assert res.tokens == 5 and res.sequences == 2
    r = load_routing(out)
    check_against_truth(r)
    assert r.meta.synthetic is False and r.meta.source["weights"] == "from the table"


def test_parquet_with_list_columns_and_aliases(tmp_path):
    t = truth()
    keys = sorted(t)
    table = pa.table({
        "sequence": [k[0] for k in keys], "position": [k[1] for k in keys], "layer_id": [k[2] for k in keys],
        "topk_ids": pa.array([t[k][0] for k in keys], pa.list_(pa.int32())),
        "topk_weights": pa.array([t[k][1] for k in keys], pa.list_(pa.float32())),
        "phase": [t[k][2] for k in keys], "domain": [t[k][3] for k in keys],
    })
    pq.write_table(table, tmp_path / "in.parquet")
    import_table(tmp_path / "in.parquet", tmp_path / "t.parquet", n_experts=8)
    check_against_truth(load_routing(tmp_path / "t.parquet"))


def test_logits_without_weights_use_the_gating(tmp_path):
    src = tmp_path / "in.csv"
    src.write_text("seq,pos,layer,experts,logits\n0,0,5,2 7 1,[1.0 3.0 2.0]\n0,1,5,4 0 3,0.5;0.5;-1\n")
    import_table(src, tmp_path / "a.parquet", n_experts=8, gating="softmax_topk")
    r = load_routing(tmp_path / "a.parquet")
    assert r.sel[0, 0].tolist() == [7, 1, 2] and r.sel[1, 0].tolist() == [0, 4, 3]
    x = np.exp([3.0, 2.0, 1.0])
    np.testing.assert_allclose(r.w[0, 0], x / x.sum(), rtol=1e-6)
    import_table(src, tmp_path / "b.parquet", n_experts=8, gating="sigmoid")
    r = load_routing(tmp_path / "b.parquet")
    s = 1 / (1 + np.exp(-np.array([3.0, 2.0, 1.0])))
    np.testing.assert_allclose(r.w[0, 0], s / s.sum(), rtol=1e-6)
    assert r.meta.source["weights"] == "from the logits"


def test_ids_only_keep_the_table_order(tmp_path):
    src = tmp_path / "in.csv"
    src.write_text("seq,pos,layer,expert\n0,0,0,6\n0,0,0,2\n0,0,0,4\n0,1,0,1\n0,1,0,7\n0,1,0,0\n")
    import_table(src, tmp_path / "t.parquet", n_experts=8)
    r = load_routing(tmp_path / "t.parquet")
    # no weights in the table: 1/k each, the first listed expert stays the first choice
    assert r.sel[:, 0].tolist() == [[6, 2, 4], [1, 7, 0]]
    np.testing.assert_allclose(r.w, 1 / 3, atol=1e-5)
    assert "uniform" in r.meta.source["weights"]


def test_preset_fills_the_geometry(tmp_path):
    src = tmp_path / "in.csv"

    def ids(p, layer):
        return ";".join(str((p * 7 + layer + j * 13) % 128) for j in range(8))

    rows = ["seq,pos,layer,experts"] + [f"0,{p},{layer},{ids(p, layer)}"
                                        for p in range(3) for layer in (0, 47)]
    src.write_text("\n".join(rows) + "\n")
    res = import_table(src, tmp_path / "t.parquet", preset="qwen3-30b-a3b")
    m = res.meta
    assert (m.n_experts, m.top_k, m.moe_layers, m.gating) == (128, 8, (0, 47), "softmax")
    assert m.source["preset"] == "qwen3-30b-a3b" and m.bytes_per_expert
    with pytest.raises(MoesimError, match="top-k is 4"):
        import_table(src, tmp_path / "u.parquet", preset="qwen3-30b-a3b", top_k=4)


BAD = {
    "no experts option": ("seq,pos,layer,experts\n0,0,0,1;2\n", [], "--experts E"),
    "missing key column": ("seq,layer,experts\n0,0,1;2\n", ["--experts", "8"], "missing column\\(s\\) pos"),
    "no expert column": ("seq,pos,layer,foo\n0,0,0,1\n", ["--experts", "8"], "no expert column"),
    "uneven k": ("seq,pos,layer,experts\n0,0,0,1;2\n0,1,0,1;2;3\n", ["--experts", "8"], "3 values in row 2"),
    "id out of range": ("seq,pos,layer,experts\n0,0,0,1;8\n", ["--experts", "8"], "expert id 8 is outside 0..7"),
    "repeated expert": ("seq,pos,layer,experts\n0,0,0,3;3\n", ["--experts", "8"], "appears twice"),
    "duplicate step": ("seq,pos,layer,experts\n0,0,0,1;2\n0,0,0,3;4\n", ["--experts", "8"],
                       "duplicate rows for \\(seq=0, pos=0, layer=0\\)"),
    "token missing a layer": ("seq,pos,layer,experts\n0,0,0,1;2\n0,0,1,1;2\n0,1,0,1;2\n", ["--experts", "8"],
                              "token \\(seq=0, pos=1\\) lacks layer 1"),
    "weights count": ("seq,pos,layer,experts,weights\n0,0,0,1;2,0.5\n", ["--experts", "8"], "has 1 values per row"),
    "negative weight": ("seq,pos,layer,experts,weights\n0,0,0,1;2,0.5;-0.1\n", ["--experts", "8"],
                        "gate weights must be finite, >= 0"),
    "nan logit": ("seq,pos,layer,experts,logits\n0,0,0,1;2,0.5;nan\n", ["--experts", "8"], "NaN or infinite"),
    "bad id text": ("seq,pos,layer,experts\n0,0,0,1;x\n", ["--experts", "8"], "holds 'x', not a number"),
    "bad phase": ("seq,pos,layer,experts,phase\n0,0,0,1;2,warmup\n", ["--experts", "8"], "unknown phase 'warmup'"),
    "long uneven k": ("seq,pos,layer,expert\n0,0,0,1\n0,0,0,2\n0,1,0,3\n", ["--experts", "8"],
                      "has 1 experts, the first step has 2"),
    "long repeated rank": ("seq,pos,layer,rank,expert\n0,0,0,0,1\n0,0,0,0,2\n", ["--experts", "8"], "repeats a rank"),
    "long step disagrees": ("seq,pos,layer,expert,phase\n0,0,0,1,prefill\n0,0,0,2,decode\n", ["--experts", "8"],
                            "disagree on phase"),
    "both layouts": ("seq,pos,layer,experts,expert\n0,0,0,1;2,1\n", ["--experts", "8"], "keep one layout"),
    "k above E": ("seq,pos,layer,experts\n0,0,0,1;2;3\n", ["--experts", "2"], "more than E=2"),
    "fractional layer": ("seq,pos,layer,experts\n0,0,0.5,1;2\n", ["--experts", "8"], "whole numbers"),
    "unknown preset": ("seq,pos,layer,experts\n0,0,0,1;2\n", ["--preset", "nope"], "unknown model preset"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_tables(case, tmp_path):
    text, args, pattern = BAD[case]
    src = tmp_path / "in.csv"
    src.write_text(text)
    out = tmp_path / "out.parquet"
    result = CliRunner().invoke(cli, ["import", "table", str(src), "-o", str(out), *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("moesim: error: ") and "Traceback" not in result.output
    assert re.search(pattern, lines[0]), lines[0]
    assert not out.exists()


def test_unreadable_inputs(tmp_path):
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(MoesimError, match="unknown table format"):
        import_table(tmp_path / "x.json", tmp_path / "o.parquet", n_experts=8)
    (tmp_path / "x.parquet").write_text("not parquet")
    with pytest.raises(MoesimError, match="cannot read it as parquet"):
        import_table(tmp_path / "x.parquet", tmp_path / "o.parquet", n_experts=8)
    with pytest.raises(MoesimError, match="no such file"):
        import_table(tmp_path / "missing.csv", tmp_path / "o.parquet", n_experts=8)


def test_cli_summary(tmp_path):
    result = CliRunner().invoke(cli, ["import", "table", str(LONG), "-o", str(tmp_path / "t.parquet"),
                                      "--experts", "8", "--model", "my/engine-model", "--synthetic"])
    assert result.exit_code == 0, result.output
    assert "5 tokens in 2 sequence(s)" in result.stdout and "SYNTHETIC" in result.stdout
    r = load_routing(tmp_path / "t.parquet")
    assert r.meta.model_id == "my/engine-model" and r.synthetic
