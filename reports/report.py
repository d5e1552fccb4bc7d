"""Build a report directory: index.html (self-contained, offline), every chart as SVG, PNG and
Vega-Lite JSON, every table as Markdown, LaTeX and CSV, and report.json (what went in, what came out).

Two sources, either or both: sweep results (results.parquet and its results.layers.parquet, written
by ``moesim sweep``) and a trace (profile, gate weights, per-token replays of the named presets, the
hit-rate curve). The directory is built next to its destination and renamed into place, so a reader
sees the old report or the new one, never half of one."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moesim.errors import MoesimError
from moesim.files import atomic_dir, check_output

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


_NEED = {"row_key", "trace_digest", "group_key", "eviction", "miss", "admit", "budget", "hit_rate",
         "substitution_rate", "mass_per_step", "s_per_token", "preset", "policy"}


def _results_columns(path: Path) -> None:
    """Refuse a Parquet file that is not sweep results by its footer's columns, before reading it (a trace,
    say, whose columns polars may not decode)."""
    import pyarrow.parquet as pq

    try:
        names = set(pq.read_schema(path).names)
    except Exception:  # noqa: BLE001 - not Parquet, or damaged: reading it says what is wrong
        return
    missing = sorted(_NEED - names)
    if missing:
        raise MoesimError(f"{path}: not a moesim sweep results file (missing columns: {', '.join(missing)})")


def load_results(path, digest: str | None = None, baseline: str | None = None, routing=None) -> SweepData:
    """Read a sweep's results (and its .layers.parquet) and keep the rows of one trace and one
    machine pricing, with the columns the charts and tables use:
    size (fraction of experts, null for --slots sweeps), size_label, policy, preset (null if none),
    speedup, baseline, keeps_first_choice, pareto and the store's counters and rates. The speed-up,
    rank and Pareto flag are recomputed (sweeps/ranking.py) over ``baseline``: by default the one the
    sweep used. ``path`` may also be an object with ``rows`` and ``layers`` frames (a SweepOutcome of
    ``run_sweep`` without an output file). ``routing``: the trace, whose rows must agree with it."""
    import polars as pl

    from moesim.sweeps.store import LAYER_SCHEMA, checked_rows, layers_path

    if routing is not None:
        digest = routing.digest
    facts = {digest: (routing.meta.model_id, routing.n_experts, routing.n_tokens)} if routing is not None else None
    if hasattr(path, "rows") and hasattr(path, "layers"):
        rows, layers, path = path.rows, path.layers, Path("(in memory)")
    else:
        path = Path(path)
        if path.is_file():
            _results_columns(path)
        rows = _read_parquet(path, "results file", f"write one with moesim sweep TRACE -o {path.name}")
        lp = layers_path(path)
        layers = checked_rows(_read_parquet(lp, "per-layer results file"), lp, LAYER_SCHEMA) if lp.exists() else None
    missing = sorted(_NEED - set(rows.columns))
    if missing:
        raise MoesimError(f"{path}: not a moesim sweep results file (missing columns: {', '.join(missing)})")
    if rows.height == 0:
        raise MoesimError(f"{path}: holds no results")
    rows = _ranked(checked_rows(rows, path, traces=facts), baseline)
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
    # One machine/model/quantization per report: times of different machines do not share an axis. (Engine
    # profiles may differ within it: the llama.cpp preset is priced as llama.cpp runs.)
    machine = pl.concat_str([pl.col("model"), pl.col("quant"), pl.col("hw")], separator="/", ignore_nulls=True)
    rows = rows.with_columns(machine.alias("_machine"))
    costs = rows.group_by("_machine", maintain_order=True).len().sort("len", descending=True, maintain_order=True)
    if costs.height > 1:
        keep = costs["_machine"][0]
        dropped = sorted(set(rows.filter(pl.col("_machine") != keep)["priced_as"].to_list()))
        rows = rows.filter(pl.col("_machine") == keep)
        notes.append(f"the results also hold configs priced as {'; '.join(map(str, dropped))}; this report shows "
                     f"{rows['priced_as'][0]} only")
    rows = rows.drop("_machine").with_columns(
        pl.col("budget").alias("size"),
        pl.when(pl.col("budget").is_not_null())
        .then(pl.format("budget {}%", (100 * pl.col("budget")).round(4).cast(pl.Utf8).str.replace(r"\.0$", "")))
        .otherwise(pl.format("{} slots/layer", pl.col("slots_per_layer"))).alias("size_label"),
        pl.when(pl.col("preset").fill_null("") == "").then(None).otherwise(pl.col("preset")).alias("preset"),
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


def _read_parquet(path: Path, what: str, hint: str = ""):
    """A Parquet table moesim wrote (an input: no output may replace it); one line if it cannot be read."""
    from moesim.table_checks import read_parquet

    if not path.exists():
        raise MoesimError(f"{path}: no such {what}" + (f" ({hint})" if hint else ""))
    return read_parquet(path, what)


def _ranked(rows, baseline: str | None):
    """The sweep's derived columns recomputed (files of older versions lack some) over one baseline."""
    from moesim.sweeps.grid import DEFAULT_BASELINE
    from moesim.sweeps.ranking import annotate

    if baseline is None:
        from moesim.sweeps.grid import baseline_policy

        stored = [b for b in rows["baseline"].unique().to_list() if b]
        baseline = stored[0] if len(stored) == 1 else DEFAULT_BASELINE
        try:
            baseline_policy(baseline)
        except MoesimError:  # not one this version writes: the default
            baseline = DEFAULT_BASELINE
    ranked_by = rows["ranked_by"].drop_nulls()
    rank_by = "time" if ranked_by.len() and not ranked_by[0].startswith("1st-choice") else "class"
    return annotate(rows, baseline, rank_by)


def unfit_warnings(rows) -> list[str]:
    """One line per cache size whose cache does not fit in the machine's VRAM."""
    import polars as pl

    if "fits_in_vram" not in rows.columns:
        return []
    bad = rows.filter(pl.col("fits_in_vram").not_().fill_null(False)).unique("size_label", maintain_order=True)
    return [f"WARNING: at {r['size_label']} the cache needs {r['vram_gib_for_cache']:.1f} GiB of VRAM and {r['hw']} "
            f"has {r['vram_gib_free'] or 0:.1f} GiB free for experts: the times of that budget describe a machine "
            "that does not exist (choose a smaller budget or quantization)" for r in bad.iter_rows(named=True)]


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


def hit_rate_curve(routing, sizes: list[float], ci=None):
    """Fetch-all hit rate per eviction from ``moesim mrc``'s library: LRU at every size in one
    stack-distance pass, the other evictions replayed at mrc's default budgets plus ``sizes``.
    Returns (frame: eviction, size, hit_rate, method, and hit_rate_low/high with ``ci``; a sentence
    saying how it was computed)."""
    import polars as pl

    from moesim.simulator.config import slots_for_budget
    from moesim.sweeps.mrc import DEFAULT_BUDGETS as MRC_BUDGETS
    from moesim.sweeps.mrc import mrc

    # mrc's default sizes that hold at least one slot of this trace's experts, and the report's own
    grid = sorted({b for b in MRC_BUDGETS if slots_for_budget(b, routing.n_experts) >= 1} | {float(b) for b in sizes})
    curve, _ = mrc(routing, allocations=["per-layer"], budgets=grid, ci=ci)
    top = max(grid) + 1e-9
    # LRU comes at every size up to E: cut it where the replayed curves end, so all share the x range
    bounds = ["hit_rate_low", "hit_rate_high"] if ci is not None else []
    curve = curve.filter(pl.col("budget") <= top).select(
        "eviction", pl.col("budget").alias("size"), "hit_rate", "method", *bounds)
    source = "moesim mrc: LRU by stack distances at every size, the others replayed at the marked points"
    if ci is not None and curve["hit_rate_low"].is_not_null().any():
        source += f"; {ci.level:g}% intervals"
    return curve, source


def build_report(out: str | os.PathLike, *, results=None,
                 trace: str | os.PathLike | None = None, budgets: list[float] | None = None,
                 title: str | None = None, progress=None, baseline: str | None = None,
                 quality=None, ci=None) -> dict:
    """Write a report directory at ``out`` from sweep ``results`` (a results.parquet, or a SweepOutcome)
    and/or a ``trace``; returns the manifest. Sweep rows with intervals (``--ci``) show them in the
    tables and as error bars; ``ci`` (a simulator.bootstrap.CI) adds them to what the report computes
    from the trace (hit-rate curve, routing profile).

    With results but no trace, the trace the sweep recorded is used when it still exists (and has the
    same digest); otherwise the trace-based charts are left out with a note."""
    t0 = time.perf_counter()
    if results is None and trace is None and quality is None:
        raise MoesimError("give sweep results, a trace, quality results, or any of them")
    from moesim.sweeps.store import layers_path

    out = Path(out)
    inputs = [trace, quality] + ([results, layers_path(results)] if isinstance(results, (str, os.PathLike)) else [])
    check_destination(out, inputs)
    say = progress or (lambda msg: None)
    notes: list[str] = []

    routing = None
    if trace is not None:
        from moesim.traces import load_routing

        routing = load_routing(trace)
    sweep = None
    if results is not None:
        sweep = load_results(results, baseline=baseline, routing=routing)
        notes += sweep.notes
        if routing is None:
            routing = _recorded_trace(sweep, notes)
    synthetic = bool((routing is not None and routing.synthetic) or (sweep is not None and sweep.synthetic))
    qual = _load_quality(quality) if quality is not None else None
    model = routing.meta.model_id if routing is not None else (sweep.model if sweep is not None else
                                                               qual["model_id"][0] if qual is not None else "")
    if qual is not None and (routing is not None or sweep is not None) and model not in set(qual["model_id"]):
        notes.append(f"the quality results are of {', '.join(sorted(set(qual['model_id'])))}, not of {model}: their "
                     "chart stands apart from the sweep's")
    if budgets is None:
        budgets = _budget_sizes(sweep, routing)
    budgets = sorted({float(b) for b in budgets})

    # built in a temporary directory beside ``out`` (a killed run's is removed by the next one), renamed into place
    with atomic_dir(out, inputs=inputs) as tmp:
        (tmp / "charts").mkdir(parents=True)
        (tmp / "tables").mkdir()
        figures, tables = _make_figures_and_tables(sweep, routing, budgets, synthetic, notes, say, ci)
        if qual is not None:
            figures += _quality_figures(qual, notes)
        manifest = _write(tmp, out, figures, tables, sweep=sweep, routing=routing, model=model,
                          synthetic=synthetic, notes=notes, title=title, say=say)
        manifest["seconds"] = round(time.perf_counter() - t0, 2)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _load_quality(path):
    from moesim.emulator.quality import read_quality

    return read_quality(path)


def _quality_figures(quality, notes: list[str]) -> list:
    """dppl against substituted mass and KL against moved mass per policy class, one pair of charts per model
    in the quality results (the KL chart where KL was measured)."""
    import polars as pl

    from moesim.emulator.quality import class_stats, moved_mass, size_label
    from moesim.reports.charts_quality import mass_dppl_chart, mass_kl_chart

    figs: list = []
    for i, model in enumerate(quality["model_id"].unique(maintain_order=True).to_list()):
        part = quality.filter(pl.col("model_id") == model)
        stats = class_stats(part)
        fig = mass_dppl_chart(part, stats, model=model)
        if i:
            fig.name = f"{fig.name}_{i}"
        figs.append(fig)
        if part["kl"].drop_nulls().len():   # quality files written before KL was measured have none
            moved, what = moved_mass(part)
            kst = class_stats(moved, "moved_per_step", "kl")
            fig = mass_kl_chart(moved, kst, model=model, moved=what)
            if i:
                fig.name = f"{fig.name}_{i}"
            figs.append(fig)
            notes.append(f"{model}: KL vs {what} mass, Pearson r {kst[True]['r']:.3f} (n={kst[True]['n']}) among "
                         f"policies that always fetch the first choice, {kst[False]['r']:.3f} (n={kst[False]['n']}) "
                         "among those that may substitute it")
        notes.append(f"{model}: dppl vs mass, Pearson r {stats[True]['r']:.3f} (n={stats[True]['n']}) among policies "
                     f"that always fetch the first choice, {stats[False]['r']:.3f} (n={stats[False]['n']}) among "
                     "those that may substitute it")
        sizes = part.select("budget", "slots").unique(maintain_order=True)
        if sizes.height > 1:
            for b, sl in sizes.iter_rows():
                one = part.filter(pl.col("budget") == b) if b is not None else part.filter(pl.col("slots") == sl)
                st = class_stats(one)
                notes.append(f"{model} at {size_label(b, sl)}: r {st[True]['r']:.3f} (n={st[True]['n']}) fetching the "
                             f"first choice, {st[False]['r']:.3f} (n={st[False]['n']}) substituting it")
    return figs


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


def _make_figures_and_tables(sweep, routing, budgets, synthetic, notes, say, ci=None):
    import polars as pl

    from moesim.reports import charts_sweep as cs
    from moesim.reports import charts_trace as ct
    from moesim.reports import paper_tables as pt

    figures, tables = [], []
    if sweep is not None:
        rows = sweep.rows
        say("charts from the sweep")
        if routing is not None:
            curve, source = hit_rate_curve(routing, budgets, ci)
        else:
            curve = rows.filter((pl.col("miss") == "fetch-all") & pl.col("admit").is_null() & (pl.col("batch") == 1)
                                & pl.col("budget").is_not_null() & (pl.col("allocation") == "per-layer")
                                & (pl.col("prefetch").fill_null("none") == "none")) \
                .select("eviction", "size", "hit_rate", "hit_rate_low", "hit_rate_high") \
                .unique(["eviction", "size"]).sort("eviction", "size")
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
        notes += unfit_warnings(rows)
    if routing is not None:
        from moesim.reports.profile import profile

        say("profile and per-token replays of the trace")
        if sweep is None:
            curve, source = hit_rate_curve(routing, budgets, ci)
            figures.append(cs.hit_rate_curve_chart(curve, synthetic=synthetic, source=source, marks=budgets))
        focus = _focus(budgets) or FOCUS_SIZE
        window = ct.rolling_window(routing.n_tokens)
        series = _preset_series(routing, focus, window)
        figures.append(ct.rolling_chart(series, ct.domain_segments(routing), synthetic=synthetic, window=window,
                                        budget_note=f"budget {100 * focus:g}%"))
        prof = profile(routing, ci=ci)
        if len(prof["domain_similarity"]["domains"]) > 1:
            figures.append(ct.similarity_chart(prof["domain_similarity"], synthetic=synthetic))
        else:
            notes.append("the trace has fewer than two domains: no expert-overlap chart")
        figures.append(ct.gate_chart(routing.w, synthetic=synthetic))
        hit_intervals: dict = {}
        hits = _baselines(sweep, routing, budgets, ci, hit_intervals)
        tables.insert(0, pt.routing_profile_table(prof, hits, hit_intervals if ci is not None else None))
    return figures, tables


def _baselines(sweep, routing, budgets, ci=None, intervals: dict | None = None):
    """LRU/LFU/static/Belady fetch-all hit rates per budget: the sweep's rows where it has them (with
    ``ci``: where they have intervals too). Their intervals go into ``intervals``."""
    import polars as pl

    from moesim.reports.paper_tables import BASELINE_EVICTIONS, baseline_hit_rates

    out = {}
    missing = []
    for b in budgets:
        got, bounds = {}, {}
        if sweep is not None:
            r = sweep.rows.filter((pl.col("budget") == b) & (pl.col("miss") == "fetch-all") & pl.col("admit").is_null()
                                  & (pl.col("batch") == 1) & (pl.col("allocation") == "per-layer")
                                  & ~pl.col("warm") & (pl.col("warmup_tokens") == 0)
                                  & (pl.col("prefetch").fill_null("none") == "none")
                                  & (pl.col("reroute").fill_null("none") == "none")
                                  & pl.col("eviction").is_in(list(BASELINE_EVICTIONS)))
            got = dict(zip(r["eviction"].to_list(), r["hit_rate"].to_list()))
            bounds = {e: (lo, hi) for e, lo, hi in r.select("eviction", "hit_rate_low", "hit_rate_high").rows()
                      if lo is not None and hi is not None}
        if set(got) >= set(BASELINE_EVICTIONS) and (ci is None or set(bounds) >= set(BASELINE_EVICTIONS)):
            out[b] = got
            if intervals is not None:
                intervals[b] = bounds
        else:
            missing.append(b)
    out.update(baseline_hit_rates(routing, missing, ci, intervals))
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
        choice = sorted({q for q in sweep.rows["quant_choice"].to_list() if q}) if sweep.priced_as else []
        if choice:
            meta_rows.append(("quantization", "; ".join(choice)))
        baselines = sorted({b for b in sweep.rows["baseline"].to_list() if b})
        if baselines:
            meta_rows.append(("speed-up over", ", ".join(baselines)))
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


def check_destination(out: str | os.PathLike, inputs=()) -> None:
    """An existing ``out`` is replaced whole: only when it holds an earlier report and nothing else (every
    file in it named by its report.json), so no file the report did not write is deleted."""
    out = check_output(out, inputs, directory=True)
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not (out / MANIFEST).is_file():
        raise MoesimError(f"{out}: exists and is not a moesim report (no {MANIFEST}); pick another -o or remove it")
    foreign = sorted(set(_files_in(out)) - _named_by_manifest(out))
    if foreign:
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        raise MoesimError(f"{out}: holds files the earlier report did not write ({', '.join(foreign[:3])}{more}); "
                          "refusing to replace the directory: move them away or pick another -o")


def _files_in(directory: Path) -> list[str]:
    return [os.path.relpath(os.path.join(d, f), directory) for d, _, names in os.walk(directory) for f in names]


def _named_by_manifest(out: Path) -> set[str]:
    """The files an earlier report's report.json says it wrote (empty if it cannot be read)."""
    try:  # not through files.read_text: that would count the manifest among the inputs, which out then holds
        files = json.loads((out / MANIFEST).read_text(encoding="utf-8"))["files"]
        named = {MANIFEST, str(files["html"])}
        for group in ("charts", "tables"):
            named |= {os.path.normpath(str(f)) for entry in files[group].values() for f in entry.values()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return {MANIFEST}
    return named


__all__ = ["build_report", "check_destination", "load_results", "hit_rate_curve", "SweepData", "MANIFEST"]
