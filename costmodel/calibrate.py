"""`moesim calibrate`: fit a machine's free factors, and an engine's per-token and per-miss costs, to measured runs.

Runs come from llama-bench output (its markdown table: model, backend, ngl, optional n_cpu_moe, optional cache
columns, test, t/s) or a CSV. A CSV row is either a placement run (``model, quant, placement, tok_s``; placement
``vram``, ``cpu`` or ``n-cpu-moe=N``, priced with the llama.cpp profile) or a run of an engine with a dynamic expert
cache at a measured hit rate (``model, quant, vram_hit, tok_s``, priced with ``--engine``, default the machine file's
[engine], else llama.cpp-expert-cache). A llama-bench row with a ``moe_expert_cache`` (or ``moe_cache``) column is a
cache run: its ``vram_hit`` (or ``hit_rate``) column gives the hit rate, or else the share of each layer's experts the
slots hold (uniform access).

Two stages, each linear. Placement runs fit the VRAM and CPU expert rates: decode time is linear in the inverse rates,
t = A + B / f_vram + C / f_cpu (A, B, C from the model at three rate settings), a least-squares fit on relative
errors; fewer than two runs that load a rate leave its factor at 1. Cache runs then fit, at those rates, a fixed cost
per decode step and one per missed expert: t = t_model(h) + d_token + m(h) d_miss, m(h) = MoE layers x top_k x (1 -
h) misses per token, so two runs at different hit rates determine both. The fitted costs go into the calibrated
machine file: ``[engine]`` (profile, token_us, and fetch_expert_us for engines that fetch misses) and ``[cpu]
latency_us`` for engines that compute misses on the CPU (the cost per CPU-computed expert), each with its source.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np

from moesim.costmodel.engines import load_engine
from moesim.costmodel.hardware import GB, load_hardware
from moesim.costmodel.timing import engine_for, estimate, load_model_any
from moesim.errors import MoesimError
from moesim.files import read_text

LLAMA_BENCH_QUANTS = {"Q4_K - Medium": "q4_k_m", "Q8_0": "q8_0", "IQ4_XS - 4.25 bpw": "iq4_xs", "MXFP4 MoE": "mxfp4",
                      "BF16": "bf16", "F16": "fp16", "Q4_K - Small": "q4_k"}
CACHE_ENGINE = "llama.cpp-expert-cache"  # the engine of cache runs when neither --engine nor the machine names one
_CACHE_COLUMNS = ("moe_expert_cache", "moe_cache")
_HIT_COLUMNS = ("vram_hit", "hit_rate")


def _float(text, what: str, where: str) -> float:
    """A number cell (a trailing % divides by 100); not a number: one line."""
    t = str(text if text is not None else "").strip()
    try:
        v = float(t.rstrip("%")) / (100.0 if t.endswith("%") else 1.0)
    except ValueError:
        raise MoesimError(f"{where}: {what} {t!r} is not a number") from None
    return v


def _rate(text: str, where: str) -> float:
    """A measured tokens per second (llama-bench's "12.3 ± 0.4" too): a finite positive number."""
    try:
        v = float(text.split("±")[0])
    except ValueError:
        v = float("nan")
    if not (math.isfinite(v) and v > 0):
        raise MoesimError(f"{where}: tokens per second {text.strip()!r} is not a positive finite number")
    return v


def _check_run(r: dict, where: str) -> dict:
    if not (math.isfinite(r["tok_s"]) and r["tok_s"] > 0):
        raise MoesimError(f"{where}: tok_s must be a positive finite number (got {r['tok_s']!r})")
    if "vram_hit" in r and not (math.isfinite(r["vram_hit"]) and 0.0 <= r["vram_hit"] <= 1.0):
        raise MoesimError(f"{where}: vram_hit must be a fraction in [0, 1] (got {r['vram_hit']!r})")
    return r


def read_runs(path: str | Path, model: str | None = None) -> list[dict]:
    text = read_text(path, "runs file")
    if text.lstrip().startswith("|") or "| t/s" in text:
        return _llama_bench(text, model, path)
    rows = list(csv.DictReader(text.splitlines()))
    head = set(rows[0]) if rows else set()
    if not rows or not {"model", "quant", "tok_s"} <= head or not head & {"placement", "vram_hit"}:
        raise MoesimError(f"{path}: expected llama-bench output or a CSV with columns model, quant, tok_s and "
                          "placement (vram, cpu, n-cpu-moe=N) or vram_hit (a cache run's measured hit rate)")
    out = []
    for i, r in enumerate(rows, start=2):
        where = f"{path}: line {i}"
        cells = {k: str(r.get(k) or "").strip() for k in ("model", "quant", "tok_s")}  # a short line leaves None
        missing = [k for k, v in cells.items() if not v]
        if missing:
            raise MoesimError(f"{where} has no {', '.join(missing)}")
        run: dict[str, Any] = {"model": cells["model"], "quant": cells["quant"], "tok_s": _rate(cells["tok_s"], where)}
        if (r.get("vram_hit") or "").strip():
            run["vram_hit"] = _float(r["vram_hit"], "vram_hit", where)
        elif (r.get("placement") or "").strip():
            run["placement"] = r["placement"].strip()
        else:
            raise MoesimError(f"{where}: give a placement or a vram_hit")
        out.append(_check_run(run, where))
    return out


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
        run: dict[str, Any] = {"model": model, "quant": quant, "tok_s": _rate(cells.get("t/s", ""), where)}
        slots = next((cells[c] for c in _CACHE_COLUMNS if cells.get(c)), None)
        hit = next((cells[c] for c in _HIT_COLUMNS if cells.get(c)), None)
        if hit is not None:
            run["vram_hit"] = _float(hit, "hit rate", where)
        elif slots is not None and _float(slots, "cache slots", where) > 0:
            m = load_model_any(model)
            run["vram_hit"] = min(1.0, _float(slots, "cache slots", where) / m.n_experts)
            run["hit_basis"] = f"{slots} slots of {m.n_experts} experts per layer (uniform access)"
        elif cells.get("backend", "").upper() == "CPU" or cells.get("ngl", "99") == "0":
            run["placement"] = "cpu"
        elif cells.get("n_cpu_moe"):
            if not cells["n_cpu_moe"].isdigit():
                raise MoesimError(f"{where}: n_cpu_moe {cells['n_cpu_moe']!r} is not a number of layers")
            run["placement"] = f"n-cpu-moe={int(cells['n_cpu_moe'])}"
        else:
            run["placement"] = "vram"
        out.append(_check_run(run, where))
    return out


def _predict(run: dict, h, engine=None) -> float:
    """Seconds per token the model predicts for ``run`` on machine ``h`` (cache runs with ``engine``)."""
    if "vram_hit" in run:
        return 1.0 / estimate(run["model"], run["quant"], h, engine=engine, vram_hit=run["vram_hit"])["tok_per_s"]
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


def _misses_per_token(run: dict) -> float:
    m = load_model_any(run["model"])
    return m.n_moe_layers * m.top_k * (1.0 - run["vram_hit"])


def fit(runs: list[dict], hw, engine: str | None = None) -> dict:
    h = load_hardware(hw)
    if not runs:
        raise MoesimError("no runs to fit")
    cache_engine = None
    cache_runs = [r for r in runs if "vram_hit" in r]
    if cache_runs:
        cache_engine = engine_for(engine if engine else (None if h.engine else CACHE_ENGINE), h)
        hits = {round(r["vram_hit"], 9) for r in cache_runs}
        if len(cache_runs) < 2 or len(hits) < 2:
            raise MoesimError(f"{len(cache_runs)} cache run(s) at {len(hits)} hit rate(s): a fixed cost per step and "
                              "one per miss need at least two runs at different hit rates")
    # stage 1: the rates, from the placement runs (the llama.cpp profile)
    rows = []
    for r in runs:
        if "vram_hit" in r:
            continue
        t11, t21, t12 = (_predict(r, _scaled(h, a, b)) for a, b in ((1, 1), (2, 1), (1, 2)))
        vram_part, cpu_part = 2 * (t11 - t21), 2 * (t11 - t12)
        rows.append((t11 - vram_part - cpu_part, vram_part, cpu_part, 1.0 / r["tok_s"]))
    x = np.ones(2)
    fitted: list[str] = []
    rejected: list[str] = []
    if rows:
        A, B, C, T = (np.array(col) for col in zip(*rows))
        cols = [i for i, v in ((0, B), (1, C)) if (v > 0.05 * T).sum() >= 2]
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
    fitted_hw = _scaled(h, fv, fc) if fitted else h
    # stage 2: a cost per step and per miss of the cache engine, at those rates
    d_token = d_miss = 0.0
    if cache_runs:
        T = np.array([1.0 / r["tok_s"] for r in cache_runs])
        base = np.array([_predict(r, fitted_hw, cache_engine) for r in cache_runs])
        miss = np.array([_misses_per_token(r) for r in cache_runs])
        M = np.stack([np.ones_like(T) / T, miss / T], axis=1)
        (d_token, d_miss), *_ = np.linalg.lstsq(M, (T - base) / T, rcond=None)
        d_token, d_miss = _within_bounds(float(d_token), float(d_miss), T, base, miss, cache_engine, h)
    before = [-math.log(_predict(r, h, cache_engine) * r["tok_s"]) for r in runs]  # ln(predicted / measured)
    result = {"vram_factor": fv, "cpu_factor": fc, "fitted": fitted, "rejected": rejected,
              "token_s": d_token, "miss_s": d_miss, "engine": cache_engine, "hw": h, "runs": runs}
    fitted_file = machine_doc(result, "(in memory)")
    from moesim.costmodel.hardware import _parse

    h2 = _parse(fitted_file, Path(h.path or "fitted.toml"))
    after = [-math.log(_predict(r, h2) * r["tok_s"]) for r in runs]
    if cache_runs:
        result["fitted"] += ["token", "miss"]
    result.update(residuals_before=before, residuals_after=after)
    return result


def _implausible(name: str, inverse_factor: float, h) -> str:
    """Why a fitted inverse rate factor cannot be this machine's ('' if it can)."""
    if not (math.isfinite(inverse_factor) and inverse_factor > 0):
        return f"the fit gives a non-positive time per byte ({inverse_factor:.3g}); the rate is kept"
    if name == "cpu" and h.cpu_rate() / inverse_factor > h.ram.bandwidth:
        return "the fit gives a CPU expert rate above the RAM bandwidth; the rate is kept"
    return ""


def _within_bounds(d_token, d_miss, T, base, miss, e, h) -> tuple[float, float]:
    """Keep the fitted totals non-negative (a cost below zero has no physical reading): a term that would go below
    zero is held at zero and the other refitted alone."""
    tok0 = e.token_us * 1e-6
    miss0 = e.fetch_expert_us * 1e-6 if e.miss == "fetch" else h.cpu_latency
    if tok0 + d_token >= 0 and miss0 + d_miss >= 0:
        return d_token, d_miss
    if tok0 + d_token < 0:
        d_token = -tok0
        d_miss = max(-miss0, float(np.sum(miss / T * (T - base - d_token) / T) / np.sum((miss / T) ** 2)))
    else:
        d_miss = -miss0
        d_token = max(-tok0, float(np.sum((T - base - miss * d_miss) / T ** 2) / np.sum(1 / T ** 2)))
    return d_token, d_miss


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
    e = result.get("engine")
    if e is not None:
        table = dict(doc.get("engine", {}))
        table.pop("sources", None)
        src = dict(doc.get("engine", {}).get("sources", {}))
        table["profile"] = e.path if e.path and not _is_preset(e) else e.name
        table["token_us"] = round(e.token_us + result["token_s"] * 1e6, 3)
        src["token_us"] = f"{tag}: the fixed cost per decode step ({e.name} profile {e.token_us:g} us"
        src["token_us"] += f" {result['token_s'] * 1e6:+.1f} us)"
        if e.miss == "fetch":
            table["fetch_expert_us"] = round(e.fetch_expert_us + result["miss_s"] * 1e6, 3)
            src["fetch_expert_us"] = f"{tag}: the fixed cost per missed (fetched) expert"
        else:
            t = doc["cpu"]
            t["latency_us"] = round(h.cpu_latency * 1e6 + result["miss_s"] * 1e6, 3)
            t.setdefault("sources", {})["latency_us"] = (f"{tag}: the fixed cost per missed expert, which "
                                                         f"{e.name} computes on the CPU")
        table["sources"] = src
        doc["engine"] = table
    return doc


def _is_preset(e) -> bool:
    try:
        return load_engine(e.name).path == e.path
    except MoesimError:
        return False
