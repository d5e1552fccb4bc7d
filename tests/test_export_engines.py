"""moesim export --format fitz-tec | moe-l2 | ktransformers: placements in the files those tools read,
each checked against the tool's own writer or published grammar (docs/export.md)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from moesim.cli import cli
from moesim.reports.placement import placement
from moesim.traces.importers.fitz_tec import import_fitz_tec
from moesim.traces.routing import load_routing

RTRACE = FIXTURES / "peers" / "fitz_tec.rtrace"
PIN_LINE = re.compile(r"layer (\d+):((?: \d+)*) ?$")


def parse_pin_list(text: str) -> tuple[int, int, dict[int, list[int]]]:
    """The EXPERT_CACHE_PIN_LIST v1 grammar of fitz_tec/tools/build_pin_list.py (0.1.1): a first line
    '# EXPERT_CACHE_PIN_LIST v1', '#' comments, 'n_layer L', 'n_expert E', then 'layer <il>: ids' for
    il = 0..L-1."""
    lines = text.splitlines()
    assert lines[0] == "# EXPERT_CACHE_PIN_LIST v1"
    body = [x for x in lines if not x.startswith("#")]
    n_layer = int(body[0].split()[1]) if body[0].startswith("n_layer ") else None
    n_expert = int(body[1].split()[1]) if body[1].startswith("n_expert ") else None
    assert n_layer is not None and n_expert is not None, body[:2]
    by_layer = {}
    for line in body[2:]:
        m = PIN_LINE.match(line)
        assert m, line
        by_layer[int(m.group(1))] = [int(x) for x in m.group(2).split()]
    assert sorted(by_layer) == list(range(n_layer))
    return n_layer, n_expert, by_layer


def parse_router_map(text: str) -> tuple[int, dict[int, list[int]]]:
    """moe-l2's router map (moe_l2/router_table.py 0.14.1): '# EXPERT_TOTAL n' first, then 'layer ids' lines."""
    lines = text.splitlines()
    m = re.fullmatch(r"# EXPERT_TOTAL (\d+)", lines[0])
    assert m, lines[0]
    rows = {}
    for line in lines[1:]:
        parts = [int(x) for x in line.split()]
        rows[parts[0]] = parts[1:]
    return int(m.group(1)), rows


@pytest.fixture(scope="module")
def fitz_trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("fitz") / "t.parquet"
    import_fitz_tec(RTRACE, out, top_k=2)
    return out


def test_fitz_tec_pin_list_against_fitz_tecs_own_builder(fitz_trace, tmp_path):
    """fitz-tec's build_pin_list on the same RTRACE01 file ranks each layer's experts as the export does
    (by top-k activation count, ties to the lower id), and its emit_pin_list writes the same lines."""
    p = placement(fitz_trace, slots=4, policy="static")
    n_layer, n_expert, ours = parse_pin_list(p.fitz_tec())
    assert (n_layer, n_expert) == (4, 16) and ours[2] == []  # layer 2 has no router
    assert all(sorted(ours[layer]) == p.gpu_experts[layer] for layer in p.layers)
    build = pytest.importorskip("fitz_tec.tools.build_pin_list", reason="fitz-tec is not installed")
    L, E, theirs = build.build_pin_list(RTRACE, top_k=2, limit_per_layer=4)
    assert (L, E) == (4, 16)
    assert [ours[il] for il in range(4)] == theirs
    build.emit_pin_list(tmp_path / "theirs.pinlist", L, E, theirs, RTRACE, 2)
    strip = [x for x in (tmp_path / "theirs.pinlist").read_text().splitlines() if not x.startswith("#")]
    assert strip == [x for x in p.fitz_tec().splitlines() if not x.startswith("#")]


def test_router_map_grammar(shipped_trace):
    p = placement(shipped_trace, slots=16, policy="static")
    total, rows = parse_router_map(p.moe_l2())
    assert total == 48 * 16 and sorted(rows) == list(range(48))
    for layer, ids in rows.items():
        assert ids == sorted(ids) == p.gpu_experts[layer]


def test_ktransformers_mask(shipped_trace, tmp_path):
    routing = load_routing(shipped_trace)
    p = placement(routing, slots=16, policy="static", allocation="global")
    out = tmp_path / "mask.npy"
    r = CliRunner().invoke(cli, ["export", str(shipped_trace), "-s", "16", "--policy", "static", "--allocation",
                                 "global", "--format", "ktransformers", "-o", str(out)])
    assert r.exit_code == 0, r.output
    mask = np.load(out, allow_pickle=False)
    assert mask.dtype == bool and mask.shape == (48, 512) and int(mask.sum()) == 48 * 16
    # kt-kernel's "frequency" strategy (generate_gpu_experts_masks): the globally most activated experts
    counts = routing.request_counts().reshape(-1)
    top = np.lexsort((np.arange(counts.size), -counts))[:48 * 16]
    want = np.zeros(counts.size, bool)
    want[top] = True
    assert (mask.reshape(-1) == want).all()
    assert all(mask[layer, p.gpu_experts[layer]].all() for layer in p.layers)
    torch = pytest.importorskip("torch", reason="torch is not installed")
    t = torch.from_numpy(mask)
    assert t.dtype == torch.bool and t[0].shape == (512,)  # one row is KTMoEWrapper's gpu_experts_mask


def test_cli_prints_expected_hit_rate_and_time(shipped_trace, tmp_path):
    for fmt, name in (("fitz-tec", "p.pinlist"), ("moe-l2", "r.map")):
        out = tmp_path / name
        r = CliRunner().invoke(cli, ["export", str(shipped_trace), "-s", "16", "--policy", "static", "--format", fmt,
                                     "--hw", "rtx4090-pcie4", "-o", str(out)])
        assert r.exit_code == 0, r.output
        assert re.search(r"expected hit rate \d+\.\d%, \d+\.\d\d ms/token", r.output), r.output
    text = (tmp_path / "p.pinlist").read_text()
    assert re.search(r"# moesim export: static placement .*expected hit rate \d+\.\d% .* ms/token", text)
    assert (tmp_path / "r.map").read_text().startswith("# EXPERT_TOTAL 768\n")
