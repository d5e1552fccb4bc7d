"""Issue 2 "Must show": `moesim import flame` + `moesim profile --format json` on real FLAME
data equal (1e-6) an independent computation made straight from the CSV files."""

from __future__ import annotations

import csv
import json
import re
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from moesim.cli import cli

ORDINAL = re.compile(r"^(\d+)(st|nd|rd|th)$")


def read_sets(file: Path) -> dict[int, frozenset]:
    """token_id -> the experts with a nonzero probability, read with the csv module."""
    out = {}
    with open(file, newline="") as fh:
        for row in csv.DictReader(fh):
            out[int(row["token_id"])] = frozenset(int(k[len("expert_"):]) for k, v in row.items()
                                                  if k.startswith("expert_") and float(v) > 0)
    return out


def steps_from_csvs(flame_dir: Path, layout: str) -> dict[int, dict[tuple[int, int], frozenset]]:
    """layer -> {(seq, pos): selected set}, straight from the folder layout."""
    layers: dict[int, dict] = {}
    if layout == "prefill":
        for f in sorted(flame_dir.glob("Encoder_Batch_*/Layer_*/*.csv")):
            first = int(re.search(r"_(\d+)-\d+$", f.parent.parent.name).group(1))
            m = re.search(r"(\d+)seqs_(\d+)tokens", f.name)
            seq_len = int(m.group(2)) // int(m.group(1))
            layer = int(f.parent.name.split("_")[1])
            for tid, s in read_sets(f).items():
                layers.setdefault(layer, {})[(first + tid // seq_len, tid % seq_len)] = s
    else:
        for f in sorted(flame_dir.glob("Decoder_Batch_*/*/Layer_*/*.csv")):
            first = int(re.search(r"_(\d+)-\d+$", f.parent.parent.parent.name).group(1))
            pos = int(ORDINAL.match(f.parent.parent.name).group(1)) - 1
            layer = int(f.parent.name.split("_")[1])
            for tid, s in read_sets(f).items():
                layers.setdefault(layer, {})[(first + tid, pos)] = s
    return layers


def independent_profile(layers: dict[int, dict], E: int) -> dict:
    per_layer = []
    for layer in sorted(layers):
        steps = layers[layer]
        k = len(next(iter(steps.values())))
        overlaps = [len(s & steps[(q, p + 1)]) / k for (q, p), s in steps.items() if (q, p + 1) in steps]
        counts = Counter(e for s in steps.values() for e in s)
        n = len(steps)
        marginal = sum((c / n) ** 2 for c in counts.values()) / k
        total, covered, size = sum(counts.values()), 0, 0
        for c in sorted(counts.values(), reverse=True):
            covered += c
            size += 1
            if 100 * covered >= 95 * total:
                break
        per_layer.append({"layer": layer, "reuse_next_token": sum(overlaps) / len(overlaps),
                          "reuse_chance_marginal": marginal, "working_set_95": size / E})
    mean = {key: sum(x[key] for x in per_layer) / len(per_layer)
            for key in ("reuse_next_token", "reuse_chance_marginal", "working_set_95")}
    return {**mean, "layers": per_layer, "reuse_chance_uniform": k / E}


@pytest.mark.parametrize("layout", ["prefill", "decode"])
def test_import_then_profile_matches_the_csvs(flame_dir, tmp_path, layout):
    pytest.importorskip("moesim.reports.profile", reason="moesim profile is not available yet")
    runner = CliRunner()
    out = tmp_path / f"flame-{layout}.parquet"
    result = runner.invoke(cli, ["import", "flame", str(flame_dir), "--layout", layout, "-o", str(out)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli, ["profile", str(out), "--format", "json"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)

    layers = steps_from_csvs(flame_dir, layout)
    E = 64
    want = independent_profile(layers, E)
    assert got["synthetic"] is False and got["experts"] == E
    assert got["tokens"] == len(next(iter(layers.values())))
    for key in ("reuse_next_token", "reuse_chance_uniform", "reuse_chance_marginal", "working_set_95"):
        assert got[key] == pytest.approx(want[key], abs=1e-6), key
    assert [x["layer"] for x in got["layers"]] == [x["layer"] for x in want["layers"]]
    for g, w in zip(got["layers"], want["layers"]):
        for key in ("reuse_next_token", "reuse_chance_marginal", "working_set_95"):
            assert g[key] == pytest.approx(w[key], abs=1e-6), (w["layer"], key)
