"""`moesim import jsonl`: JSON Lines routing logs (docs/importers.md, "JSON Lines")."""

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
from moesim.traces.importers.jsonl import import_jsonl, parse_map

ROUTER = FIXTURES / "jsonl_router.jsonl"  # meta line, string problem ids, two layers, tied weights
MAP = "seq=problem_id,pos=token_idx,experts=topk_ids,weights=topk_weights,domain=dataset"


def write_lines(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def run(args):
    return CliRunner().invoke(cli, ["import", "jsonl", *map(str, args)])


def test_fixture_with_map_and_meta_line(tmp_path):
    out = tmp_path / "t.parquet"
    res = import_jsonl([ROUTER], out, mapping=MAP)
    r = load_routing(out)
    m = r.meta
    # the meta line names the model (a moesim preset: its gating and shared experts come along), k and E
    assert (m.model_id, m.n_experts, m.top_k, m.moe_layers) == ("allenai/OLMoE-1B-7B-0924", 64, 4, (3, 5))
    assert m.source["preset"] == "olmoe-1b-7b" and m.norm_topk_prob is False and m.tie_order == "stored"
    assert res.tokens == 3 and res.sequences == 2 and m.source["weights"] == "from the records"
    truth = {}
    ids_of = {}
    for line in ROUTER.read_text().splitlines():
        rec = json.loads(line) if line.strip() else {}
        if "topk_ids" in rec:
            seq = ids_of.setdefault(rec["problem_id"], len(ids_of))  # string ids: order of first appearance
            truth[(seq, rec["token_idx"], rec["layer"])] = (rec["topk_ids"], rec["topk_weights"], rec["dataset"])
    for t in range(r.n_tokens):
        for l, layer in enumerate(m.moe_layers):
            ids, w, dataset = truth[(int(r.seq[t]), int(r.pos[t]), layer)]
            # rank order: weight descending, equal weights in the record's order (not by expert id)
            order = sorted(range(4), key=lambda j: -w[j])
            assert r.sel[t, l].tolist() == [ids[j] for j in order]
            np.testing.assert_allclose(r.w[t, l], [w[j] / sum(w) for j in order], rtol=1e-6)
            assert r.domain_names[r.domain[t]] == dataset
    # (seq 0, pos 1, layer 3): 40 and 13 tie at 0.2: the record lists 40 first, so 40 ranks first
    assert r.sel[1, 0].tolist() == [7, 40, 13, 0]


def test_default_names_need_no_map(tmp_path):
    src = write_lines(tmp_path / "r.jsonl", [
        {"request_id": 0, "position": p, "layer_id": layer, "expert_ids": [p + layer, 9], "phase": "prefill"}
        for p in range(3) for layer in (0, 1)])
    res = import_jsonl([src], tmp_path / "t.parquet", n_experts=16)
    r = load_routing(tmp_path / "t.parquet")
    assert res.tokens == 3 and r.meta.model_id == "unknown" and (r.phase == 0).all()
    assert r.sel[2, 1].tolist() == [3, 9] and (r.w == 0.5).all()  # no weights: exactly 1/k, file order
    assert r.meta.source["fields"] == {"seq": "request_id", "pos": "position", "layer": "layer_id",
                                       "experts": "expert_ids", "phase": "phase"}


def vllm_log(tmp_path, passes=((0, 4), (0, 4), (0, 3)), layers=(0, 1), name="vllm.jsonl"):
    """Forward passes without a seq field: each pass restarts pos at 0."""
    recs = []
    for n, (lo, hi) in enumerate(passes):
        for p in range(lo, hi):
            for layer in layers:
                recs.append({"layer": layer, "pos": p, "topk_ids": [n, 10 + p]})
    return write_lines(tmp_path / name, recs)


def test_passes_split_where_pos_restarts_and_skip(tmp_path):
    src = vllm_log(tmp_path)
    res = import_jsonl([src], tmp_path / "a.parquet", n_experts=32)
    assert res.sequences == 3 and res.tokens == 11
    r = load_routing(tmp_path / "a.parquet")
    assert r.seq.tolist() == [0] * 4 + [1] * 4 + [2] * 3 and (r.sel[:, 0, 0] == r.seq).all()
    res = import_jsonl([src], tmp_path / "b.parquet", n_experts=32, skip_passes=2)
    r = load_routing(tmp_path / "b.parquet")
    assert res.sequences == 1 and r.seq.tolist() == [2, 2, 2] and r.meta.source["skipped_sequences"] == 2
    with pytest.raises(MoesimError, match="drops every one of the 3"):
        import_jsonl([src], tmp_path / "c.parquet", n_experts=32, skip_passes=3)


def test_passes_within_one_id(tmp_path):
    """A vLLM router log in the wild: one request id over several forward passes, positions restarting at 0
    (the first two are profiling runs). Each pass is a sequence; --skip-passes counts passes."""
    recs = []
    for n, length in enumerate((3, 3, 4, 2)):
        for p in range(length):
            for layer in (0, 1):
                recs.append({"request_id": "req-0", "position": p, "layer": layer, "topk_ids": [n, 8 + p]})
    src = write_lines(tmp_path / "r.jsonl", recs)
    res = import_jsonl([src], tmp_path / "a.parquet", n_experts=16)
    r = load_routing(tmp_path / "a.parquet")
    assert res.sequences == 4 and res.tokens == 12 and (r.sel[:, 0, 0] == r.seq).all()
    assert r.meta.source["passes"] == {"rule": "a new pass wherever pos restarts at 0", "found": 4,
                                       "ids_with_several": 1}
    assert any("1 sequence id(s) hold several forward passes" in n for n in res.notes)
    res = import_jsonl([src], tmp_path / "b.parquet", n_experts=16, skip_passes=2)
    r = load_routing(tmp_path / "b.parquet")
    assert res.sequences == 2 and sorted(set(r.sel[:, 0, 0].tolist())) == [2, 3]
    result = run([src, "--experts", "16", "--passes", "off", "-o", tmp_path / "c.parquet"])
    assert result.exit_code == 2 and "has some layer twice" in result.stderr


def test_passes_of_other_ids_keep_their_numbers(tmp_path):
    """Integer ids whose passes never restart keep their values (traces written before stay the same)."""
    recs = [{"seq": s, "pos": p, "layer": 0, "experts": [s, 9]} for s in (4, 7) for p in range(3)]
    res = import_jsonl([write_lines(tmp_path / "r.jsonl", recs)], tmp_path / "a.parquet", n_experts=16)
    assert load_routing(tmp_path / "a.parquet").seq.tolist() == [4, 4, 4, 7, 7, 7] and not res.notes


def test_passes_that_start_mid_sequence(tmp_path):
    """Prefix caching: a request's second pass starts at pos 3, not 0. Ambiguous under the default rule (one
    line naming the flag); --passes drop splits where pos goes back."""
    recs = [{"seq": 0, "pos": p, "layer": 0, "experts": [10, p]} for p in (0, 1, 2, 3, 4)]
    recs += [{"seq": 0, "pos": p, "layer": 0, "experts": [11, p]} for p in (3, 4, 5)]
    src = write_lines(tmp_path / "r.jsonl", recs)
    result = run([src, "--experts", "16", "-o", tmp_path / "a.parquet"])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "pos goes back from 4 to 3" in result.stderr and "--passes drop" in result.stderr
    res = import_jsonl([src], tmp_path / "b.parquet", n_experts=16, passes="drop")
    r = load_routing(tmp_path / "b.parquet")
    assert res.sequences == 2 and r.pos.tolist() == [0, 1, 2, 3, 4, 3, 4, 5]


def test_one_file_per_layer_merges(tmp_path):
    """Loggers that write one file per layer and leave the layer out of the records."""
    for layer in (2, 6):
        write_lines(tmp_path / f"moe_layer_{layer}.jsonl",
                    [{"token_idx": p, "topk_ids": [layer, p + 10], "topk_weights": [0.75, 0.25]} for p in range(5)])
    files = [tmp_path / "moe_layer_6.jsonl", tmp_path / "moe_layer_2.jsonl"]
    res = import_jsonl(files, tmp_path / "t.parquet", n_experts=16)
    r = load_routing(tmp_path / "t.parquet")
    assert r.meta.moe_layers == (2, 6) and res.tokens == 5
    assert r.sel[:, :, 0].tolist() == [[2, 6]] * 5 and r.sel[3, 1].tolist() == [6, 13]


def test_ragged_layers_error_or_drop(tmp_path):
    recs = [{"seq": 0, "pos": p, "layer": layer, "experts": [1, 2]} for p in range(6) for layer in (0, 1, 2)
            if not (p in (2, 4) and layer == 1)]
    src = write_lines(tmp_path / "r.jsonl", recs)
    with pytest.raises(MoesimError, match=r"token \(seq=0, pos=2\) has no record for layer 1; 2 of 6 tokens .*"
                                          r"--drop-incomplete"):
        import_jsonl([src], tmp_path / "a.parquet", n_experts=4)
    assert not (tmp_path / "a.parquet").exists()
    res = import_jsonl([src], tmp_path / "b.parquet", n_experts=4, drop_incomplete=True)
    assert res.tokens == 4 and any("dropped 2 of 6 tokens (4 records)" in n for n in res.notes)
    assert load_routing(tmp_path / "b.parquet").pos.tolist() == [0, 1, 3, 5]
    result = run([src, "--experts", "4", "--drop-incomplete", "-o", tmp_path / "c.parquet"])
    assert result.exit_code == 0 and "moesim: warning: dropped 2 of 6 tokens" in result.stderr


def test_multi_token_records(tmp_path):
    """A record may hold a whole prefill chunk: experts [[ids], [ids], ...] from pos onwards."""
    src = write_lines(tmp_path / "r.jsonl", [
        {"seq": 0, "pos": 0, "layer": 0, "experts": [[1, 2], [3, 4], [5, 6]], "weights": [[2, 1], [1, 1], [1, 3]]},
        {"seq": 0, "pos": 3, "layer": 0, "experts": [[7, 0]], "weights": [[1, 1]]},
    ])
    import_jsonl([src], tmp_path / "t.parquet", n_experts=8)
    r = load_routing(tmp_path / "t.parquet")
    assert r.pos.tolist() == [0, 1, 2, 3]
    assert r.sel[:, 0].tolist() == [[1, 2], [3, 4], [6, 5], [7, 0]]


def test_top_k_must_agree(tmp_path):
    with pytest.raises(MoesimError, match="records hold 4 experts, but top-k is 2"):
        import_jsonl([ROUTER], tmp_path / "t.parquet", mapping=MAP, top_k=2)


def test_parse_map():
    assert parse_map("seq=a, pos=b") == {"seq": "a", "pos": "b"}
    for bad, msg in [("seq", "expected FIELD=NAME"), ("token=x", "unknown field 'token'"), ("seq=a,seq=b", "twice")]:
        with pytest.raises(MoesimError, match=msg):
            parse_map(bad)


GOOD = '{"seq": 0, "pos": 0, "layer": 0, "experts": [1, 2]}'
BAD = {
    "not json": ([GOOD, "{oops"], [], r"line 2: not valid JSON"),
    "truncated last line": ([GOOD] * 150 + ['{"seq": 0, "pos": 1, "layer": 0, "experts": [1,'], [],
                            r"line 151: not valid JSON"),
    "deeply nested": ([GOOD, '{"x": ' + "[" * 100000 + "]" * 100000 + "}"], [], r"line 2: JSON nested too deeply"),
    "not an object": (["[1, 2]"], [], r"line 1: expected one JSON object per line"),
    "no experts field": (['{"seq": 0, "pos": 0, "ids": [1, 2]}'], [], r"no routing record in its first 100 lines"),
    "ragged k": ([GOOD] + [GOOD.replace('"pos": 0', f'"pos": {p}') for p in range(1, 3)]
                 + ['{"seq": 0, "pos": 3, "layer": 0, "experts": [1, 2, 3]}'], [],
                 r"record 4: experts has 3 values per token, the first record has 2"),
    "type change": ([GOOD] * 120 + ['{"seq": 0, "pos": "1", "layer": 0, "experts": [1, 2]}'], [],
                    r"line 121: pos \(pos\) holds \"1\", expected an integer"),
    "id out of range": (['{"seq": 0, "pos": 0, "layer": 0, "experts": [1, 40]}'], [], r"expert id 40 is outside 0..15"),
    "repeated id": (['{"seq": 0, "pos": 0, "layer": 0, "experts": [3, 3]}'], [], r"appears twice"),
    "negative weight": (['{"seq": 0, "pos": 0, "layer": 0, "experts": [1, 2], "weights": [0.5, -1]}'], [],
                        r"gate weights must be finite, >= 0"),
    "NaN weight": ([GOOD.replace("}", ', "weights": [0.5, 0.5]}')] * 130
                   + ['{"seq": 0, "pos": 7, "layer": 0, "experts": [1, 2], "weights": [NaN, 0.5]}'], [],
                   r"record 131: weights holds NaN or infinite values"),
    "weights mismatch": (['{"seq": 0, "pos": 0, "layer": 0, "experts": [1, 2], "weights": [1, 2, 3]}'], [],
                         r"does not hold one weight per expert id"),
    "duplicate step": ([GOOD, GOOD.replace('"pos": 0', '"pos": 1'), GOOD.replace('"pos": 0', '"pos": 1')], [],
                       r"pos goes back from 1 to 1 without restarting at 0 within seq 0, layer 0: .*--passes drop"),
    "duplicate step, passes off": ([GOOD, GOOD], ["--passes", "off"], r"has some layer twice"),
    "null field": ([GOOD, '{"seq": 0, "pos": null, "layer": 0, "experts": [1, 2]}'], [],
                   r"record 2: no 'pos' \(pos\)"),
    "unknown phase": (['{"seq": 0, "pos": 0, "layer": 0, "experts": [1, 2], "phase": "warmup"}'], [],
                      r"unknown phase 'warmup'"),
    "bad --map": ([GOOD], ["--map", "experts"], r"--map 'experts': expected FIELD=NAME"),
    "mapped field absent": ([GOOD], ["--map", "seq=problem_id"], r"no field 'problem_id'"),
    "pass without pos 0": (['{"pos": 3, "layer": 0, "experts": [1, 2]}'], [], r"first record has pos 3"),
    "ambiguous names": (['{"seq": 0, "request_id": 1, "pos": 0, "layer": 0, "experts": [1, 2]}'], [],
                        r"fields seq, request_id could all be seq"),
    "string layer without number": (['{"seq": 0, "pos": 0, "layer": "mlp", "experts": [1, 2]}'], [],
                                    r"layer 'mlp' holds no layer number"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed(case, tmp_path):
    lines, extra, pattern = BAD[case]
    src = write_lines(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.parquet"
    result = run([src, "--experts", "16", *extra, "-o", out])
    assert result.exit_code == 2, result.output
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("moesim: error: ") and "Traceback" not in result.output
    assert re.search(pattern, err[0]), err[0]
    assert not out.exists() and not list(tmp_path.glob("*.partial"))


def test_missing_file_and_no_layer(tmp_path):
    result = run([tmp_path / "nope.jsonl", "-o", tmp_path / "o.parquet"])
    assert result.exit_code == 2 and "no such file" in result.stderr
    src = write_lines(tmp_path / "routing.jsonl", ['{"pos": 0, "experts": [1, 2]}'])
    result = run([src, "--experts", "4", "-o", tmp_path / "o.parquet"])
    assert result.exit_code == 2 and "no layer field and its name holds no layer number" in result.stderr


def test_cli_summary(tmp_path):
    result = run([ROUTER, "--map", MAP, "-o", tmp_path / "t.parquet"])
    assert result.exit_code == 0, result.output
    assert "3 tokens in 2 sequence(s) x 2 MoE layers" in result.stdout and "top-4 of 64" in result.stdout
