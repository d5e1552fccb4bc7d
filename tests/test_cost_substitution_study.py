"""Issue 4 "Must show", the substitution study (Qwen3-Next-80B-A3B, ~25% of experts resident, an
RTX 3090-class machine): Quality-First (threshold:0.15 + freq + admit 0.5) and Speed-First
(first-choice + freq + admit 0.5) measured 2.5-3.0x faster per token than fetch-all.

Priced as `moesim sweep` and `moesim simulate` price the shipped trace by default (issue 13): on
rtx3090-pcie4 the model's native bf16 does not fit (its 25% cache needs 36.0 GiB of VRAM, 18.5 GiB are
free; its 144 GiB of experts exceed host RAM), so the default quantization is Q4_K_M, whose cache fits.
Speed-ups divide by the one baseline of every table: the fetch-all preset (LRU, every miss fetched).

The study states neither its quantization nor its copy path, and the replay does not land on its figure:
with Q4_K_M experts (1.8 MB) copies are cheap and the dense work and VRAM reads no policy avoids cap the
gain near 2x; priced at bf16 (a cache the GPU cannot hold, part of the experts read from NVMe) fetching is
so expensive that the gain exceeds 3.5x. The tests pin down that the published 2.5-3.0x lies between the
two pricings, the same way the study's llama.cpp comparison (2.8-3.0x slower than the 0.15 rule) lies
between the two placements we model. No number was tuned to meet the study (docs/costmodel.md)."""

import pytest

from moesim.costmodel.pricing import cost_for_trace
from moesim.simulator import SimConfig, simulate
from moesim.traces import load_routing

CACHE = 128 * 48  # 25% of 512 experts in each of the 48 MoE layers


@pytest.fixture(scope="module")
def routing(shipped_trace):
    return load_routing(shipped_trace)


def pricer(routing, quant=None):
    cost, note = cost_for_trace(routing.meta, quant=quant, cache_experts=CACHE)

    def run(eviction, miss, admit=None):
        config = SimConfig(eviction=eviction, miss=miss, admit=admit, budget=0.25)
        return simulate(routing, config, cost=cost).timing

    return cost, run


def speedups(run):
    fetch_all = run("lru", "fetch-all")["s_per_token"]  # the fetch-all preset: the tables' baseline
    return (fetch_all / run("freq", "threshold:0.15", 0.5)["s_per_token"],
            fetch_all / run("freq", "first-choice", 0.5)["s_per_token"])


def test_default_pricing_is_a_quantization_whose_cache_fits(routing):
    cost, run = pricer(routing)
    assert (cost.model, cost.quant, cost.hw) == ("qwen3-next-80b-a3b", "q4_k_m", "rtx3090-pcie4")
    assert run("lru", "fetch-all")["fits_in_vram"]
    bf16, run16 = pricer(routing, "bf16")
    timing = run16("lru", "fetch-all")
    assert not timing["fits_in_vram"]
    assert timing["vram_bytes_for_cache"] / 2**30 == pytest.approx(36.0, abs=0.05)
    assert timing["vram_bytes_free_for_experts"] / 2**30 == pytest.approx(18.5, abs=0.05)


def test_published_speedups_lie_between_the_q4_k_m_and_bf16_pricings(routing):
    _, q4 = pricer(routing)
    _, b16 = pricer(routing, "bf16")
    qf4, sf4 = speedups(q4)
    qf16, sf16 = speedups(b16)
    assert 1.0 < qf4 < sf4 < 2.5, (qf4, sf4)  # fetching only first choices moves fewer bytes
    assert 3.0 < qf16 < sf16, (qf16, sf16)


def test_llama_cpp_baseline_is_bracketed_by_the_two_placements(routing):
    _, run = pricer(routing)
    rule = run("freq", "threshold:0.15", 0.5)["s_per_token"]
    per_expert = run("static", "cpu")["s_per_token"] / rule
    per_layer = run("static-layers", "cpu")["s_per_token"] / rule
    assert 1.0 < per_expert < 2.8 < 3.0 < per_layer
