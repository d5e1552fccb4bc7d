"""Build a report directory: index.html (self-contained, offline), every chart as SVG, PNG and
Vega-Lite JSON, every table as Markdown, LaTeX and CSV, and report.json (what went in, what came out).

Two sources, either or both: sweep results (results.parquet and its results.layers.parquet, written
by ``moesim sweep``) and a trace (profile, gate weights, per-token replays of the named presets, the
hit-rate curve). The directory is built next to its destination and renamed into place, so a reader
sees the old report or the new one, never half of one."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moesim.errors import MoesimError

MANIFEST = "report.json"
FOCUS_SIZE = 0.25  # the per-token series replay the presets at the sweep's budget nearest 25% (the papers' ~25%)
DEFAULT_BUDGETS = (0.125, 0.25, 0.5)


@dataclass
class SweepData:
    rows: Any             # polars: one row per config (normalized, see load_results)
    layers: Any           # polars: one row per config x layer (row_key, layer, hit_rate, ...)
    path: Path
    trace: str | None     # the trace path the sweep recorded
    digest: str
    model: str
    synthetic: bool
    priced_as: str | None
    notes: list[str] = field(default_factory=list)


def _presets() -> dict[str, dict]:
    from moesim.sweeps.grid import PRESETS

    return PRESETS


def load_results(path, digest: str | None = None) -> SweepData:
    """Read a sweep's results (and its .layers.parquet) and keep the rows of one trace and one
    machine pricing, with the columns the charts and tables use:
    size (fraction of experts, null for --slots sweeps), size_label, policy, preset (null if none),
    speedup, pareto and the store's counters and rates. ``path`` may also be an object with
    ``rows`` and ``layers`` frames (a SweepOutcome of ``run_sweep`` without an output file)."""
    import polars as pl

    from moesim.sweeps.store import layers_path

    if hasattr(path, "rows") and hasattr(path, "layers"):
        rows, layers, path = path.rows, path.layers, Path("(in memory)")
    else:
        path = Path(path)
        if not path.is_file():
            raise MoesimError(f"{path}: no such results file (write one with moesim sweep TRACE -o {path.name})")
        try:
            rows = pl.read_parquet(path)
        except Exception as exc:
            raise MoesimError(f"{path}: not a readable Parquet file ({exc})") from None
        lp = layers_path(path)
        layers = pl.read_parquet(lp) if lp.is_file() else None
    need = {"row_key", "trace_digest", "eviction", "miss", "admit", "budget", "hit_rate", "substitution_rate",
            "mass_per_step", "s_per_token", "speedup_vs_fetch_all", "pareto", "preset", "policy"}
    missing = sorted(need - set(rows.columns))
    if missing:
        raise MoesimError(f"{path}: not a moesim sweep results file (missing columns: {', '.join(missing)})")
    if rows.height == 0:
        raise MoesimError(f"{path}: holds no results")
    notes = []
    digests = rows["trace_digest"].unique(maintain_order=True).to_list()
    if digest is not None:
        if digest not in digests:
            raise MoesimError(f"{path}: has no results for this trace (digest {digest[:12]}); it holds "
                              f"{', '.join(d[:12] for d in digests)}")
        rows = rows.filter(pl.col("trace_digest") == digest)
    elif len(digests) > 1:
        names = rows.unique("trace_digest", maintain_order=True)["trace"].to_list()
        raise MoesimError(f"{path}: holds results of {len(digests)} traces ({', '.join(map(str, names))}); "
                          "pick one with --trace")
    digest = rows["trace_digest"][0]
    # One machine/model/quantization per report: times of different machines do not share an axis.
    costs = rows.group_by("cost_key", maintain_order=True).len().sort("len", descending=True, maintain_order=True)
    if costs.height > 1:
        keep = costs["cost_key"][0]
        dropped = sorted(set(rows.filter(pl.col("cost_key") != keep)["priced_as"].to_list()))
        rows = rows.filter(pl.col("cost_key") == keep)
        notes.append(f"the results also hold configs priced as {'; '.join(map(str, dropped))}; this report shows "
                     f"{rows['priced_as'][0]} only")
    rows = rows.with_columns(
        pl.col("budget").alias("size"),
        pl.when(pl.col("budget").is_not_null())
        .then(pl.format("budget {}%", (100 * pl.col("budget")).round(4).cast(pl.Utf8).str.replace(r"\.0$", "")))
        .otherwise(pl.format("{} slots/layer", pl.col("slots_per_layer"))).alias("size_label"),
        pl.when(pl.col("preset").fill_null("") == "").then(None).otherwise(pl.col("preset")).alias("preset"),
        pl.col("speedup_vs_fetch_all").alias("speedup"),
        # the sweep's policy label leaves out allocation and batch; rows of different groups must not look alike
        (pl.col("policy")
         + pl.when(pl.col("allocation") == "global").then(pl.lit(" / global")).otherwise(pl.lit(""))
         + pl.when(pl.col("batch") > 1).then(pl.format(" / batch {}", pl.col("batch"))).otherwise(pl.lit("")))
        .alias("policy"),
        pl.col("pareto").fill_null(False),
    )
    if rows["size"].is_null().any():
        # --slots sweeps: order and label by slots; the fraction needs E, which only the trace knows
        rows = rows.with_columns(pl.coalesce("size", pl.col("slots_per_layer").cast(pl.Float64)).alias("size"))
    if layers is not None:
        layers = layers.filter(pl.col("row_key").is_in(rows["row_key"].to_list()))
    else:
        notes.append(f"{layers_path(path).name} not found: no per-layer chart")
    priced = bool(rows["priced"].all()) if "priced" in rows.columns else rows["s_per_token"].is_not_null().all()
    trace = rows["trace"][0] if "trace" in rows.columns else None
    return SweepData(rows=rows, layers=layers, path=path, trace=trace, digest=digest,
                     model=str(rows["model_id"][0]) if "model_id" in rows.columns else "?",
                     synthetic=bool(rows["synthetic"].any()) if "synthetic" in rows.columns else False,
                     priced_as=str(rows["priced_as"][0]) if priced else None, notes=notes)


def _budget_sizes(sweep: SweepData | None, routing) -> list[float]:
    """The sweep's budgets; for a --slots sweep, its slots as fractions of the trace's experts."""
    if sweep is None:
        return list(DEFAULT_BUDGETS)
    rows = sweep.rows
    sizes = rows.filter(rows["budget"].is_not_null())["budget"].unique().sort().to_list()
    if not sizes and routing is not None:
        sizes = sorted({s / routing.n_experts for s in rows["slots_per_layer"].unique().to_list()})
    return sizes


def _focus(sizes: list[float]) -> float | None:
    return min(sizes, key=lambda s: (abs(s - FOCUS_SIZE), s)) if sizes else None


def _preset_series(routing, budget: float, window: int):
    import polars as pl

    from moesim.reports.charts_trace import token_series
    from moesim.simulator import SimConfig, simulate

    frames = []
    for name, p in _presets().items():
        cfg = SimConfig(eviction=p["eviction"], miss=p["miss"], admit=p["admit"], budget=budget)
        frames.append(token_series(simulate(routing, cfg), name, window))
    return pl.concat(frames)


def hit_rate_curve(routing, sizes: list[float]):
    """Fetch-all hit rate per eviction from ``moesim mrc``'s library: LRU at every size in one
    stack-distance pass, the other evictions replayed at mrc's default budgets plus ``sizes``.
    Returns (frame: eviction, size, hit_rate, method; a sentence saying how it was computed)."""
    import polars as pl

    from moesim.sweeps.mrc import DEFAULT_BUDGETS as MRC_BUDGETS
    from moesim.sweeps.mrc import mrc

    grid = sorted(set(MRC_BUDGETS) | {float(b) for b in sizes})
    curve, _ = mrc(routing, allocations=["per-layer"], budgets=grid)
    top = max(grid) + 1e-9
    # LRU comes at every size up to E: cut it where the replayed curves end, so all share the x range
    curve = curve.filter(pl.col("budget") <= top).select(
        "eviction", pl.col("budget").alias("size"), "hit_rate", "method")
    return curve, "moesim mrc: LRU by stack distances at every size, the others replayed at the marked points"


def build_report(out: str | os.PathLike, *, results=None,
                 trace: str | os.PathLike | None = None, budgets: list[float] | None = None,
                 title: str | None = None, progress=None) -> dict:
    """Write a report directory at ``out`` from sweep ``results`` (a results.parquet, or a SweepOutcome)
    and/or a ``trace``; returns the manifest.

    With results but no trace, the trace the sweep recorded is used when it still exists (and has the
    same digest); otherwise the trace-based charts are left out with a note."""
    t0 = time.perf_counter()
    if results is None and trace is None:
        raise MoesimError("give sweep results, a trace, or both")
    out = Path(out)
    _check_destination(out)
    say = progress or (lambda msg: None)
    notes: list[str] = []

    routing = None
    if trace is not None:
        from moesim.traces import load_routing

        routing = load_routing(trace)
    sweep = None
    if results is not None:
        sweep = load_results(results, digest=routing.digest if routing is not None else None)
        notes += sweep.notes
        if routing is None:
            routing = _recorded_trace(sweep, notes)
    synthetic = bool((routing is not None and routing.synthetic) or (sweep is not None and sweep.synthetic))
    model = routing.meta.model_id if routing is not None else (sweep.model if sweep is not None else "")
    if budgets is None:
        budgets = _budget_sizes(sweep, routing)
    budgets = sorted({float(b) for b in budgets})

    tmp = out.with_name(f".{out.name}.{os.getpid()}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        (tmp / "charts").mkdir(parents=True)
        (tmp / "tables").mkdir()
        figures, tables = _make_figures_and_tables(sweep, routing, budgets, synthetic, notes, say)
        manifest = _write(tmp, out, figures, tables, sweep=sweep, routing=routing, model=model,
                          synthetic=synthetic, notes=notes, title=title, say=say)
        manifest["seconds"] = round(time.perf_counter() - t0, 2)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        _publish(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def _recorded_trace(sweep: SweepData, notes: list[str]):
    from moesim.traces import load_routing

    # the sweep records the path as given; it may be relative to where the sweep ran, often next to the results
    candidates = [Path(sweep.trace), sweep.path.parent / sweep.trace] if sweep.trace else []
    found = next((p for p in candidates if p.is_file()), None)
    if found is None:
        notes.append(f"the sweep's trace ({sweep.trace}) was not found: no trace-based charts (pass --trace)")
        return None
    r = load_routing(found)
    if r.digest != sweep.digest:
        notes.append(f"{sweep.trace} changed since the sweep (digest differs): no trace-based charts")
        return None
    return r


def _make_figures_and_tables(sweep, routing, budgets, synthetic, notes, say):
    import polars as pl

    from moesim.reports import charts_sweep as cs
    from moesim.reports import charts_trace as ct
    from moesim.reports import paper_tables as pt

    figures, tables = [], []
    if sweep is not None:
        rows = sweep.rows
        say("charts from the sweep")
        if routing is not None:
            curve, source = hit_rate_curve(routing, budgets)
        else:
            curve = rows.filter((pl.col("miss") == "fetch-all") & pl.col("admit").is_null() & (pl.col("batch") == 1)
                                & pl.col("budget").is_not_null() & (pl.col("allocation") == "per-layer")) \
                .select("eviction", "size", "hit_rate").unique(["eviction", "size"]).sort("eviction", "size")
            source = "the sweep's fetch-all rows"
        if curve.height:
            figures.append(cs.hit_rate_curve_chart(curve, synthetic=synthetic, source=source, marks=budgets))
        if sweep.priced_as is not None:
            figures.append(cs.pareto_chart(rows, synthetic=synthetic, priced_as=sweep.priced_as))
            figures.append(cs.speedup_chart(rows, synthetic=synthetic, priced_as=sweep.priced_as))
        else:
            why = str(rows["priced_as"][0]) if "priced_as" in rows.columns else "no model preset for the trace"
            notes.append(f"the sweep is not priced ({why}): no time or speed-up charts")
        if sweep.layers is not None:
            figures.append(cs.layer_heatmap(rows, sweep.layers, synthetic=synthetic))
        tables.append(pt.policy_table(rows, model=sweep.model, synthetic=synthetic, priced_as=sweep.priced_as))
    if routing is not None:
        from moesim.reports.profile import profile

        say("profile and per-token replays of the trace")
        if sweep is None:
            curve, source = hit_rate_curve(routing, budgets)
            figures.append(cs.hit_rate_curve_chart(curve, synthetic=synthetic, source=source, marks=budgets))
        focus = _focus(budgets) or FOCUS_SIZE
        window = ct.rolling_window(routing.n_tokens)
        series = _preset_series(routing, focus, window)
        figures.append(ct.rolling_chart(series, ct.domain_segments(routing), synthetic=synthetic, window=window,
                                        budget_note=f"budget {100 * focus:g}%"))
        prof = profile(routing)
        if len(prof["domain_similarity"]["domains"]) > 1:
            figures.append(ct.similarity_chart(prof["domain_similarity"], synthetic=synthetic))
        else:
            notes.append("the trace has fewer than two domains: no expert-overlap chart")
        figures.append(ct.gate_chart(routing.w, synthetic=synthetic))
        tables.insert(0, pt.routing_profile_table(prof, _baselines(sweep, routing, budgets)))
    return figures, tables


def _baselines(sweep, routing, budgets):
    """LRU/LFU/static/Belady fetch-all hit rates per budget: the sweep's rows where it has them."""
    import polars as pl

    from moesim.reports.paper_tables import BASELINE_EVICTIONS, baseline_hit_rates

    out = {}
    missing = []
    for b in budgets:
        got = {}
        if sweep is not None:
            r = sweep.rows.filter((pl.col("budget") == b) & (pl.col("miss") == "fetch-all") & pl.col("admit").is_null()
                                  & (pl.col("batch") == 1) & (pl.col("allocation") == "per-layer")
                                  & ~pl.col("warm") & (pl.col("warmup_tokens") == 0)
                                  & pl.col("eviction").is_in(list(BASELINE_EVICTIONS)))
            got = dict(zip(r["eviction"].to_list(), r["hit_rate"].to_list()))
        if set(got) >= set(BASELINE_EVICTIONS):
            out[b] = got
        else:
            missing.append(b)
    out.update(baseline_hit_rates(routing, missing))
    return out


def _write(tmp: Path, out: Path, figures, tables, *, sweep, routing, model, synthetic, notes, title, say) -> dict:
    from moesim import __version__
    from moesim.reports.charts import export, vl_version
    from moesim.reports.html import render_page

    say(f"exporting {len(figures)} charts (SVG, PNG)")
    fig_docs: list[dict] = []
    files: dict[str, dict[str, dict[str, str]]] = {"charts": {}, "tables": {}}
    for fig in figures:
        paths = export(fig, tmp / "charts")
        rel = {k: str(p.relative_to(tmp)) for k, p in paths.items()}
        files["charts"][fig.name] = rel
        fig_docs.append({"title": fig.name, "caption": fig.caption, "notes": fig.notes, "spec": fig.spec(),
                         "files": {"PNG": rel["png"], "SVG": rel["svg"], "Vega-Lite": rel["spec"]}})
    tab_docs = []
    for t in tables:
        tab_paths = {k: str(p.relative_to(tmp)) for k, p in t.write(tmp / "tables").items()}
        files["tables"][t.name] = tab_paths
        tab_docs.append({"title": t.title, "caption": t.caption, "table": t.table(), "files": tab_paths})
    meta_rows = [("model", model), ("data", "SYNTHETIC trace (generated, not recorded from the model)"
                                    if synthetic else "real (recorded routing)")]
    if routing is not None:
        meta_rows += [("trace", str(routing.path)),
                      ("tokens", f"{routing.n_tokens:,} in {routing.n_sequences} sequence(s), "
                                 f"{routing.n_layers} MoE layers x {routing.n_experts} experts, top-{routing.top_k}")]
    if sweep is not None:
        meta_rows += [("sweep results", str(sweep.path)), ("configs", f"{sweep.rows.height:,}"),
                      ("priced as", sweep.priced_as or "not priced")]
    meta_rows.append(("generated by", f"moesim {__version__}"))
    page_title = title or (f"moesim report: {model}" + (" (synthetic trace)" if synthetic else ""))
    banner = ("Synthetic trace: the routing was generated by moesim synth to mimic published statistics; it was "
              "not recorded from the model. Do not cite these numbers as measurements.") if synthetic else None
    say("writing index.html")
    html = render_page(title=page_title, meta_rows=meta_rows, banner=banner, figures=fig_docs, tables=tab_docs,
                       notes=notes, vl_version=vl_version())
    (tmp / "index.html").write_text(html)
    return {"moesim_report": 1, "title": page_title, "model": model, "synthetic": synthetic,
            "results": str(sweep.path) if sweep is not None else None,
            "trace": str(routing.path) if routing is not None else None,
            "notes": notes, "files": {"html": "index.html", **files}}


def _check_destination(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise MoesimError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise MoesimError(f"{out}: exists and is not a moesim report (no {MANIFEST}); pick another -o or remove it")


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        at_fdcwd, rename_exchange = -100, 2
        return libc.renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0
    except (OSError, AttributeError):
        return False


def _publish(tmp: Path, out: Path) -> None:
    """Move the finished directory into place. Replacing an old report is one atomic exchange on
    Linux; elsewhere two renames, with a moment in which ``out`` does not exist."""
    if not out.exists():
        os.rename(tmp, out)
        return
    if _exchange(tmp, out):
        shutil.rmtree(tmp, ignore_errors=True)  # now the old report
        return
    old = out.with_name(f".{out.name}.{os.getpid()}.old")
    shutil.rmtree(old, ignore_errors=True)
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except OSError:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


__all__ = ["build_report", "load_results", "hit_rate_curve", "SweepData", "MANIFEST"]
