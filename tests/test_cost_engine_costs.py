"""Per-miss and per-token engine costs in `moesim estimate` (issue 29): every term is charged, as the equations in
docs/costmodel.md say, and a profile's values keep their sources."""

import math

import pytest

from moesim.costmodel.engines import engine_names, load_engine
from moesim.costmodel.timing import cost_params, estimate
from moesim.errors import MoesimError

MODEL, QUANT, HW = "qwen3-30b-a3b", "q4_k_m", "rtx3090-pcie4"
NEW_KEYS = ("fetch_expert_us", "expert_copies", "router_sync_us", "token_us", "cpu_overlap", "kv")


def engine_file(tmp_path, name="x", **keys):
    lines = [f'name = "{name}"']
    for k, v in keys.items():
        lines.append(f"{k} = " + (f'"{v}"' if isinstance(v, str) else str(v).lower() if isinstance(v, bool)
                                  else repr(v)))
    path = tmp_path / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_every_shipped_profile_states_the_new_terms_with_sources():
    assert {"llama.cpp-expert-cache", "ideal", "llama.cpp", "ktransformers", "mixtral-offloading"} <= set(
        engine_names())
    for name in ("ideal", "llama.cpp", "ktransformers", "mixtral-offloading", "llama.cpp-expert-cache"):
        e = load_engine(name)
        for key in NEW_KEYS:
            assert key in e.sources, f"{name}: {key} has no source"
    cache = load_engine("llama.cpp-expert-cache")
    assert (cache.miss, cache.uploads_per_layer, cache.expert_copies, cache.copy) == ("hybrid", 2, "matrix",
                                                                                      "pageable")


def test_per_step_cost_is_charged_once_per_step(tmp_path):
    base = estimate(MODEL, QUANT, HW, vram_hit=1.0, engine=engine_file(tmp_path, "a"))
    slow = estimate(MODEL, QUANT, HW, vram_hit=1.0, engine=engine_file(tmp_path, "b", token_us=2000.0))
    assert slow["s_per_step"] == pytest.approx(base["s_per_step"] + 2e-3)
    assert slow["time_per_step"]["token"] == pytest.approx(2e-3)
    b4 = estimate(MODEL, QUANT, HW, vram_hit=1.0, batch=4, engine=engine_file(tmp_path, "c", token_us=2000.0))
    b4_base = estimate(MODEL, QUANT, HW, vram_hit=1.0, batch=4, engine=engine_file(tmp_path, "d"))
    assert b4["s_per_step"] - b4_base["s_per_step"] == pytest.approx(2e-3)  # per step, not per sequence


def test_per_fetch_cost_and_copies_per_matrix_scale_with_the_fetches(tmp_path):
    p0 = cost_params(MODEL, QUANT, HW, engine=engine_file(tmp_path, "a", miss="fetch"))
    p1 = cost_params(MODEL, QUANT, HW, engine=engine_file(tmp_path, "b", miss="fetch", fetch_expert_us=50.0,
                                                          expert_copies="matrix"))
    lat = 10e-6  # rtx3090-pcie4's link latency per copy
    assert p1.s_fetch_ram - p0.s_fetch_ram == pytest.approx(50e-6 + 2 * lat)
    assert p1.s_fetch_nvme - p0.s_fetch_nvme == pytest.approx(50e-6 + 2 * lat)
    kw = dict(vram_hit=0.5, ram_hit=1.0)
    d0 = estimate(MODEL, QUANT, HW, engine=engine_file(tmp_path, "a", miss="fetch"), **kw)
    d1 = estimate(MODEL, QUANT, HW, engine=engine_file(tmp_path, "b", miss="fetch", fetch_expert_us=50.0,
                                                       expert_copies="matrix"), **kw)
    fetches = 48 * 8 * 0.5
    assert d1["s_per_step"] - d0["s_per_step"] == pytest.approx(fetches * (50e-6 + 2 * lat))


def test_router_read_back_per_layer_not_wholly_resident(tmp_path):
    e = engine_file(tmp_path, "a", miss="fetch", router_sync_us=40.0)
    some = estimate(MODEL, QUANT, HW, vram_hit=0.9, engine=e)
    assert some["time_per_step"]["router_sync"] == pytest.approx(48 * 40e-6)  # every layer may miss
    none = estimate(MODEL, QUANT, HW, vram_hit=1.0, engine=e)
    assert "router_sync" not in none["time_per_step"]
    layers = engine_file(tmp_path, "b", miss="cpu", placement="layers", router_sync_us=40.0)
    d = estimate(MODEL, QUANT, HW, cpu_moe_layers=12, engine=layers)  # --n-cpu-moe 12: 12 of 48 layers on the host
    assert d["time_per_step"]["router_sync"] == pytest.approx(12 * 40e-6)


def test_hybrid_misses_charge_cpu_compute_and_background_uploads():
    kw = dict(vram_hit=0.5, ram_hit=1.0)
    d = estimate(MODEL, QUANT, HW, engine="llama.cpp-expert-cache", **kw)
    p = cost_params(MODEL, QUANT, HW, engine="llama.cpp-expert-cache")
    misses = 48 * 8 * 0.5
    assert d["miss"] == "hybrid"
    assert d["time_per_step"]["cpu_ram"] == pytest.approx(misses * p.s_expert_cpu)
    uploads = 48 * min(8 * 0.5, 2)  # at most 2 per layer per step
    assert d["link_busy_per_step"] == pytest.approx(uploads * p.s_copy_link)
    assert d["bytes_per_step"]["link"] == pytest.approx(uploads * p.bytes_per_expert)
    assert p.s_copy_link == pytest.approx(3 * 10e-6 + p.bytes_per_expert / p.link_bandwidth)  # 3 matrix copies
    assert "upload_wait" not in d["time_per_step"]  # the CPU side is slower than the link here
    # where the link cannot carry the uploads within the step (pageable copies on PCIe 3.0), it sets the pace
    slow_link = estimate(MODEL, QUANT, "rtx3070-8g-ddr4-nvme", engine="llama.cpp-expert-cache", **kw)
    rest = sum(v for k, v in slow_link["time_per_step"].items() if k != "upload_wait")
    assert slow_link["link_busy_per_step"] > rest
    assert slow_link["s_per_step"] == pytest.approx(slow_link["link_busy_per_step"])
    assert slow_link["time_per_step"]["upload_wait"] == pytest.approx(slow_link["link_busy_per_step"] - rest)


def test_hybrid_needs_an_uploading_engine():
    with pytest.raises(MoesimError, match="hybrid"):
        estimate(MODEL, QUANT, HW, miss="hybrid")
    with pytest.raises(MoesimError, match="computes misses on the CPU and uploads"):
        estimate(MODEL, QUANT, HW, engine="llama.cpp-expert-cache", miss="fetch")


def test_cpu_overlap_hides_the_shorter_side(tmp_path):
    kw = dict(vram_hit=0.7, ram_hit=1.0)
    serial = estimate(MODEL, QUANT, HW, engine=engine_file(tmp_path, "a", miss="cpu"), **kw)
    par = estimate(MODEL, QUANT, HW, engine=engine_file(tmp_path, "b", miss="cpu", cpu_overlap=True), **kw)
    t = serial["time_per_step"]
    hidden = min(t["expert_vram"], t["cpu_ram"])
    assert par["s_per_step"] == pytest.approx(serial["s_per_step"] - hidden)


def test_speculative_step_verifies_the_union_and_counts_accepted_tokens():
    plain = estimate(MODEL, QUANT, HW, vram_hit=0.6, ram_hit=1.0)
    spec = estimate(MODEL, QUANT, HW, vram_hit=0.6, ram_hit=1.0, speculative=3, accept=0.5)
    same_reads = estimate(MODEL, QUANT, HW, vram_hit=0.6, ram_hit=1.0, batch=4)
    assert spec["experts_read_per_layer"] == pytest.approx(same_reads["experts_read_per_layer"])
    assert spec["speculative"]["tokens_per_step"] == pytest.approx(1 + 0.5 * 3)
    assert spec["tok_per_s"] == pytest.approx(2.5 / spec["s_per_step"])
    assert spec["s_per_step"] > plain["s_per_step"]
    none = estimate(MODEL, QUANT, HW, vram_hit=0.6, ram_hit=1.0, speculative=3, accept=0.0)
    assert none["tok_per_s"] < plain["tok_per_s"]  # verifying drafts that are all rejected only costs
    assert math.isclose(estimate(MODEL, QUANT, HW, vram_hit=0.6, ram_hit=1.0, speculative=0, accept=0.3)["tok_per_s"],
                        plain["tok_per_s"])


@pytest.mark.parametrize("kw, message", [
    ({"speculative": -1, "accept": 0.5}, "--speculative must be"),
    ({"speculative": 2}, "needs --accept"),
    ({"speculative": 2, "accept": 1.5}, r"--accept must be a fraction in \[0, 1\]"),
    ({"speculative": 2, "accept": float("nan")}, "--accept must be"),
    ({"vram_hit": 1.2}, r"vram_hit must be in \[0, 1\]"),
    ({"vram_hit": 0.5, "ram_hit": -0.1}, r"ram_hit must be in \[0, 1\]"),
])
def test_bad_speculative_and_hit_inputs(kw, message):
    with pytest.raises(MoesimError, match=message):
        estimate(MODEL, QUANT, HW, **kw)


def test_profile_validation(tmp_path):
    for extra, message in (('expert_copies = "tensor"', "expert_copies must be one of expert, matrix"),
                           ('kv = "disk"', "kv must be one of layers, vram"),
                           ("uploads_per_layer = 2", "needs miss = 'hybrid'"),
                           ('miss = "hybrid"\nuploads_per_layer = 1.5', "whole number"),
                           ("token_us = -1", "token_us must be a number"),
                           ('cpu_overlap = "yes"', "cpu_overlap must be true or false")):
        path = tmp_path / "e.toml"
        path.write_text(f'name = "x"\n{extra}\n')
        with pytest.raises(MoesimError, match=message):
            load_engine(str(path))
