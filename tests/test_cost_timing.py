"""The analytic time model: the second study's bandwidth figures, per-operation costs, batching, prefill."""

from __future__ import annotations

import math

import pytest

from moesim.costmodel.hardware import GB, load_hardware
from moesim.costmodel.models import load_model
from moesim.costmodel.timing import CostParams, cost_params, coverage, estimate, expected_union, what_fits
from moesim.errors import MoesimError

STUDY = ("qwen3-235b-a22b", "q4_k_m", "rtx3070-8g-ddr4-nvme")


def test_second_study_nothing_cached():
    # Every active byte (dense weights included) read from NVMe at 2.4 GB/s: the study's ~0.20 tok/s, +-15%.
    for miss in ("cpu", "fetch"):
        d = estimate(*STUDY, vram_hit=0.0, ram_hit=0.0, dense="nvme", miss=miss)
        assert d["tok_per_s"] == pytest.approx(0.20, rel=0.15)
        # all but the embedding row
        assert d["bytes_per_token"]["nvme"] == pytest.approx(d["active_bytes_per_token"], rel=1e-6)
        # fetch: the copied experts are then read from VRAM; cpu: nothing touches the GPU
        assert d["bytes_per_token"]["vram"] == (0 if miss == "cpu" else pytest.approx(94 * 8 * d["bytes_per_expert"]))


def test_second_study_warm_single_stream():
    # VRAM and RAM hold what fits, uniform access (no routing skew assumed); the study ran llama.cpp, which computes
    # the experts in host memory on the CPU (miss=cpu). Measured: 0.44 tok/s, +-25%.
    d = estimate(*STUDY, miss="cpu")
    assert d["defaults"] == ["vram_hit", "ram_hit"]
    assert d["tok_per_s"] == pytest.approx(0.44, rel=0.25)
    # the fast tiers hold roughly their share of the 137.5 GB of experts: ~2% VRAM, ~22% host RAM
    assert 0.01 < d["reads_fraction"]["vram"] < 0.03
    assert 0.18 < d["reads_fraction"]["ram"] < 0.25
    # an offloading engine that copies the misses to the GPU lands in the same band (NVMe dominates)
    assert estimate(*STUDY, miss="fetch")["tok_per_s"] == pytest.approx(0.44, rel=0.25)
    # routing skew can only help: more of the traffic lands on the cached experts
    assert estimate(*STUDY, miss="cpu", zipf=0.5)["tok_per_s"] > d["tok_per_s"]


def test_cost_params_per_operation():
    p = cost_params(*STUDY)
    h = load_hardware(STUDY[2])
    bpe = load_model(STUDY[0]).bytes_per_expert("q4_k_m")
    assert p.bytes_per_expert == bpe
    assert p.s_expert_vram == pytest.approx(bpe / h.vram.bandwidth)
    assert p.s_fetch_ram == pytest.approx(10e-6 + bpe / (15.7538e9 * 0.8), rel=1e-4)
    assert p.s_fetch_nvme == pytest.approx(90e-6 + 10e-6 + bpe / (2.4 * GB))
    # three expert matrices start their streams (1 us each), then 0.75 x 51.2 GB/s of one socket's DRAM
    assert p.s_expert_cpu == pytest.approx(3e-6 + bpe / (0.75 * 51.2 * GB))
    assert p.s_copy_link == p.s_fetch_ram and p.s_copy_nvme == p.s_fetch_nvme
    assert p.s_fetch_nvme > p.s_fetch_ram > p.s_expert_cpu > p.s_expert_vram > 0
    assert p.dense_placement == "vram" and p.vram_expert_slots > 0
    with pytest.raises(AttributeError):
        p.s_dense = 0.0  # frozen: safe to share between configs


def test_step_seconds_matches_estimate_when_all_resident():
    p = cost_params("qwen3-30b-a3b", "q4_k_m", "rtx3090-pcie4")
    d = estimate("qwen3-30b-a3b", "q4_k_m", "rtx3090-pcie4")
    assert d["vram_hit"] == 1.0  # 17 GiB of q4_k_m fits in 22.5 usable GiB
    n = p.n_moe_layers * p.top_k
    assert d["s_per_token"] == pytest.approx(p.step_seconds(n))
    assert p.step_seconds(n, n_fetch_ram=3) == pytest.approx(p.step_seconds(n) + 3 * p.s_fetch_ram)


def test_unified_memory_never_copies():
    p = cost_params("qwen3-235b-a22b", "q4_k_m", "apple-m2-ultra-192g")
    assert p.unified and p.s_fetch_ram == 0.0 and p.s_copy_link == 0.0
    assert p.s_fetch_nvme == p.s_nvme_read
    d = estimate("deepseek-v3", "q4_k_m", "apple-m2-ultra-192g")
    assert d["bytes_per_token"]["link"] == 0.0 and d["bytes_per_token"]["nvme"] > 0


def test_expected_union():
    assert expected_union(128, 8, 1) == pytest.approx(8.0)
    assert expected_union(128, 8, 4) == pytest.approx(128 * (1 - (1 - 8 / 128) ** 4))
    u = [expected_union(128, 8, b) for b in (1, 2, 8, 64, 1024)]
    assert u == sorted(u) and u[-1] <= 128
    assert expected_union(128, 8, 16, zipf=1.0) < expected_union(128, 8, 16)  # popular experts overlap more


def test_coverage():
    assert coverage(128, 32) == pytest.approx(0.25)
    assert coverage(128, 128, zipf=1.2) == pytest.approx(1.0)
    assert coverage(128, 32, zipf=1.0) > 0.25
    with pytest.raises(MoesimError):
        coverage(128, 3, zipf=-1)


def test_batch_reads_the_union():
    # host hit fraction given: under the defaults four sequences' working set (29 GiB) floods the 27.7 GiB page
    # cache of this machine (test_cost_memory.py)
    one = estimate(*STUDY, miss="cpu", ram_hit=0.2)
    four = estimate(*STUDY, miss="cpu", batch=4, ram_hit=0.2)
    assert four["experts_read_per_layer"] == pytest.approx(expected_union(128, 8, 4))
    assert four["tok_per_s"] > one["tok_per_s"]  # aggregate
    assert four["tok_per_s_per_seq"] < one["tok_per_s"]  # each sequence waits for the union
    fixed = estimate(*STUDY, miss="cpu", batch=4, union=32)
    assert fixed["experts_read_per_layer"] == 32
    with pytest.raises(MoesimError, match="union"):
        estimate(*STUDY, batch=2, union=40)


def test_large_batch_becomes_compute_bound():
    d = estimate("qwen3-30b-a3b", "q4_k_m", "rtx3070-8g-ddr4-nvme", vram_hit=1.0, dense="vram", batch=4096)
    assert d["bound"] == "compute"


def test_prefill_is_costed_apart():
    d = estimate("qwen3-30b-a3b", "q4_k_m", "rtx4090-pcie4", prefill_tokens=4096)
    p = cost_params("qwen3-30b-a3b", "q4_k_m", "rtx4090-pcie4")
    pf = d["prefill"]
    flops = 4096 * p.flops_per_token + p.attn_flops_per_ctx_token * 4096 * 4095 / 2
    assert pf["seconds"] == pytest.approx(flops / p.gpu_flops)  # all resident: compute-bound
    assert pf["tok_per_s"] > 10 * d["tok_per_s"]


def test_bytes_by_tier_are_consistent():
    d = estimate(*STUDY, miss="fetch")
    b = d["bytes_per_token"]
    bpe = d["bytes_per_expert"]
    reads = 94 * 8
    assert b["link"] == pytest.approx(reads * (1 - d["vram_hit"]) * bpe)
    assert b["ram"] + b["nvme"] == pytest.approx(b["link"] + 2304, rel=1e-6)  # + the embedding row
    assert d["s_per_token"] == pytest.approx(sum(d["time_per_step"].values()))


def test_bad_inputs():
    with pytest.raises(MoesimError, match="vram_hit"):
        estimate(*STUDY, vram_hit=1.5)
    with pytest.raises(MoesimError, match="miss mode"):
        estimate(*STUDY, miss="pray")
    with pytest.raises(MoesimError, match="do not fit"):
        cost_params("deepseek-v3", "q4_k_m", "rtx3070-8g-ddr4-nvme", dense="vram")
    with pytest.raises(MoesimError, match="unknown quantization"):
        cost_params("qwen3-30b-a3b", "q2", "rtx3090-pcie4")


def test_what_fits_defaults_are_exposed():
    p = cost_params(*STUDY)
    v, r = what_fits(p)
    assert v == pytest.approx(p.vram_expert_slots / (94 * 128))
    assert r == pytest.approx(p.ram_expert_slots / (94 * 128 - p.vram_expert_slots))
    assert isinstance(p, CostParams) and not math.isnan(v + r)


def test_ram_default_follows_a_given_vram_hit():
    fit = estimate(*STUDY, miss="cpu")
    half = estimate(*STUDY, miss="cpu", vram_hit=0.5)
    assert half["defaults"] == ["ram_hit"]
    # host RAM still serves the same share of all reads
    assert half["reads_fraction"]["ram"] == pytest.approx(fit["reads_fraction"]["ram"])
    assert estimate(*STUDY, vram_hit=1.0)["reads_fraction"]["nvme"] == 0.0
