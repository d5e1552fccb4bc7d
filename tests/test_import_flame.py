"""`moesim import flame`: tiny hand-made CSV trees in the real FLAME / DynaNDE layout."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from moesim.cli import cli
from moesim.errors import MoesimError
from moesim.traces import TraceFile, load_routing
from moesim.traces.importers.flame import import_flame
from moesim.traces.routing import validate_trace

TINY = FIXTURES / "flame_tiny"
ENC = TINY / "Encoder_Batch_0-2"
DEC = TINY / "Decoder_Batch_0-3"


def read_csv_tree(files):
    """Independent reader: {(token_id, layer, folder): {expert: p}} from CSV paths."""
    out = {}
    for f in files:
        layer = int(f.parent.name.split("_")[1])
        with open(f) as fh:
            for row in csv.DictReader(fh):
                probs = {int(k.split("_")[1]): float(v) for k, v in row.items() if k.startswith("expert_")}
                out[(int(row["token_id"]), layer, f.parent.parent.name)] = {e: p for e, p in probs.items() if p > 0}
    return out


def expected_order(probs: dict) -> tuple[list[int], list[float]]:
    ids = sorted(probs, key=lambda e: (-probs[e], e))
    total = sum(probs.values())
    return ids, [probs[e] / total for e in ids]


def test_prefill_layout(tmp_path):
    out = tmp_path / "p.parquet"
    res = import_flame(TINY, out, layout="prefill")
    r = load_routing(out)
    m = r.meta
    assert (m.model_id, m.family, m.n_experts, m.top_k, m.moe_layers) == ("FLAME-MoE-290M", "flame_moe", 8, 2, (1, 3))
    assert (m.gating, m.norm_topk_prob, m.layout, m.n_candidates, m.synthetic) == ("softmax", False, "sparse", 2, False)
    assert m.source["layout"] == "prefill" and m.source["seq_len"] == 4 and m.source["path"] == str(TINY.resolve())
    assert "upstream" in m.source and m.source["run"] == "run 7, step 9"
    assert res.tokens == 8 and res.sequences == 2 and r.n_tokens == 8
    # token_id = seq * 4 + pos (file name: 2seqs_8tokens)
    assert r.seq.tolist() == [0, 0, 0, 0, 1, 1, 1, 1] and r.pos.tolist() == [0, 1, 2, 3] * 2
    assert (r.phase == 0).all()
    truth = read_csv_tree(sorted(ENC.rglob("*.csv")))
    for t in range(r.n_tokens):
        for l, layer in enumerate(m.moe_layers):
            ids, w = expected_order(truth[(r.seq[t] * 4 + r.pos[t], layer, ENC.name)])
            assert r.sel[t, l].tolist() == ids
            np.testing.assert_allclose(r.w[t, l], w, rtol=1e-5)
    # token_id 1 of layer 1 has two equal probabilities: the lower id ranks first
    assert r.sel[1, 0].tolist() == [2, 5]
    # stored as log-probabilities with lse = 0
    tf = TraceFile(out)
    table = tf._pf.read(columns=["top_logits", "lse", "weights"])
    assert np.allclose(table.column("lse").to_numpy(), 0.0)
    w = table.column("weights").combine_chunks().flatten().to_numpy()
    lg = table.column("top_logits").combine_chunks().flatten().to_numpy()
    np.testing.assert_allclose(np.exp(lg), w, rtol=1e-6)


def test_decode_layout(tmp_path):
    out = tmp_path / "d.parquet"
    res = import_flame(DEC, out)  # PATH = the decode folder itself: no --layout needed
    r = load_routing(out)
    assert res.tokens == 6 and r.meta.moe_layers == (1, 3) and r.meta.source["layout"] == "decode"
    # token_id = sequence, position from the folder name (1st -> 0, 2nd -> 1)
    assert r.seq.tolist() == [0, 0, 1, 1, 2, 2] and r.pos.tolist() == [0, 1] * 3
    assert (r.phase == 1).all()
    truth = read_csv_tree(sorted(DEC.rglob("*.csv")))
    folder = {0: "1st", 1: "2nd"}
    for t in range(r.n_tokens):
        for l, layer in enumerate(r.meta.moe_layers):
            ids, w = expected_order(truth[(int(r.seq[t]), layer, folder[int(r.pos[t])])])
            assert r.sel[t, l].tolist() == ids
            np.testing.assert_allclose(r.w[t, l], w, rtol=1e-5)


def test_root_with_both_layouts_needs_layout(tmp_path):
    result = CliRunner().invoke(cli, ["import", "flame", str(TINY), "-o", str(tmp_path / "x.parquet")])
    assert result.exit_code == 2
    assert "holds both the prefill" in result.stderr and "--layout" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.parquet").exists()
    result = CliRunner().invoke(cli, ["import", "flame", str(TINY), "--layout", "decode",
                                      "-o", str(tmp_path / "x.parquet")])
    assert result.exit_code == 0, result.output
    assert "6 tokens" in result.stdout and "top-2 of 8" in result.stdout
    assert validate_trace(tmp_path / "x.parquet")["tokens"] == 6


def _copy(tmp_path) -> Path:
    dst = tmp_path / "tree"
    shutil.copytree(TINY, dst)
    return dst


def _edit(path: Path, line_no: int, new: str) -> None:
    lines = path.read_text().splitlines()
    lines[line_no] = new
    path.write_text("\n".join(lines) + "\n")


def _one(tree: Path, pattern: str) -> Path:
    return next(tree.glob(pattern))


BAD = {
    "wrong header": (lambda t: _edit(_one(t, "Encoder_Batch_0-2/Layer_1/*.csv"), 0,
                                     "layer_id,token_id," + ",".join(f"e{i}" for i in range(8))),
                     "prefill", "header column 3 is 'e0', expected 'expert_0'"),
    "wrong first columns": (lambda t: _edit(_one(t, "Encoder_Batch_0-2/Layer_1/*.csv"), 0,
                                            "layer,token," + ",".join(f"expert_{i}" for i in range(8))),
                            "prefill", "header must start with layer_id,token_id"),
    "too many nonzero": (lambda t: _edit(_one(t, "Encoder_Batch_0-2/Layer_3/*.csv"), 3,
                                         "0,2,0.1,0.1,0.1,0,0,0,0,0"), "prefill",
                         "token_id 2 has 3 nonzero experts, the first row has 2"),
    "non-numeric cell": (lambda t: _edit(_one(t, "Encoder_Batch_0-2/Layer_3/*.csv"), 2,
                                         "0,1,abc,0,0,0,0,0,0.2,0.3"), "prefill", "not a valid FLAME CSV"),
    "nan cell": (lambda t: _edit(_one(t, "Encoder_Batch_0-2/Layer_3/*.csv"), 2, "0,1,nan,0,0,0,0,0,0.2,0.3"),
                 "prefill", "probabilities must be finite"),  # a number, not an empty cell
    "latin-1 cell": (lambda t: _one(t, "Encoder_Batch_0-2/Layer_3/*.csv").write_bytes(b"layer_id,token_id,caf\xe9\n"),
                     "prefill", "not UTF-8 text \\(byte 21\\)"),
    "probability above 1": (lambda t: _edit(_one(t, "Encoder_Batch_0-2/Layer_3/*.csv"), 2,
                                            "0,1,0,0,0,0,0,0,1.5,0.3"), "prefill", "within 0..1"),
    "duplicate token_id": (lambda t: _edit(_one(t, "Encoder_Batch_0-2/Layer_3/*.csv"), 2,
                                           "0,0,0,0,0,0,0,0,0.2,0.3"), "prefill", "token_id 0 appears 2 times"),
    "layer files cover different tokens": (lambda t: _edit(_one(t, "Encoder_Batch_0-2/Layer_3/*.csv"), 8,
                                                           "0,9,0,0,0,0,0,0,0.2,0.3"), "prefill",
                                           "token_ids differ from|beyond the folder's range"),
    "missing layer in one position": (lambda t: shutil.rmtree(_one(t, "Decoder_Batch_0-3/2nd/Layer_3")), "decode",
                                      "2nd: has layers 1 but 1st has 1, 3"),
    "two csv files in a layer": (lambda t: shutil.copy(_one(t, "Decoder_Batch_0-3/1st/Layer_1/*.csv"),
                                                       t / "Decoder_Batch_0-3/1st/Layer_1/extra.csv"), "decode",
                                 "expected exactly one .csv file, found 2"),
    "bad position folder": (lambda t: (t / "Decoder_Batch_0-3/first").mkdir(), "decode",
                            "must be named 1st, 2nd"),
    "sequence beyond batch range": (lambda t: _edit(_one(t, "Decoder_Batch_0-3/1st/Layer_1/*.csv"), 3,
                                                    "0,5,0,0,0,0,0,0,0.2,0.3"), "decode",
                                    "beyond the folder's sequence range 0-3"),
    "empty csv": (lambda t: _one(t, "Decoder_Batch_0-3/1st/Layer_1/*.csv").write_text(
        "layer_id,token_id," + ",".join(f"expert_{i}" for i in range(8)) + "\n"), "decode", "no rows"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_csv_trees(case, tmp_path):
    make, layout, pattern = BAD[case]
    tree = _copy(tmp_path)
    make(tree)
    out = tmp_path / "out.parquet"
    result = CliRunner().invoke(cli, ["import", "flame", str(tree), "--layout", layout, "-o", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("moesim: error: ") and "Traceback" not in result.output
    import re

    assert re.search(pattern, lines[0]), lines[0]
    assert not out.exists() and not list(tmp_path.glob("*.partial"))


def test_not_a_flame_folder(tmp_path):
    with pytest.raises(MoesimError, match="no Encoder_Batch_"):
        import_flame(tmp_path, tmp_path / "x.parquet")
    with pytest.raises(MoesimError, match="no such file"):
        import_flame(tmp_path / "missing", tmp_path / "x.parquet")


def test_seq_len_and_top_k_options(tmp_path):
    with pytest.raises(MoesimError, match="beyond the folder's range 0-2 at 2 tokens per sequence"):
        import_flame(ENC, tmp_path / "x.parquet", seq_len=2)
    enc = tmp_path / "Encoder_Batch"  # no sequence range in the name
    shutil.copytree(ENC, enc)
    res = import_flame(enc, tmp_path / "x.parquet", seq_len=2)
    r = load_routing(tmp_path / "x.parquet")
    assert res.sequences == 4 and r.pos.max() == 1 and r.meta.source["seq_len"] == 2
    for f in enc.rglob("*.csv"):
        f.rename(f.with_name("layer.csv"))
    with pytest.raises(MoesimError, match="give --seq-len"):
        import_flame(enc, tmp_path / "y.parquet")
    with pytest.raises(MoesimError, match="expected top-k=3"):
        import_flame(ENC, tmp_path / "y.parquet", top_k=3)


def test_duplicated_layers_are_flagged(tmp_path):
    tree = _copy(tmp_path)
    enc = tree / "Encoder_Batch_0-2"
    shutil.copytree(enc / "Layer_1", enc / "Layer_5")
    res = import_flame(tree, tmp_path / "x.parquet", layout="prefill")
    assert res.meta.moe_layers == (1, 3, 5)
    assert any("layer 5 holds exactly the same routing as layer 1" in n for n in res.notes)


def test_real_flame_sample(flame_dir, tmp_path):
    """The shared FLAME-MoE sample: both layouts import, validate, and match the CSVs."""
    pre, dec = tmp_path / "prefill.parquet", tmp_path / "decode.parquet"
    rp = import_flame(flame_dir, pre, layout="prefill")
    rd = import_flame(flame_dir, dec, layout="decode")
    enc_csvs = sorted(flame_dir.glob("Encoder_Batch_*/Layer_*/*.csv"))
    dec_csvs = sorted(flame_dir.glob("Decoder_Batch_*/*/Layer_*/*.csv"))
    n_enc_layers = len({f.parent.name for f in enc_csvs})
    n_dec_layers = len({f.parent.name for f in dec_csvs})
    assert rp.meta.n_layers == n_enc_layers and rd.meta.n_layers == n_dec_layers
    rows_per_file = [sum(1 for _ in open(f)) - 1 for f in enc_csvs]
    assert rp.tokens == rows_per_file[0]
    assert rd.tokens == (sum(1 for _ in open(dec_csvs[0])) - 1) * len({f.parent.parent.name for f in dec_csvs})
    assert validate_trace(pre)["tokens"] == rp.tokens
    r = load_routing(pre)
    seq_len = r.meta.source["seq_len"]
    # spot-check one layer against an independent read of its CSV
    f = enc_csvs[0]
    l = r.meta.moe_layers.index(int(f.parent.name.split("_")[1]))
    truth = read_csv_tree([f])
    for (tid, _, _), probs in list(truth.items())[:200]:
        t = int(np.flatnonzero((r.seq == tid // seq_len) & (r.pos == tid % seq_len))[0])
        ids, w = expected_order(probs)
        assert r.sel[t, l].tolist() == ids
        np.testing.assert_allclose(r.w[t, l], w, rtol=1e-5)
