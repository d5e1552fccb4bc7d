"""`moesim import moe-l2`: EXPERT|L<l>|T<t>: routing log lines (docs/importers.md, "moe-l2")."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import FIXTURES
from import_checks import check_replays

from moesim.cli import cli
from moesim.errors import MoesimError
from moesim.traces import load_routing
from moesim.traces.importers.moe_l2 import import_moe_l2

sys.path.insert(0, str(FIXTURES))
from peer_formats import moe_l2_text  # noqa: E402

LOG = FIXTURES / "peers" / "moe_l2_expert.log"  # 2 requests (prompt 5 + 6 steps, prompt 3 + 4 steps), layers 0, 1, 3


def run(args):
    return CliRunner().invoke(cli, ["import", "moe-l2", *map(str, args)])


def test_fixture_is_the_published_layout():
    assert LOG.read_text() == moe_l2_text()


def test_batches_tokens_sequences(tmp_path):
    res = import_moe_l2(LOG, tmp_path / "t.parquet", n_experts=16)
    r = load_routing(tmp_path / "t.parquet")
    assert r.meta.moe_layers == (0, 1, 3) and r.meta.top_k == 4 and r.meta.tie_order == "stored"
    assert res.sequences == 2 and res.tokens == 18 and res.phases == {"prefill": 8, "decode": 10}
    assert r.seq.tolist() == [0] * 11 + [1] * 7 and r.pos.tolist() == list(range(11)) + list(range(7))
    lines = [x for x in LOG.read_text().splitlines() if x.startswith("EXPERT|")]
    # the first line: layer 0's prompt batch, the first token's list is the first token's selection, in order
    first = [int(v) for v in re.findall(r"\[([^\]]*)\]", lines[0])[0].split(",")]
    assert r.sel[0, 0].tolist() == first and (r.w == 0.25).all()
    one = import_moe_l2(LOG, tmp_path / "one.parquet", n_experts=16, one_sequence=True)
    assert one.sequences == 1


def test_moe_l2s_own_parser_agrees(tmp_path):
    """moe-l2's reader (moe_l2.collect.parse_expert_lines) counts the same selections per layer."""
    collect = pytest.importorskip("moe_l2.collect", reason="moe-l2 is not installed")
    freq, slots, k = collect.parse_expert_lines(LOG.read_text().splitlines())
    import_moe_l2(LOG, tmp_path / "t.parquet", n_experts=16)
    r = load_routing(tmp_path / "t.parquet")
    counts = r.request_counts()
    assert k == 4
    for l, layer in enumerate(r.meta.moe_layers):
        assert {e: int(c) for e, c in enumerate(counts[l]) if c} == dict(freq[layer])
        assert slots[layer] == 4 * r.n_tokens


def test_replay_checks(tmp_path):
    import_moe_l2(LOG, tmp_path / "t.parquet", n_experts=16)
    check_replays(load_routing(tmp_path / "t.parquet"), tmp_path)


GOOD = ["EXPERT|L0|T1: [1,2]", "EXPERT|L1|T1: [3,4]"]
BAD = {
    "truncated line": (GOOD + ["EXPERT|L0|T1: [1,"], r"line 3: not a complete EXPERT\|L<layer>\|T<tokens>"),
    "T disagrees": (GOOD + ["EXPERT|L0|T2: [1,2]", "EXPERT|L1|T2: [1,2]"], r"line 3: T2 announces 2 token"),
    "id out of range": (GOOD + ["EXPERT|L0|T1: [1,20]", "EXPERT|L1|T1: [1,2]"], r"expert id 20 is outside 0\.\.15"),
    "repeated id": (["EXPERT|L0|T1: [2,2]", "EXPERT|L1|T1: [3,4]"], r"lists one expert twice"),
    "ragged k": (GOOD + ["EXPERT|L0|T1: [1,2,3]", "EXPERT|L1|T1: [1,2,3]"],
                 r"line \d: id lists of 3 experts, earlier ones of 2"),
    "missing layer line": (GOOD + ["EXPERT|L0|T1: [1,2]", "EXPERT|L0|T1: [1,2]"],
                           r"layer 0 logs another batch while layer 1 has not"),
    "cut mid-batch": (GOOD + ["EXPERT|L0|T1: [5,6]"], r"the last batch has no line for layer 1 .*--drop-incomplete"),
    "new layer": (GOOD + ["EXPERT|L0|T1: [1,2]", "EXPERT|L2|T1: [1,2]"], r"layer 2 is not one of the layers"),
    "not ids": (["EXPERT|L0|T1: [a,b]"], r"line 1: not a complete"),
    "empty id": (["EXPERT|L0|T1: [1,,2]"], r"is not comma-separated expert ids"),
    "no records": (["hello", "world"], r"no EXPERT\|L<layer>\|T<tokens>: lines"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed(case, tmp_path):
    lines, pattern = BAD[case]
    src = tmp_path / "in.log"
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.parquet"
    result = run([src, "--experts", "16", "-o", out])
    assert result.exit_code == 2, result.output
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("moesim: error: ") and "Traceback" not in result.output
    assert re.search(pattern, err[0]), err[0]
    assert not out.exists() and not list(tmp_path.glob(".*partial"))


def test_drop_incomplete_and_prefixes(tmp_path):
    src = tmp_path / "in.log"
    src.write_text("\n".join(["[pid 7] EXPERT|L0|T1: [1,2]", "EXPERT|L1|T1: [3,4]", "EXPERT|L0|T1: [5,6]"]) + "\n")
    res = import_moe_l2(src, tmp_path / "t.parquet", n_experts=8, drop_incomplete=True)
    assert res.tokens == 1 and any("dropped the last batch" in n for n in res.notes)
    with pytest.raises(MoesimError, match="--experts E"):
        import_moe_l2(src, tmp_path / "u.parquet", drop_incomplete=True)


def test_large_log_streams(tmp_path):
    """Many batches: written in chunks, tokens in order (the streamed replay's requirement)."""
    rng = np.random.default_rng(3)
    src = tmp_path / "big.log"
    with open(src, "w") as fh:
        for _ in range(9000):
            for layer in (0, 1):
                fh.write(f"EXPERT|L{layer}|T1: [{','.join(map(str, rng.choice(32, 3, replace=False)))}]\n")
    res = import_moe_l2(src, tmp_path / "t.parquet", n_experts=32)
    r = load_routing(tmp_path / "t.parquet")
    assert res.tokens == 9000 and r.pos.tolist() == list(range(9000))
