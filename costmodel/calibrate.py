"""`moesim calibrate`: fit a machine's free factors to a user's measured runs.

Runs come from llama-bench output (its markdown table: model, backend, ngl, optional n_cpu_moe, test, t/s) or a
CSV with columns model, quant, placement, tok_s (placement: ``vram``, ``cpu`` or ``n-cpu-moe=N``). Decode time is
linear in the inverse rates, t = A + B / f_vram + C / f_cpu, so the two factors (VRAM and CPU expert rates relative
to the machine file) are a least-squares fit on relative errors; A, B, C come from the model at three rate
settings. Fewer than two runs that load a rate leave its factor at 1.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np

from moesim.costmodel.hardware import GB, load_hardware
from moesim.costmodel.timing import estimate
from moesim.errors import MoesimError
from moesim.files import read_text

LLAMA_BENCH_QUANTS = {"Q4_K - Medium": "q4_k_m", "Q8_0": "q8_0", "IQ4_XS - 4.25 bpw": "iq4_xs", "MXFP4 MoE": "mxfp4",
                      "BF16": "bf16", "F16": "fp16", "Q4_K - Small": "q4_k"}


def read_runs(path: str | Path, model: str | None = None) -> list[dict]:
    text = read_text(path, "runs file")
    if text.lstrip().startswith("|") or "| t/s" in text:
        return _llama_bench(text, model, path)
    rows = list(csv.DictReader(text.splitlines()))
    need = {"model", "quant", "placement", "tok_s"}
    if not rows or not need <= set(rows[0]):
        raise MoesimError(f"{path}: expected llama-bench output or a CSV with columns {', '.join(sorted(need))}")
    out = []
    for i, r in enumerate(rows, start=2):
        cells = {k: str(r.get(k) or "").strip() for k in sorted(need)}  # a short line leaves cells None
        missing = [k for k, v in cells.items() if not v]
        if missing:
            raise MoesimError(f"{path}: line {i} has no {', '.join(missing)}")
        out.append({"model": cells["model"], "quant": cells["quant"], "placement": cells["placement"],
                    "tok_s": _rate(cells["tok_s"], f"{path}: line {i}")})
    return out


def _rate(text: str, where: str) -> float:
    """A measured tokens per second: a finite positive number."""
    try:
        v = float(text.split("±")[0])
    except ValueError:
        v = float("nan")
    if not (math.isfinite(v) and v > 0):
        raise MoesimError(f"{where}: tokens per second {text.strip()!r} is not a positive finite number")
    return v


def _llama_bench(text: str, model: str | None, path) -> list[dict]:
    lines = [ln for ln in text.splitlines() if ln.strip().startswith("|")]
    head = [c.strip() for c in lines[0].strip().strip("|").split("|")] if lines else []
    if not {"model", "test", "t/s"} <= set(head):
        raise MoesimError(f"{path}: a llama-bench table needs the columns model, test and t/s (found "
                          f"{', '.join(head) or 'no table'})")
    out = []
    for n, ln in enumerate(lines[2:], start=3):
        cells = dict(zip(head, (c.strip() for c in ln.strip().strip("|").split("|"))))
        if not cells.get("test", "").startswith("tg"):
            continue
        where = f"{path}: table row {n}"
        quant = next((q for k, q in LLAMA_BENCH_QUANTS.items() if k in cells.get("model", "")), None)
        if quant is None or model is None:
            raise MoesimError(f"{where} ({cells.get('model')!r}): give --model and a known quantization")
        if cells.get("backend", "").upper() == "CPU" or cells.get("ngl", "99") == "0":
            placement = "cpu"
        elif cells.get("n_cpu_moe"):
            if not cells["n_cpu_moe"].isdigit():
                raise MoesimError(f"{where}: n_cpu_moe {cells['n_cpu_moe']!r} is not a number of layers")
            placement = f"n-cpu-moe={int(cells['n_cpu_moe'])}"
        else:
            placement = "vram"
        out.append({"model": model, "quant": quant, "placement": placement,
                    "tok_s": _rate(cells.get("t/s", ""), where)})
    return out


def _predict(run: dict, h) -> float:
    kw: dict[str, Any] = {}
    p = run["placement"]
    if p == "vram":
        kw["vram_hit"] = 1.0
    elif p.startswith("n-cpu-moe=") and p.split("=")[1].isdigit():
        kw["cpu_moe_layers"] = int(p.split("=")[1])
    elif p != "cpu":
        raise MoesimError(f"placement {p!r}: use vram, cpu or n-cpu-moe=N (N a whole number of layers)")
    elif h.has_gpu:
        kw.update(vram_hit=0.0, dense="ram")
    return 1.0 / estimate(run["model"], run["quant"], h, engine="llama.cpp", **kw)["tok_per_s"]


def _scaled(h, fv: float, fc: float):
    return dataclasses.replace(h, vram=dataclasses.replace(h.vram, bandwidth=h.vram.bandwidth * fv),
                               cpu_expert_bandwidth=h.cpu_rate() * fc, cpu_expert_given=True)


def fit(runs: list[dict], hw) -> dict:
    h = load_hardware(hw)
    rows = []
    for r in runs:
        t11, t21, t12 = (_predict(r, _scaled(h, a, b)) for a, b in ((1, 1), (2, 1), (1, 2)))
        vram_part, cpu_part = 2 * (t11 - t21), 2 * (t11 - t12)
        rows.append((t11 - vram_part - cpu_part, vram_part, cpu_part, 1.0 / r["tok_s"]))
    A, B, C, T = (np.array(col) for col in zip(*rows))
    cols = [i for i, v in ((0, B), (1, C)) if (v > 0.05 * T).sum() >= 2]
    x = np.ones(2)
    fitted, rejected = [], []
    if cols:
        M = np.stack([(B, C)[i] / T for i in cols], axis=1)
        sol, *_ = np.linalg.lstsq(M, (T - A - sum((B, C)[i] for i in range(2) if i not in cols)) / T, rcond=None)
        for i, v in zip(cols, sol):
            name = ("vram", "cpu")[i]
            why = _implausible(name, float(v), h)
            if why:  # the runs are not explained by a rate of this machine: keep the file's, and say so
                rejected.append(f"{name} ({why})")
            else:
                x[i] = v
                fitted.append(name)
    fv, fc = 1 / x[0], 1 / x[1]
    before = [math.log(1 / (a + b + c) / (1 / t)) for a, b, c, t in rows]
    after = [math.log(1 / (a + b * x[0] + c * x[1]) / (1 / t)) for a, b, c, t in zip(A, B, C, T)]
    return {"vram_factor": fv, "cpu_factor": fc, "fitted": fitted, "rejected": rejected,
            "residuals_before": before, "residuals_after": after, "hw": h}


def _implausible(name: str, inverse_factor: float, h) -> str:
    """Why a fitted inverse rate factor cannot be this machine's ('' if it can)."""
    if not (math.isfinite(inverse_factor) and inverse_factor > 0):
        return f"the fit gives a non-positive time per byte ({inverse_factor:.3g}); the rate is kept"
    if name == "cpu" and h.cpu_rate() / inverse_factor > h.ram.bandwidth:
        return "the fit gives a CPU expert rate above the RAM bandwidth; the rate is kept"
    return ""


def machine_doc(result: dict, runs_path: str) -> dict:
    h = result["hw"]
    doc = {k: (dict(v) if isinstance(v, dict) else v) for k, v in h.doc.items()}
    doc["name"] = f"{h.name}-calibrated"
    tag = f"fitted: moesim calibrate to the runs in {runs_path}"
    if "vram" in result["fitted"] and h.has_gpu:
        t = doc["vram"]
        t.pop("efficiency", None)
        t["effective_gb_s"] = round(h.vram.bandwidth * result["vram_factor"] / GB, 3)
        t.setdefault("sources", {})["effective_gb_s"] = tag
    if "cpu" in result["fitted"]:
        t = doc["cpu"]
        t["expert_gb_s"] = round(h.cpu_rate() * result["cpu_factor"] / GB, 3)
        t.setdefault("sources", {})["expert_gb_s"] = tag
    return doc
