"""Calibration from a user's own runs of an engine with a dynamic expert cache (issue 29): rows model, quant,
vram_hit, tok_s fit a cost per step and one per missed expert; the written machine file carries them."""

import pytest
from click.testing import CliRunner

from moesim.cli import cli
from moesim.costmodel.calibrate import fit, read_runs
from moesim.costmodel.hardware import load_hardware
from moesim.costmodel.timing import estimate
from moesim.costmodel.tomlout import dumps
from moesim.errors import MoesimError

MODEL, QUANT, HW = "qwen3-30b-a3b", "q4_k_m", "rtx3090-pcie4"


def true_machine(tmp_path, engine="llama.cpp-expert-cache", token_us=1500.0, miss_us=30.0):
    """A machine file whose engine has costs the presets do not: the 'real' engine the runs come from."""
    h = load_hardware(HW)
    doc = {k: (dict(v) if isinstance(v, dict) else v) for k, v in h.doc.items()}
    doc["name"] = "the-users-box"
    doc["engine"] = {"profile": engine, "token_us": token_us, "sources": {"token_us": "test: the truth"}}
    if engine == "mixtral-offloading":
        doc["engine"]["fetch_expert_us"] = miss_us
        doc["engine"]["sources"]["fetch_expert_us"] = "test: the truth"
    else:
        doc["cpu"]["latency_us"] = miss_us
        doc["cpu"].setdefault("sources", {})["latency_us"] = "test: the truth"
    path = tmp_path / "truth.toml"
    path.write_text(dumps(doc))
    return str(path)


@pytest.mark.parametrize("engine", ["llama.cpp-expert-cache", "mixtral-offloading"])
def test_round_trip_two_runs_predict_a_third(tmp_path, engine):
    truth = true_machine(tmp_path, engine)
    measured = {h: estimate(MODEL, QUANT, truth, vram_hit=h)["tok_per_s"] for h in (0.3, 0.6, 0.9)}
    runs = tmp_path / "runs.csv"
    runs.write_text("model,quant,vram_hit,tok_s\n" + "".join(
        f"{MODEL},{QUANT},{h},{measured[h]!r}\n" for h in (0.3, 0.9)))
    out = tmp_path / "fitted.toml"
    r = CliRunner().invoke(cli, ["calibrate", str(runs), "--hw", HW, "--engine", engine, "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "->" in r.output and "fitted: moesim calibrate" in out.read_text()
    # the fitted file alone (no --engine) predicts the third cache size
    predicted = estimate(MODEL, QUANT, str(out), vram_hit=0.6)
    assert predicted["engine"] == engine
    assert predicted["tok_per_s"] == pytest.approx(measured[0.6], rel=1e-6)
    e = CliRunner().invoke(cli, ["estimate", "--model", MODEL, "--quant", QUANT, "--hw", str(out), "--vram-hit", "0.6",
                                 "--format", "json"])
    assert e.exit_code == 0 and f"{measured[0.6]:.4f}"[:6] in e.output
    res = fit(read_runs(runs), HW, engine)
    assert res["token_s"] == pytest.approx(1500e-6, rel=1e-6) and res["miss_s"] == pytest.approx(30e-6, rel=1e-5)
    assert max(abs(x) for x in res["residuals_after"]) < 1e-9 < min(abs(x) for x in res["residuals_before"])
    assert min(res["residuals_before"]) > 0  # ln(predicted / measured): the preset without the costs is optimistic


def test_mixed_placement_and_cache_runs(tmp_path):
    """Placement runs fit the rates first (llama.cpp), cache runs the engine's costs at those rates."""
    truth = true_machine(tmp_path)
    cache = {h: estimate(MODEL, QUANT, truth, vram_hit=h)["tok_per_s"] for h in (0.4, 0.8)}
    runs = tmp_path / "runs.csv"
    runs.write_text("model,quant,placement,vram_hit,tok_s\n"
                    f"{MODEL},{QUANT},vram,,150\n{MODEL},{QUANT},n-cpu-moe=24,,60\n"
                    + "".join(f"{MODEL},{QUANT},,{h},{cache[h]!r}\n" for h in cache))
    res = fit(read_runs(runs), HW)
    assert set(res["fitted"]) >= {"token", "miss"} and len(res["residuals_after"]) == 4
    assert all(abs(a) <= abs(b) + 1e-9 for a, b in zip(res["residuals_after"][2:], res["residuals_before"][2:]))


@pytest.mark.parametrize("body, message", [
    (f"model,quant,vram_hit,tok_s\n{MODEL},{QUANT},0.5,20\n", "at least two runs at different hit rates"),
    (f"model,quant,vram_hit,tok_s\n{MODEL},{QUANT},0.5,20\n{MODEL},{QUANT},0.5,21\n", "different hit rates"),
    (f"model,quant,vram_hit,tok_s\n{MODEL},{QUANT},1.5,20\n{MODEL},{QUANT},0.5,21\n", r"vram_hit must be a fraction"),
    (f"model,quant,vram_hit,tok_s\n{MODEL},{QUANT},0.2,nan\n{MODEL},{QUANT},0.5,21\n", "not a positive finite"),
    (f"model,quant,vram_hit,tok_s\n{MODEL},{QUANT},0.2,-3\n{MODEL},{QUANT},0.5,21\n", "not a positive finite"),
    (f"model,quant,vram_hit,tok_s\n{MODEL},{QUANT},0.2,inf\n{MODEL},{QUANT},0.5,21\n", "not a positive finite"),
    (f"model,quant,vram_hit,tok_s\n{MODEL},{QUANT},x,3\n{MODEL},{QUANT},0.5,21\n", "is not a number"),
    ("model,quant,tok_s\nm,q,3\n", "expected llama-bench output or a CSV"),
])
def test_bad_runs_are_one_line_errors(tmp_path, body, message):
    runs = tmp_path / "runs.csv"
    runs.write_text(body)
    with pytest.raises(MoesimError, match=message):
        fit(read_runs(runs), HW)
    r = CliRunner().invoke(cli, ["calibrate", str(runs), "--hw", HW, "-o", str(tmp_path / "o.toml")])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and r.output.startswith("moesim: error:")


def test_llama_bench_rows_at_several_cache_sizes(tmp_path):
    truth = true_machine(tmp_path)
    t32, t96 = (estimate(MODEL, QUANT, truth, vram_hit=s / 128)["tok_per_s"] for s in (32, 120))
    text = ("| model | size | params | backend | ngl | moe_expert_cache | test | t/s |\n"
            "| --- | ---: | ---: | --- | --: | --: | --- | ---: |\n"
            f"| qwen3moe 30B.A3B Q4_K - Medium | 17.28 GiB | 30.53 B | CUDA | 99 | 32 | tg128 | {t32!r} ± 0.2 |\n"
            f"| qwen3moe 30B.A3B Q4_K - Medium | 17.28 GiB | 30.53 B | CUDA | 99 | 120 | tg128 | {t96!r} ± 0.4 |\n"
            "| qwen3moe 30B.A3B Q4_K - Medium | 17.28 GiB | 30.53 B | CUDA | 99 | 96 | pp512 | 900.0 ± 4 |\n")
    path = tmp_path / "bench.md"
    path.write_text(text)
    runs = read_runs(path, MODEL)
    assert [r["vram_hit"] for r in runs] == [32 / 128, 120 / 128] and "uniform access" in runs[0]["hit_basis"]
    res = fit(runs, HW)
    assert max(abs(x) for x in res["residuals_after"]) < 1e-9
    assert res["token_s"] == pytest.approx(1500e-6, rel=1e-6)
