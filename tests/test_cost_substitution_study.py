"""Issue 4 "Must show", the substitution study (Qwen3-Next-80B-A3B, ~25% of experts resident, an
RTX 3090-class machine): Quality-First (threshold:0.15 + freq + admit 0.5) and Speed-First
(first-choice + freq + admit 0.5) predicted 2.5-3.0x faster per token than fetch-all, ±20% on the ends.

Priced with the defaults `moesim simulate` uses for the shipped trace: the model's native bf16 on
rtx3090-pcie4 (pinned copies; bf16 does not fit the preset's 64 GB of host RAM, so the host-RAM tier
streams some experts from NVMe). The study's llama.cpp comparison (2.8-3.0x slower than the 0.15 rule)
is not reproduced by either placement we model; the test pins down that it lies between them:
per-expert static pinning (the most requested experts resident) is faster than the study measured,
llama.cpp's layer-wise --n-cpu-moe placement slower. The study does not state its llama.cpp
placement, threads or CPU, which is the missing input (docs/costmodel.md)."""

import pytest

from moesim.costmodel.pricing import cost_for_trace
from moesim.simulator import SimConfig, simulate
from moesim.traces import load_routing

LOW, HIGH = 2.5 * 0.8, 3.0 * 1.2


@pytest.fixture(scope="module")
def priced(shipped_trace):
    routing = load_routing(shipped_trace)
    cost, note = cost_for_trace(routing.meta)
    assert (cost.model, cost.quant, cost.hw) == ("qwen3-next-80b-a3b", "bf16", "rtx3090-pcie4"), note

    def s_per_token(eviction, miss, admit=None):
        config = SimConfig(eviction=eviction, miss=miss, admit=admit, budget=0.25)
        return simulate(routing, config, cost=cost).timing["s_per_token"]

    return s_per_token


def test_quality_first_and_speed_first_speedups(priced):
    fetch_all = priced("freq", "fetch-all")
    quality_first = fetch_all / priced("freq", "threshold:0.15", 0.5)
    speed_first = fetch_all / priced("freq", "first-choice", 0.5)
    assert LOW <= quality_first <= HIGH, quality_first
    assert LOW <= speed_first <= HIGH, speed_first
    assert speed_first > quality_first  # fetching only first choices moves fewer bytes


def test_llama_cpp_baseline_is_bracketed_by_the_two_placements(priced):
    rule = priced("freq", "threshold:0.15", 0.5)
    per_expert = priced("static", "cpu") / rule
    per_layer = priced("static-layers", "cpu") / rule
    assert 1.0 < per_expert < 2.8 < 3.0 < per_layer
