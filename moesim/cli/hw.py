"""`moesim hw list` and `moesim hw show`: the hardware presets."""

from __future__ import annotations

import click

from moesim.cli.output import FORMAT_OPTION, echo, echo_json, echo_kv
from moesim.textsafe import term


def _table(rows: list[dict], columns: list[tuple[str, str]]) -> None:
    cells = [[h for _, h in columns]] + [[_cell(r[k]) for k, _ in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    for j, row in enumerate(cells):
        line = (c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
        click.echo("  ".join(line).rstrip())
        if j == 0:
            click.echo("  ".join("-" * w for w in widths))


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return term(v)


@click.group("hw")
def hw():
    """Hardware presets: VRAM, host RAM, host-to-GPU link, NVMe, CPU expert throughput.

    Every command that takes --hw accepts a preset name or the path of a TOML file
    written like the presets (see `moesim hw show NAME --format json` and docs/costmodel.md)."""


@hw.command("list")
@FORMAT_OPTION
def hw_list(fmt):
    """List the shipped hardware presets with their effective bandwidths."""
    from moesim.costmodel.hardware import hardware_names, load_hardware

    rows = []
    for name in hardware_names():
        h = load_hardware(name)
        e = h.summary()["effective"]
        rows.append({"name": name, "gpu": h.gpu_name, "vram_gib": e["vram_gib"], "vram_gb_s": e["vram_gb_s"],
                     "ram_gib": e["ram_gib"], "ram_gb_s": e["ram_gb_s"], "link": h.link_label(),
                     "link_gb_s": e["link_gb_s"], "nvme_gb_s": e["nvme_gb_s"], "cpu_expert_gb_s": e["cpu_expert_gb_s"],
                     "description": h.description})
    if fmt == "json":
        echo_json(rows)
        return
    _table(rows, [("name", "name"), ("vram_gib", "VRAM GiB"), ("vram_gb_s", "GB/s"), ("ram_gib", "RAM GiB"),
                  ("ram_gb_s", "GB/s"), ("link", "link"), ("link_gb_s", "GB/s"), ("nvme_gb_s", "NVMe GB/s"),
                  ("cpu_expert_gb_s", "CPU expert GB/s")])
    click.echo("\nBandwidths are effective (spec x efficiency, or measured); `moesim hw show NAME` gives the sources.")


@hw.command("show")
@click.argument("name")
@FORMAT_OPTION
def hw_show(name, fmt):
    """Show every number of preset NAME (or a TOML file) with where it comes from."""
    from moesim.costmodel.hardware import load_hardware

    h = load_hardware(name)
    s = h.summary()
    if fmt == "json":
        echo_json(s)
        return
    e = s["effective"]
    echo_kv([
        ("name", h.name), ("description", h.description), ("source", h.source), ("file", h.path),
        ("VRAM", f"{e['vram_gib']:g} GiB ({e['vram_usable_gib']:g} usable), {e['vram_gb_s']:.4g} GB/s effective"),
        ("host RAM", f"{e['ram_gib']:g} GiB ({e['ram_usable_gib']:g} usable), {e['ram_gb_s']:.4g} GB/s effective"),
        ("link", h.link_label() + ("" if h.unified else
                                   f": {e['link_raw_gb_s']:.4g} GB/s raw, {e['link_pinned_gb_s']:.4g} pinned, "
                                   f"{e['link_pageable_gb_s']:.4g} pageable, {e['link_latency_us']:g} us per copy")),
        ("NVMe", f"{e['nvme_gb_s']:.4g} GB/s effective, {e['nvme_latency_us']:g} us per read"),
        ("CPU experts", f"{e['cpu_expert_gb_s']:.4g} GB/s of expert weights"),
        ("GPU compute", f"{e['gpu_tflops_effective']:.4g} TFLOP/s effective (prefill)"),
    ] + ([("CPU sockets", f"{h.sockets}, a process runs on {h.process_sockets}; another socket's memory read at "
                          f"{e['cpu_remote_gb_s']:.4g} GB/s; weights spread over the nodes (llama.cpp): "
                          f"{e['cpu_spread_gb_s']:.4g} GB/s")] if h.sockets > 1 else []))
    # [engine]: a calibrated machine's engine profile and its fitted numbers (moesim calibrate)
    for table in ("gpu", "vram", "ram", "link", "nvme", "cpu") + (("engine",) if s["file"].get("engine") else ()):
        t = s["file"].get(table, {})
        src = t.get("sources", {})
        click.echo(f"\n[{table}]")
        width = max((len(k) for k in t if k != "sources"), default=0)
        for key, value in t.items():
            if key == "sources":
                continue
            note = f"  # {src[key]}" if key in src else ""
            echo(f"  {key.ljust(width)} = {value!r}{note}".replace("True", "true").replace("False", "false"))
        for key, d in s["defaults"].items():
            if key.startswith(table + "."):
                click.echo(f"  {key.split('.', 1)[1]} = {d['value']!r}  # default: {d['basis']}")


command = hw


@hw.command("probe")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=str), required=True,
              help="Machine file to write (TOML; never overwrites an existing file).")
@click.option("--model", default="qwen3-30b-a3b", show_default=True,
              help="Model preset whose expert shapes the CPU mat-vec uses.")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Directory on the drive to measure (a 256 MiB scratch file is written and removed; default: tmp).")
@click.option("--quick", is_flag=True, help="Small buffers (seconds, noisier numbers).")
def hw_probe(output, model, directory, quick):
    """Measure this machine: DRAM streaming bandwidth, CPU expert mat-vec at real expert shapes, NVMe reads at
    128 KiB and 4 MiB (direct I/O where allowed) and, when torch sees a GPU, pinned/pageable copies and VRAM
    bandwidth. Writes a machine file whose numbers say `measured:`."""
    from pathlib import Path

    from moesim.costmodel.hardware import load_hardware
    from moesim.costmodel.probe import probe
    from moesim.costmodel.tomlout import dumps
    from moesim.errors import MoesimError
    from moesim.files import write_text

    if Path(output).exists():
        raise MoesimError(f"{output} exists; choose a new file name")
    doc = probe(model, directory, quick)
    write_text(dumps(doc), output)
    h = load_hardware(output)
    e = h.summary()["effective"]
    echo_kv([("written", output), ("DRAM", f"{e['ram_gb_s']:.4g} GB/s"),
             ("CPU experts", f"{e['cpu_expert_gb_s']:.4g} GB/s, {e['cpu_matrix_us']:.3g} us per matrix"),
             ("NVMe", f"{e['nvme_gb_s']:.4g} GB/s (4 MiB reads), {e['nvme_latency_us']:.3g} us per request"),
             ("GPU", h.gpu_name or "none seen by torch")])
