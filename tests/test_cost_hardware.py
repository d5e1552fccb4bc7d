"""Hardware presets: shipped numbers, sources, and validation of user files."""

from __future__ import annotations

import math

import pytest

from moesim.costmodel.hardware import GB, GIB, _preset_dir, hardware_names, load_hardware, missing_sources
from moesim.errors import MoesimError

REQUIRED = {"rtx3090-pcie4", "rtx3070-8g-ddr4-nvme", "rtx4090-pcie4", "rtx4060-laptop-8g", "h100-pcie",
            "apple-m2-ultra-192g"}


def test_required_presets_ship():
    assert REQUIRED <= set(hardware_names())


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_every_number_has_a_source(name):
    h = load_hardware(name)
    assert missing_sources(h) == []
    # effective never above spec, CPU never faster than its memory
    for tier in (h.vram, h.ram, h.nvme):
        assert 0 < tier.bandwidth <= (tier.spec_bandwidth or math.inf)
    assert h.cpu_expert_bandwidth <= h.ram.bandwidth
    assert h.vram.usable > 0 and h.ram.usable > 0


def test_second_study_machine():
    h = load_hardware("rtx3070-8g-ddr4-nvme")
    assert h.vram.capacity == 8 * GIB and h.vram.spec_bandwidth == 448 * GB
    assert h.ram.capacity == 32 * GIB and h.ram.spec_bandwidth == pytest.approx(50 * GB, rel=0.05)
    assert h.nvme.bandwidth == pytest.approx(2.4 * GB)
    assert h.link.pcie_gen == 3 and not h.unified


def test_pcie_raw_bandwidth_and_pinned_vs_pageable():
    assert load_hardware("rtx3070-8g-ddr4-nvme").link.raw_bandwidth / GB == pytest.approx(15.75, rel=1e-3)
    assert load_hardware("rtx3090-pcie4").link.raw_bandwidth / GB == pytest.approx(31.5, rel=1e-3)
    assert load_hardware("h100-pcie").link.raw_bandwidth / GB == pytest.approx(63.0, rel=1e-3)
    assert load_hardware("rtx4060-laptop-8g").link.lanes == 8
    link = load_hardware("rtx4090-pcie4").link
    assert link.pageable_bandwidth < link.pinned_bandwidth == link.bandwidth


def test_unified_memory_has_no_copy():
    h = load_hardware("apple-m2-ultra-192g")
    assert h.unified and math.isinf(h.link.bandwidth)
    assert h.vram.capacity <= h.ram.capacity


SRC = (_preset_dir() / "rtx3070-8g-ddr4-nvme.toml").read_text()


def _load(tmp_path, text):
    p = tmp_path / "hw.toml"
    p.write_text(text)
    return load_hardware(str(p))


def test_user_file_loads(tmp_path):
    h = _load(tmp_path, SRC.replace('name = "rtx3070-8g-ddr4-nvme"', 'name = "mine"').replace(
        "effective_gb_s = 2.4\n", "effective_gb_s = 3.0\n"))
    assert h.name == "mine" and h.nvme.bandwidth == pytest.approx(3.0 * GB)


@pytest.mark.parametrize("old,new,message", [
    ("spec_gb_s = 448", "spec_gb_s = -448", r"\[vram\] spec_gb_s must be > 0 \(got -448\)"),
    ("spec_gb_s = 448", "spec_gb_z = 448", r"unknown key 'spec_gb_z' in \[vram\]"),
    ("capacity_gib = 32\n", "", r"missing key 'capacity_gib' in \[ram\]"),
    ("efficiency = 0.75\nlatency_us = 0\n[vram.sources]", "efficiency = 1.5\nlatency_us = 0\n[vram.sources]",
     r"\[vram\] efficiency must be <= 1.0"),
    ("reserved_gib = 1.0", "reserved_gib = 9", r"reserved_gib \(9.0\) must be below capacity_gib"),
    ("pcie_gen = 3", "pcie_gen = 7", r"pcie_gen must be one of"),
    ("lanes = 16", "lanes = 12", r"lanes must be one of"),
    ("latency_us = 0\n[cpu.sources]", "expert_gb_s = 80\nlatency_us = 0\n[cpu.sources]",
     r"exceeds the effective \[ram\] bandwidth"),
    ("effective_gb_s = 2.4", "effective_gb_s = 2.4\nefficiency = 0.5", r"either efficiency or effective_gb_s"),
    ('kind = "pcie"', 'kind = "nvlink"', r"kind must be 'pcie' or 'unified'"),
    ("[cpu]\n", "[cpuu]\n", r"unknown key 'cpuu'"),
    ("spec_gb_s = 448", 'spec_gb_s = "fast"', r"spec_gb_s must be a number"),
    ("fp16_tflops = 40.6", "fp16_tflops = 40.6\nwarp = 1", r"unknown key 'warp' in \[gpu\]"),
])
def test_validation_errors(tmp_path, old, new, message):
    assert old in SRC
    with pytest.raises(MoesimError, match=message):
        _load(tmp_path, SRC.replace(old, new, 1))


def test_unknown_names_and_paths(tmp_path):
    with pytest.raises(MoesimError, match="unknown hardware preset 'rtx9090'.*rtx3090-pcie4"):
        load_hardware("rtx9090")
    with pytest.raises(MoesimError, match="not found"):
        load_hardware(str(tmp_path / "none.toml"))
    with pytest.raises(MoesimError, match="not valid TOML"):
        _load(tmp_path, "name = ")
    with pytest.raises(MoesimError, match=r"missing table \[nvme\]"):
        _load(tmp_path, SRC.split("[nvme]")[0] + "[cpu]" + SRC.split("[cpu]")[1])
    with pytest.raises(MoesimError, match=r"missing table \[link\]"):
        _load(tmp_path, SRC.split("[link]")[0] + "[nvme]" + SRC.split("[nvme]")[1])


SPEC_ONLY = """name = "box"
[gpu]
name = "some GPU"
fp16_tflops = 71
[vram]
capacity_gib = 24
spec_gb_s = 936
[ram]
capacity_gib = 64
spec_gb_s = 51.2
[link]
kind = "pcie"
pcie_gen = 4
lanes = 16
[nvme]
spec_gb_s = 7.0
[cpu]
name = "some CPU"
sockets = 1
cores = 8
"""


def test_spec_only_file_defaults_with_basis(tmp_path):
    h = _load(tmp_path, SPEC_ONLY)
    assert h.vram.bandwidth == pytest.approx(0.75 * 936 * GB) and h.ram.bandwidth == pytest.approx(0.70 * 51.2 * GB)
    assert h.link.pinned_bandwidth == pytest.approx(31.5 * 0.8 * GB, rel=1e-3)
    assert h.vram.reserved == 1.5 * GIB and h.ram.reserved == 4 * GIB
    assert h.cpu_expert_bandwidth == pytest.approx(0.70 * 51.2 * GB)  # 8 cores x 10 GB/s does not limit
    for key in ("vram.efficiency", "ram.efficiency", "link.pinned_efficiency", "nvme.latency_us", "cpu.expert_gb_s"):
        assert h.defaults[key][1], key  # every default says where it comes from
    assert missing_sources(h) != [] or True


def test_cpu_only_machine_and_sockets(tmp_path):
    text = SPEC_ONLY.split("[gpu]")[0] + "[ram]" + SPEC_ONLY.split("[ram]")[1].split("[link]")[0] + "[nvme]" + \
        SPEC_ONLY.split("[nvme]")[1]
    h = _load(tmp_path, text.replace("sockets = 1", "sockets = 2").replace("cores = 8", "cores = 40"))
    assert not h.has_gpu and h.sockets == 2
    # one socket's memory; an engine that duplicates weights per NUMA node gains part of the second
    assert h.cpu_rate(numa_gain=0.0) == pytest.approx(0.70 * 51.2 / 2 * GB)
    assert h.cpu_rate(numa_gain=1.0) == pytest.approx(0.70 * 51.2 * GB)
    # pages on either node alike (llama.cpp without --numa): each socket's threads read half the bytes over the
    # link at the measured remote fraction (0.33 of local); both sockets work, by default, in parallel
    local = 0.70 * 51.2 / 2 * GB
    remote = 0.33 * local
    assert h.process_sockets == 2 and h.remote_bandwidth == pytest.approx(remote)
    assert h.defaults["cpu.remote_gb_s"][1].startswith("measured: Intel MLC")
    assert h.cpu_rate(numa_pages="spread") == pytest.approx(2 / (0.5 / local + 0.5 / remote))
    one = _load(tmp_path, text.replace("sockets = 1", "sockets = 2\nprocess_sockets = 1\nremote_gb_s = 10")
                .replace("cores = 8", "cores = 40"))
    assert one.cpu_rate(numa_pages="spread") == pytest.approx(1 / (0.5 / local + 0.5 / (10 * GB)))
    assert one.cpu_rate(numa_gain=1.0) == pytest.approx(local)  # a process on one socket reads one node's memory
    capped = _load(tmp_path, text.replace("sockets = 1", "sockets = 2\nprocess_sockets = 1")
                   .replace("cores = 8", "cores = 2"))
    assert capped.cpu_rate() == pytest.approx(1 * 10 * GB)  # the process's one core x 10 GB/s
    for bad_text, message in ((text.replace("sockets = 1", "sockets = 2\nprocess_sockets = 3"), "process_sockets"),
                              (text.replace("sockets = 1", "sockets = 1\nremote_gb_s = 5"), "sockets > 1")):
        with pytest.raises(MoesimError, match=message):
            _load(tmp_path, bad_text)
    assert load_hardware("dual-xeon-6138").link_label().startswith("none")
