"""The two tables papers on expert offloading print, as Markdown, LaTeX and CSV:

- the routing profile: reuse at the next token vs chance, the 95% working set, and the fetch-all
  hit rate of LRU, LFU, static pinning and Belady at each budget;
- the policy table: per named preset and Pareto-optimal config, hit rate, substituted share,
  substituted gate mass, time per token, speed-up over fetch-all and an empty ΔPPL column for the
  user's own perplexity measurement.

CSV cells keep full precision; Markdown, LaTeX and HTML show the same rounded cells, rendered by
reports/tables.py (the sweep's paper tables), so every moesim table looks alike."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

BASELINE_EVICTIONS = ("lru", "lfu", "static", "belady")
WRAP = {"policy": "2.3cm", "preset": "1.35cm"}  # LaTeX: these cells wrap, so the table fits a column
HIT_COLUMNS = {"lru": "LRU (%)", "lfu": "LFU (%)", "static": "static (%)", "belady": "Belady (%)"}
PPL_COLUMN = "ΔPPL (%)"

@dataclass
class PaperTable:
    """A table as raw values (``frame``, written as CSV at full precision) and as the rounded cells the
    Markdown, LaTeX and HTML show (rendered by reports/tables.py, like the sweep's ranked tables)."""

    name: str                      # file stem
    title: str
    caption: str
    frame: object                  # polars DataFrame, raw values
    formats: dict = field(default_factory=dict)  # column -> format spec for the rounded cells, e.g. ".1f"
    # column -> (low column, high column) of its confidence interval: the CSV keeps all three, the
    # rounded cells show "value±half-width" in the column itself
    intervals: dict = field(default_factory=dict)

    def table(self):
        from moesim.reports.tables import Column, Table, latex_escape, with_interval

        bounds = {c for pair in self.intervals.values() for c in pair}
        shown = [c for c in self.frame.columns if c not in bounds]
        cols = [Column(c, c, align="r" if (self.frame[c].dtype.is_numeric() or c == PPL_COLUMN) else "l",
                       latex=_latex_header(c, latex_escape), wrap=WRAP.get(c)) for c in shown]

        def text(row, c):
            value = cell_text(row[c], self.formats.get(c))
            if c not in self.intervals:
                return value
            lo, hi = (row[x] for x in self.intervals[c])
            return with_interval(value, lambda v: cell_text(float(v), self.formats.get(c)), lo, hi)

        cells = [[text(row, c) for c in shown] for row in self.frame.iter_rows(named=True)]
        return Table(self.title, cols, cells, self.caption)

    def markdown(self) -> str:
        from moesim.reports.tables import to_markdown

        return to_markdown(self.table())

    def latex(self) -> str:
        from moesim.reports.tables import to_latex

        return to_latex(self.table(), label=f"tab:moesim-{self.name.replace('_', '-')}")

    def write(self, directory: Path) -> dict[str, Path]:
        from moesim.files import write_table, write_text

        return {
            "Markdown": write_text(self.markdown() + "\n", directory / f"{self.name}.md"),
            "LaTeX": write_text(self.latex() + "\n", directory / f"{self.name}.tex"),
            "CSV": write_table(self.frame, directory / f"{self.name}.csv"),
        }


_LATEX_SYMBOLS = {"Δ": r"$\Delta$", "×": r"$\times$"}
# two-line LaTeX headers (a newline breaks the line), so narrow numeric columns stay narrow
_LATEX_HEADS = {"mass/step": "mass\nper step", "ms/token": "ms per\ntoken", "1st choice": "1st\nchoice",
                "reuse next": "reuse\nnext", "reuse chance": "reuse\nchance"}


def _latex_header(header: str, escape) -> str | None:
    if header in _LATEX_HEADS:
        return _LATEX_HEADS[header]
    if not any(ch in header for ch in _LATEX_SYMBOLS):
        return None
    return "".join(_LATEX_SYMBOLS.get(ch) or escape(ch) for ch in header)


def cell_text(value, fmt: str | None = None) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if not math.isfinite(value):
            return "-"
        return format(value, fmt) if fmt else f"{value:.4g}"
    if fmt and isinstance(value, int) and not isinstance(value, bool):
        return format(value, fmt)
    return str(value)


def baseline_hit_rates(routing, budgets, ci=None, intervals: dict | None = None) -> dict[float, dict[str, float]]:
    """Fetch-all hit rate of LRU, LFU, static and Belady at each budget (cold start, per-layer caches):
    the profile's Table 3 (reports/profile.py cache_hit_rates) at every budget. With ``ci``, their
    intervals go into ``intervals`` (budget -> eviction -> (low, high))."""
    from moesim.reports.profile import cache_hit_rates

    out = {}
    for b in budgets:
        found = cache_hit_rates(routing, budget=float(b), evictions=BASELINE_EVICTIONS, ci=ci)
        out[float(b)] = found["hit_rate"]
        if intervals is not None and ci is not None:
            intervals[float(b)] = found["hit_rate_interval"]
    return out


def _bounds(name: str) -> tuple[str, str]:
    return f"{name} low", f"{name} high"


def ci_sentence(level: float, units: str, resamples: int, method: str | None = None) -> str:
    from moesim.simulator.bootstrap import method_note

    return (f"Value±half of its {level:g}% confidence interval (the CSV has both bounds): a percentile bootstrap over "
            f"{units}, {resamples} resamples; {method_note(method)}.")


def routing_profile_table(prof: dict, hit_rates: dict[float, dict[str, float]],
                          hit_intervals: dict[float, dict[str, tuple | None]] | None = None) -> PaperTable:
    """One row per budget: the trace's reuse and working set (the same on every row) and the
    fetch-all hit rates of the baseline evictions at that budget (all in %). With the profile's
    intervals (``prof["ci"]``) and ``hit_intervals`` (budget -> eviction -> (low, high) as fractions), the
    cells show value±half-width and the frame has the bounds."""
    import polars as pl

    civ = (prof.get("ci") or {}).get("intervals", {})
    rows = []
    intervals: dict[str, tuple[str, str]] = {}
    for b in sorted(hit_rates):
        h = hit_rates[b]
        row = {
            "budget (%)": 100 * b,
            "reuse next": prof["reuse_next_token"],
            "reuse chance": prof["reuse_chance_marginal"],
            "WS95 (%)": 100 * prof["working_set_95"],
            **{HIT_COLUMNS[ev]: 100 * h[ev] for ev in BASELINE_EVICTIONS},
        }
        if "reuse_next_token" in civ:
            intervals["reuse next"] = _bounds("reuse next")
            row.update(zip(intervals["reuse next"], civ["reuse_next_token"]))
        for ev in BASELINE_EVICTIONS:
            iv = (hit_intervals or {}).get(b, {}).get(ev)
            if hit_intervals:
                intervals[HIT_COLUMNS[ev]] = _bounds(HIT_COLUMNS[ev])
                row.update(zip(intervals[HIT_COLUMNS[ev]], [None, None] if iv is None else [100 * x for x in iv]))
        rows.append(row)
    frame = pl.DataFrame(rows)
    formats = {c: ".1f" for c in frame.columns if "(%" in c}
    formats.update({"reuse next": ".3f", "reuse chance": ".3f"})
    caption = (f"Routing profile of {prof['model']}"
               + (" (SYNTHETIC trace, not recorded from the model)" if prof["synthetic"] else "")
               + f": {prof['tokens']} tokens, {prof['n_layers']} MoE layers x {prof['experts']} experts, "
               f"top-{prof['top_k']}. Budget = cache size in % of each layer's experts. Reuse next = mean share of a "
               "token's experts selected again at the next token; reuse chance = the same for independent draws "
               "from each layer's expert popularity; WS95 = fewest experts carrying 95% of a layer's requests, in % "
               "of its experts (mean over layers). LRU, LFU, static, Belady: hit rate (% of requests) of fetch-all "
               "replays with per-layer caches of the given budget, cold start; static pins each layer's most "
               "requested experts over the whole trace and Belady is the offline optimum (both use future "
               "knowledge).")
    if intervals and prof.get("ci"):
        c = prof["ci"]
        caption += " " + ci_sentence(c["level"], c["described"], c["resamples"], c.get("cache_method")) + \
            " Reuse chance and WS95 have no interval (docs/uncertainty.md)."
    formats.update({b: formats.get(c, ".4g") for c, pair in intervals.items() for b in pair})
    return PaperTable("routing_profile", "Routing profile and baseline hit rates", caption, frame, formats, intervals)


def policy_rows(configs):
    """The rows a paper prints: every named preset and every Pareto-optimal config (time vs mass, within
    its first-choice class) of each group (cache size, allocation, batch); per group the policies that
    always run the first choice first, fastest first within a class. ``speedup`` is the sweep's (over
    its one baseline, sweeps/ranking.py)."""
    import polars as pl

    keep = pl.col("preset").is_not_null() | pl.col("pareto")
    return (configs.filter(keep)
            .with_columns((~pl.col("keeps_first_choice")).alias("_class"))
            .sort(["size", "allocation", "batch", "_class", "s_per_token", "label"], nulls_last=True)
            .drop("_class"))


def policy_table(configs, *, model: str, synthetic: bool, priced_as: str | None) -> PaperTable:
    """``configs``: the report's normalized sweep rows (load_results in reports/report.py)."""
    import polars as pl

    rows = policy_rows(configs)
    timed = rows["s_per_token"].is_not_null().any()
    out = {
        "preset": [p if p else "" for p in rows["preset"].to_list()],
        "policy": rows["policy"].to_list(),
    }
    if rows["budget"].is_null().any():
        out["cache"] = rows["size_label"].to_list()
    else:
        out["budget (%)"] = (100 * rows["budget"]).to_list()
    out.update({
        "hit (%)": (100 * rows["hit_rate"]).to_list(),
        "subst. (%)": (100 * rows["substitution_rate"]).to_list(),
        "drop (%)": (100 * rows["drop_rate"]).to_list(),
        "mass/step": rows["mass_per_step"].to_list(),
    })
    if timed:
        out["ms/token"] = (1e3 * rows["s_per_token"]).to_list()
        out["speed-up (×)"] = rows["speedup"].to_list()
    out["1st choice"] = ["kept" if k else "may lose" for k in rows["keeps_first_choice"].to_list()]
    fits = rows["fits_in_vram"].to_list() if "fits_in_vram" in rows.columns else []
    unfit = timed and any(f is False for f in fits)
    if unfit:
        out["fits"] = ["" if f is None else ("yes" if f else "NO") for f in fits]
    out[PPL_COLUMN] = [None] * len(rows)
    intervals: dict[str, tuple[str, str]] = {}
    if "hit_rate_low" in rows.columns and rows["hit_rate_low"].is_not_null().any():
        for col, (name, scale) in _POLICY_INTERVALS.items():
            if col not in out:
                continue
            intervals[col] = _bounds(col)
            for side, bound in zip(("low", "high"), intervals[col]):
                out[bound] = [None if v is None else scale * v for v in rows[f"{name}_{side}"].to_list()]
    frame = pl.DataFrame(out, schema_overrides={PPL_COLUMN: pl.Utf8})
    formats = {"budget (%)": ".1f", "hit (%)": ".1f", "subst. (%)": ".1f", "drop (%)": ".1f", "mass/step": ".4f",
               "ms/token": ".2f", "speed-up (×)": ".2f"}
    formats.update({b: formats[c] for c, pair in intervals.items() for b in pair})
    baselines = sorted({b for b in rows["baseline"].to_list() if b}) if "baseline" in rows.columns else []
    caption = (f"Expert-caching policies for {model}"
               + (" (SYNTHETIC trace, not recorded from the model)" if synthetic else "")
               + ": the named presets and the Pareto-optimal configurations (time per token vs substituted gate "
               "mass, within a first-choice class) of each budget. Policy = eviction / miss policy / background "
               "admission threshold. Subst. = share of expert requests served by a substitute expert; drop = "
               "share dropped (no substitute resident); mass = summed normalized gate weight of the substituted "
               "and dropped experts per (token, layer) step. 1st choice: kept = the policy always runs the "
               "router's first choice (substituted mass tracks the perplexity increase within this class only); "
               "may lose = it may substitute or drop it. "
               + (f"Time priced as {priced_as}; speed-up = time per token of {', '.join(baselines) or 'the baseline'} "
                  "at the same budget divided by the row's. " if timed
                  else "Not priced (no model preset for the trace). ")
               + ("WARNING: the rows marked fits = NO need more VRAM for their cache than the machine has free for "
                  "experts; their times describe a machine that does not exist. " if unfit else "")
               # ASCII only: pdflatex rejects a bare Δ in running text
               + "The last column is left empty for the perplexity change measured with the real model.")
    if intervals:
        from moesim.simulator.units import describe

        r = rows.filter(pl.col("ci_units").is_not_null()).row(0, named=True)
        units = describe(r["ci_unit"], r["ci_units"], r["ci_block_steps"], "batch step" if r["batch"] > 1 else "token")
        caption += " " + ci_sentence(r["ci_level"], units, r["ci_resamples"], r.get("ci_method")) + \
            " Speed-up intervals are paired: the baseline is resampled with the same units."
    return PaperTable("policies", "Policies: substitution, mass and time per token", caption, frame, formats,
                      intervals)


# policy-table column -> (sweep statistic, scale) of its interval
_POLICY_INTERVALS = {"hit (%)": ("hit_rate", 100.0), "subst. (%)": ("substitution_rate", 100.0),
                     "drop (%)": ("drop_rate", 100.0), "mass/step": ("mass_per_step", 1.0),
                     "ms/token": ("s_per_token", 1e3), "speed-up (×)": ("speedup", 1.0)}


__all__ = ["PaperTable", "cell_text", "baseline_hit_rates", "HIT_COLUMNS",
           "routing_profile_table", "policy_table", "policy_rows", "BASELINE_EVICTIONS", "PPL_COLUMN"]
