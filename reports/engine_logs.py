"""What an engine's expert cache actually did, read from its log: hits and misses overall, per window of
steps or per layer, and the cache configuration the engine printed.

Formats (docs/verify.md):

- ``llama.cpp``: the expert cache of ggml-org/llama.cpp PR #27861 (``--moe-expert-cache N``,
  ``--moe-expert-cache-inserts N``; ``src/llama-moecache.cpp``). At start it prints
  ``MoE expert cache enabled: <L> layers x <S> slots, <I> inserts/step, <X> MiB device memory``
  and every 512 decode steps (``LLAMA_LOG_DEBUG``, ``-lv 5``)
  ``moe-cache: steps=<N> hits=<H> misses=<M> hit-rate=<R>%``: hits and misses since the start,
  summed over the cached layers. Forks that print ``moe-cache: steps=<N> win_hit=..% (a/b)
  total_hit=..% (<H>/<H+M>) ...`` are read too.
- ``moe-l2``: the L2 cache statistics of moe-l2 0.14.1 (``moe_l2/cache.py`` ``L2Cache.stats()``): its
  ``/stats`` JSON (``hits``, ``misses``, ``hit_rate_pct``) or the ``moe-l2 stats`` text
  (``Hits:``, ``Misses:``, ``Hit rate:`` lines, ``moe_l2/cli.py`` ``cmd_stats``). Totals only.
- ``csv``: columns ``hits`` and ``misses`` (counts), optionally ``layer`` (the model's layer index)
  and ``step`` (0-based index of the replayed step the row counts); rows add up.
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from moesim.errors import MoesimError
from moesim.files import read_text

FORMATS = ("auto", "llama.cpp", "moe-l2", "csv")
LLAMA_STEPS = re.compile(r"moe-cache: steps=(\d+) hits=(\d+) misses=(\d+) hit-rate=([0-9.]+)%")
LLAMA_FORK = re.compile(r"moe-cache: steps=(\d+) win_hit=[0-9.]+% \(\d+/\d+\) total_hit=([0-9.]+)% \((\d+)/(\d+)\)")
LLAMA_INIT = re.compile(r"MoE expert cache enabled: (\d+) layers x (\d+) slots, (\d+) inserts/step, "
                        r"([0-9.]+) MiB device memory")
L2_TEXT = {"hits": re.compile(r"^\s*Hits:\s*([\d,]+)\s*$", re.M),
           "misses": re.compile(r"^\s*Misses:\s*([\d,]+)\s*$", re.M),
           "rate": re.compile(r"^\s*Hit rate:\s*([0-9.]+)%\s*$", re.M)}


@dataclass
class Realized:
    """An engine's counted cache behaviour. ``checkpoints``: (steps, hits, misses) since the start, when the
    log says them at several points; ``per_layer``: layer -> (hits, misses); ``per_step``: [(step, layer or
    None, hits, misses)] rows (CSV)."""

    format: str
    path: str
    hits: int
    misses: int
    steps: int | None = None
    checkpoints: list[tuple[int, int, int]] = field(default_factory=list)
    per_layer: dict[int, tuple[int, int]] | None = None
    per_step: list[tuple[int, int | None, int, int]] | None = None
    engine: dict = field(default_factory=dict)

    @property
    def requests(self) -> int:
        return self.hits + self.misses

    @property
    def hit_rate(self) -> float:
        return self.hits / self.requests if self.requests else float("nan")


def read_engine_log(path: str | Path, fmt: str = "auto") -> Realized:
    if fmt not in FORMATS:
        raise MoesimError(f"unknown engine log format {fmt!r} (expected one of {', '.join(FORMATS)})")
    text = read_text(path, "engine log")
    path = Path(path)
    if fmt == "auto":
        fmt = _detect(text, path)
    return {"llama.cpp": _llama, "moe-l2": _moe_l2, "csv": _csv}[fmt](text, path)


def _detect(text: str, path: Path) -> str:
    head = text.lstrip()[:4096]
    if "moe-cache: steps=" in text or "MoE expert cache enabled:" in text:
        return "llama.cpp"
    if head.startswith("{") or "moe-l2 cache statistics" in head or L2_TEXT["hits"].search(head):
        return "moe-l2"
    first = head.splitlines()[0].lower() if head else ""
    if "hits" in first and "misses" in first and "," in first:
        return "csv"
    raise MoesimError(f"{path}: not a log verify knows (no 'moe-cache: steps=' lines of llama.cpp's expert cache, "
                      "no moe-l2 cache statistics, no CSV header with hits,misses); name it with --log-format")


def _llama(text: str, path: Path) -> Realized:
    engine: dict = {}
    checkpoints: list[tuple[int, int, int]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        m = LLAMA_INIT.search(line)
        if m:
            layers, slots, inserts, mib = int(m.group(1)), int(m.group(2)), int(m.group(3)), float(m.group(4))
            new = {"cached_layers": layers, "slots": slots, "max_uploads": inserts, "device_mib": mib}
            if engine and engine != new:
                raise MoesimError(f"{path}: line {lineno}: a second cache ({layers} layers x {slots} slots) in one "
                                  "log: two runs? verify one run at a time")
            engine = new
            continue
        m = LLAMA_STEPS.search(line)
        if m:
            steps, hits, misses, rate = int(m.group(1)), int(m.group(2)), int(m.group(3)), float(m.group(4))
        else:
            m = LLAMA_FORK.search(line)
            if not m:
                if "moe-cache: steps=" in line:
                    raise MoesimError(f"{path}: line {lineno}: a moe-cache line verify cannot read "
                                      f"({line.strip()[:80]!r})")
                continue
            steps, rate, hits, total = int(m.group(1)), float(m.group(2)), int(m.group(3)), int(m.group(4))
            if total < hits:
                raise MoesimError(f"{path}: line {lineno}: {hits} hits of {total} requests")
            misses = total - hits
        if hits + misses and abs(100.0 * hits / (hits + misses) - rate) > 0.051:
            raise MoesimError(f"{path}: line {lineno}: hit-rate {rate}% is not hits/(hits+misses) = "
                              f"{100.0 * hits / (hits + misses):.2f}% (a damaged line?)")
        if checkpoints and (steps <= checkpoints[-1][0] or hits < checkpoints[-1][1] or misses < checkpoints[-1][2]):
            raise MoesimError(f"{path}: line {lineno}: steps={steps} hits={hits} after steps={checkpoints[-1][0]} "
                              f"hits={checkpoints[-1][1]}: the counters went back (two runs in one log? verify one run "
                              "at a time)")
        checkpoints.append((steps, hits, misses))
    if not checkpoints:
        why = (" (the cache was enabled but printed no 'moe-cache: steps=' line: they are debug lines, every 512 "
               "decode steps; run with -lv 5)") if engine else ""
        raise MoesimError(f"{path}: no 'moe-cache: steps=N hits=H misses=M' lines{why}")
    steps, hits, misses = checkpoints[-1]
    return Realized("llama.cpp", str(path), hits, misses, steps=steps, checkpoints=checkpoints, engine=engine)


def _moe_l2(text: str, path: Path) -> Realized:
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError):
            raise MoesimError(f"{path}: not valid JSON (moe-l2's /stats answer is one JSON object)") from None
        if not isinstance(doc, dict):
            raise MoesimError(f"{path}: expected moe-l2's /stats JSON object")
        if "error" in doc:
            raise MoesimError(f"{path}: moe-l2 answered an error: {str(doc['error'])[:80]}")
        hits, misses = doc.get("hits"), doc.get("misses")
        rate = doc.get("hit_rate_pct")
    else:
        got = {k: rx.search(text) for k, rx in L2_TEXT.items()}
        if got["hits"] is None or got["misses"] is None:
            raise MoesimError(f"{path}: no 'Hits:' and 'Misses:' lines (the output of 'moe-l2 stats')")
        hits, misses = (int(got[k].group(1).replace(",", "")) for k in ("hits", "misses"))  # type: ignore[union-attr]
        rate = float(got["rate"].group(1)) if got["rate"] else None
    for name, v in (("hits", hits), ("misses", misses)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise MoesimError(f"{path}: {name} must be a non-negative integer, got {v!r}")
    assert isinstance(hits, int) and isinstance(misses, int)
    if rate is not None and hits + misses and abs(100.0 * hits / (hits + misses) - float(rate)) > 0.051:
        raise MoesimError(f"{path}: hit rate {rate}% is not hits/(hits+misses) = {100.0 * hits / (hits + misses):.2f}%")
    return Realized("moe-l2", str(path), hits, misses)


def _csv(text: str, path: Path) -> Realized:
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows:
        raise MoesimError(f"{path}: no rows (expected a header with hits,misses and one row per count)")
    cols = {c.strip().lower(): c for c in rows[0].keys() if c is not None}
    missing = [c for c in ("hits", "misses") if c not in cols]
    if missing:
        raise MoesimError(f"{path}: no {' and no '.join(missing)} column (columns: {', '.join(cols)})")
    unknown = sorted(set(cols) - {"hits", "misses", "layer", "step"})
    if unknown:
        raise MoesimError(f"{path}: unknown column {unknown[0]!r} (expected hits, misses, layer, step)")
    parsed: list[tuple[int, int | None, int, int]] = []
    for i, row in enumerate(rows, 2):
        vals = {}
        for c in ("hits", "misses", "layer", "step"):
            if c not in cols:
                continue
            raw = (row.get(cols[c]) or "").strip()
            if not raw.isdigit():
                raise MoesimError(f"{path}: line {i}: {c} {raw!r} is not a non-negative integer")
            vals[c] = int(raw)
        parsed.append((vals.get("step", -1), vals.get("layer"), vals["hits"], vals["misses"]))
    hits = sum(r[2] for r in parsed)
    misses = sum(r[3] for r in parsed)
    per_layer: dict[int, tuple[int, int]] | None = None
    if "layer" in cols:
        per_layer = {}
        for _, layer, h, m in parsed:
            assert layer is not None
            a, b = per_layer.get(layer, (0, 0))
            per_layer[layer] = (a + h, b + m)
    per_step = parsed if "step" in cols else None
    steps = max(r[0] for r in parsed) + 1 if per_step else None
    return Realized("csv", str(path), hits, misses, steps=steps, per_layer=per_layer, per_step=per_step)


def windows(checkpoints: list[tuple[int, int, int]]) -> list[tuple[int, int, int, int]]:
    """(first step, end step, hits, misses) of each window between consecutive checkpoints."""
    out, prev = [], (0, 0, 0)
    for steps, hits, misses in checkpoints:
        out.append((prev[0], steps, hits - prev[1], misses - prev[2]))
        prev = (steps, hits, misses)
    return out


def as_array(per_step: list[tuple[int, int | None, int, int]], n_steps: int, layers: list[int] | None):
    """[steps, layers or 1, 2] hits and misses from CSV rows."""
    L = len(layers) if layers else 1
    out = np.zeros((n_steps, L, 2), np.int64)
    for step, layer, h, m in per_step:
        col = 0 if layer is None or not layers else layers.index(layer)
        out[step, col] += (h, m)
    return out
