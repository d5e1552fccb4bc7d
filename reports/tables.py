"""Ranked tables for the terminal, Markdown and LaTeX (paper tables), from sweep and mrc frames.

A table is (title, columns, cells); the same cells render in every format, so the terminal, the
Markdown and the LaTeX show the same numbers. Synthetic traces say so in every title and caption.
CSV and JSON are the frame's own rows (``frame_csv``, ``frame_json``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from moesim.textsafe import markdown, term

SYNTHETIC_TAG = "SYNTHETIC trace"


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    fmt: Callable[[object], str] = str
    align: str = "r"  # r | l
    latex: str | None = None  # header in LaTeX, when it needs markup
    wrap: str | None = None  # LaTeX: a paragraph column of this width (e.g. "2.4cm") whose cells wrap at spaces
    ci: bool = False  # show "value±half-width" when the row has <key>_low and <key>_high


@dataclass
class Table:
    title: str
    columns: list[Column]
    cells: list[list[str]]
    note: str = ""
    lines: list[str] = field(default_factory=list)  # further header lines: what the numbers assume, warnings


WIDTH = 120  # terminal tables fit this many columns by default (--wide shows every column)


def _f(spec: str, scale: float = 1.0) -> Callable[[object], str]:
    def fmt(v) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        return format(float(v) * scale, spec)
    return fmt


def _int(v) -> str:
    return "-" if v is None else f"{int(v):,}"


def _text(v) -> str:
    return "" if v is None else str(v)


def _flag(v) -> str:
    return "*" if v else ""


def _kept(v) -> str:
    return "" if v is None else ("kept" if v else "may lose")


def _fits(v) -> str:
    return "" if v is None else ("yes" if v else "NO")


PM = "±"
APPROX = "≈"


def with_interval(text: str, fmt: Callable[[object], str], low, high) -> str:
    """``text`` (a formatted value) followed by ±half the interval's width in the same format."""
    if low is None or high is None or text == "-" or not (math.isfinite(low) and math.isfinite(high)):
        return text
    return f"{text}{PM}{fmt((high - low) / 2)}"


def cell(r: dict, c: Column) -> str:
    text = c.fmt(r.get(c.key))
    return with_interval(text, c.fmt, r.get(f"{c.key}_low"), r.get(f"{c.key}_high")) if c.ci else text


def cells(rows: list[dict], columns: list[Column]) -> list[list[str]]:
    return [[cell(r, c) for c in columns] for r in rows]


# ---------------------------------------------------------------------------------------------- renderers


def _wrap(text: str, width: int, indent: str = "") -> list[str]:
    import textwrap

    return textwrap.wrap(text, width, subsequent_indent=indent, break_on_hyphens=False) or [""]


def to_text(t: Table, width: int = WIDTH) -> str:
    heads = [c.header for c in t.columns]
    rows = [[term(v) for v in row] for row in t.cells]  # model ids and domains come from data files
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(heads)]

    # one space between two right-aligned (numeric) columns: their headers keep them apart; two elsewhere
    seps = [""] + [" " if (a.align, b.align) == ("r", "r") else "  " for a, b in zip(t.columns, t.columns[1:])]

    def line(vals):
        return "".join(sep + (v.rjust(w) if c.align == "r" else v.ljust(w))
                       for sep, v, w, c in zip(seps, vals, widths, t.columns)).rstrip()

    # the header text wraps to the table (at least to ``width``): long titles must not widen a terminal table
    wrap_at = max(width, len(line(heads)))
    out = _wrap(term(t.title), wrap_at, "  ") + [w for extra in t.lines for w in _wrap(term(extra), wrap_at, "  ")]
    out += [line(heads), line(["-" * w for w in widths])] + [line(r) for r in rows]
    if t.note:
        out += _wrap(term(t.note), wrap_at)
    return "\n".join(out)


def _md_escape(s: str) -> str:
    return markdown(s)  # no raw HTML, no line or column break from a model id


def to_markdown(t: Table) -> str:
    out = [f"**{_md_escape(t.title)}**", ""]
    if t.lines:
        out += [_md_escape(" ".join(t.lines)), ""]
    out += ["| " + " | ".join(_md_escape(c.header) for c in t.columns) + " |",
            "|" + "|".join("---:" if c.align == "r" else ":---" for c in t.columns) + "|"]
    out += ["| " + " | ".join(_md_escape(v) for v in row) + " |" for row in t.cells]
    if t.note:
        out += ["", _md_escape(t.note)]
    return "\n".join(out)


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", PM: r"$\pm$",
                  APPROX: r"$\approx$"}


def latex_escape(s: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in term(s))


def latex_label(name: str) -> str:
    """A \\label key: letters, digits, ':' and '-' only, so it needs no escaping (and pdflatex accepts it)."""
    import re

    return re.sub(r"[^A-Za-z0-9:-]+", "-", name).strip("-")


# A table wider than the text is scaled down to it (graphicx's \resizebox), never past the margin; one that
# fits keeps its natural size. The natural width goes to the log, for the tests and for a curious author.
_LATEX_FIT = (r"\ifdim\wd0>\linewidth\resizebox{\linewidth}{!}{\usebox0}\else\usebox0\fi"
              r"\typeout{moesim table width: \the\wd0}")


def _latex_head(c: Column) -> str:
    """A header cell; "name (unit)" stacks the unit under the name (and a newline in ``latex`` breaks the
    line there), so numeric columns stay as narrow as their numbers."""
    text = c.latex if c.latex is not None else latex_escape(c.header)
    if "\n" not in text:
        name, sep, unit = text.partition(" (")
        if not sep or not name:
            return text
        text = f"{name}\n({unit}"
    return rf"\begin{{tabular}}[b]{{@{{}}{c.align}@{{}}}}" + r"\\".join(text.split("\n")) + r"\end{tabular}"


def to_latex(t: Table, label: str | None = None) -> str:
    spec = "".join(f"p{{{c.wrap}}}" if c.wrap else c.align for c in t.columns)
    head = " & ".join(_latex_head(c) for c in t.columns)
    caption = ". ".join(latex_escape(x.rstrip(".")) for x in [t.title, *t.lines, t.note] if x) + "."

    def cell(v: str, c: Column) -> str:
        if PM in v and not c.wrap:
            # value over its ±half-width, smaller: a column of intervals stays as narrow as its numbers
            value, _, half = v.partition(PM)
            return (rf"\begin{{tabular}}[t]{{@{{}}{c.align}@{{}}}}{latex_escape(value)}\\"
                    rf"{{\scriptsize$\pm${latex_escape(half)}}}\end{{tabular}}")
        return (r"\raggedright " if c.wrap and v else "") + latex_escape(v)

    out = [r"% moesim table: needs \usepackage{graphicx} (\resizebox: only if wider than the text)",
           r"\begin{table}[t]", r"\centering", r"\footnotesize", r"\setlength{\tabcolsep}{2.5pt}",
           rf"\caption{{{caption}}}"]
    if label:
        out.append(rf"\label{{{latex_label(label)}}}")
    out += [rf"\sbox0{{\begin{{tabular}}{{{spec}}}", r"\hline", head + r" \\", r"\hline"]
    out += [" & ".join(cell(v, c) for v, c in zip(row, t.columns)) + r" \\" for row in t.cells]
    out += [r"\hline", r"\end{tabular}}", _LATEX_FIT, r"\end{table}"]
    return "\n".join(out)


def render(tables: list[Table], fmt: str, width: int = WIDTH) -> str:
    if fmt == "markdown":
        return "\n\n".join(to_markdown(t) for t in tables)
    if fmt == "latex":
        return "\n\n".join(to_latex(t) for t in tables)
    return "\n\n".join(to_text(t, width) for t in tables)


def frame_csv(df) -> str:
    """CSV of ``df`` for a terminal: control characters in its text cells (a model id, a machine name) escaped."""
    import polars as pl

    from moesim.textsafe import term

    for c, t in df.schema.items():
        if t == pl.Utf8:
            fixed = {v: term(v) for v in df[c].drop_nulls().unique().to_list() if term(v) != v}
            if fixed:
                df = df.with_columns(pl.col(c).replace(fixed))
    return df.write_csv()


def frame_json(df, **header) -> str:
    """{...header, "rows": [...]} with NaN/inf as null."""
    from moesim.jsonable import plain

    return json.dumps(plain({**header, "rows": df.to_dicts()}), indent=2)


# ---------------------------------------------------------------------------------------------- sweep tables

# The default columns fit a 120-column terminal and a one-column paper; --wide adds the rest.
PRICED_COLUMNS = [
    Column("rank", "#", _text),
    Column("policy", "policy", _text, "l", wrap="2.3cm"),
    Column("preset", "preset", _text, "l", wrap="1.35cm"),
    Column("ms_per_token", "ms/tok", _f(".2f"), latex="ms per\ntoken", ci=True),
    Column("speedup", "speed-up", _f(".2f"), latex=r"speed-up ($\times$)", ci=True),
    Column("hit_rate", "hit%", _f(".1f", 100), latex=r"hit (\%)", ci=True),
    Column("substitution_rate", "subst%", _f(".2f", 100), latex=r"subst. (\%)", ci=True),
    Column("drop_rate", "drop%", _f(".2f", 100), latex=r"drop (\%)", ci=True),
    Column("mass_per_step", "mass/step", _f(".4f"), latex="mass\nper step", ci=True),
    Column("keeps_first_choice", "1st choice", _kept, "l", latex="1st\nchoice"),
    Column("pareto", "Pareto", _flag, "l"),
]
# With intervals: whether this trace resolves the row's time (hit rate, unpriced) from its class's best.
VS_BEST_COLUMN = Column("vs_best", "vs best", _text, "l", latex="vs\nbest")
DPPL_COLUMN = Column("dppl_shown", "dppl %", lambda v: "-" if v is None else str(v), latex=r"$\Delta$ppl \%")
KL_COLUMN = Column("kl", "KL", lambda v: "-" if v is None else f"{v:.4f}", latex="KL\n(nats)")


def quality_note(members: list[dict]) -> str:
    fits = sorted({r["dppl_source"] for r in members if r.get("dppl_source") not in (None, "measured")})
    note = "dppl %: perplexity increase measured by moesim emulate"
    if fits:
        note += "; ~ marks an " + "; ".join(fits)
    note += "; '-': not emulated (policies that may substitute the first choice get no estimate)."
    if any(r.get("kl") is not None for r in members):
        note += (" KL: mean KL divergence of the next-token distribution from the unmodified model's (nats per "
                 "token), measured only.")
    return note


WIDE_COLUMNS = [
    Column("first_choice_substitutions", "1st subst+drop", _int),
    Column("rerouted", "rerouted", _int),
    Column("displaced_mass_per_step", "displaced/step", _f(".4f"), latex="displaced\nper step"),
    Column("gb_per_token_sync", "GB/tok sync", _f(".3f")),
    Column("gb_per_token_background", "GB/tok bg", _f(".3f")),
    Column("vram_gib_for_cache", "VRAM GiB", _f(".1f")),
]
FITS_COLUMN = Column("fits_in_vram", "fits", _fits, "l")
_TIME_KEYS = {"ms_per_token", "speedup", "gb_per_token_sync", "gb_per_token_background", "vram_gib_for_cache"}
NOTE_COLUMNS = ("subst% = requests served by a substitute expert; drop% = requests dropped (no substitute "
                "resident); mass/step = gate weight of the substituted, dropped and rerouted-away experts per (token, "
                "layer) step. 1st choice: kept = the policy always runs the router's first choice (substituted mass "
                "tracks the perplexity increase within this class only); may lose = it may substitute, drop or "
                "reroute away from it.")


def columns_for(priced: bool, wide: bool, any_unfit: bool, intervals: bool = False) -> list[Column]:
    cols = PRICED_COLUMNS[:-1] + (WIDE_COLUMNS if wide else []) + ([FITS_COLUMN] if any_unfit or wide else []) \
        + PRICED_COLUMNS[-1:] + ([VS_BEST_COLUMN] if intervals else [])
    if not priced:
        cols = [c for c in cols if c.key not in _TIME_KEYS and c.key != "fits_in_vram"]
    return cols


def _size(r: dict) -> str:
    if r["budget"] is not None:
        return f"budget {r['budget']:g} ({r['slots_per_layer']} slots per layer)"
    return f"{r['slots']} slots per layer"


def group_title(r: dict) -> str:
    """What a group's rows are: trace, model, synthetic or real, cache size and how it is replayed."""
    data = SYNTHETIC_TAG if r["synthetic"] else "real trace"
    bits = [_size(r), r["allocation"]]
    if r["batch"] > 1:
        bits.append(f"batch {r['batch']}")
    if r["warm"]:
        bits.append("warm start")
    if r.get("holdout_tokens"):  # sweeps/holdout.py
        bits.append(f"first {r['warmup_tokens']} tokens not counted (static placements learned from the first "
                    f"{r['holdout_tokens']}: out of sample)")
    elif r["warmup_tokens"]:
        bits.append(f"first {r['warmup_tokens']} tokens not counted")
    if r["reset_per_sequence"]:
        bits.append("reset per sequence")
    return f"{r['trace']} ({r['model_id']}, {data}): {', '.join(bits)}"


def pricing_lines(members: list[dict]) -> list[str]:
    """What the times assume (model, quantization, machine, baseline, ranking) and whether the cache fits."""
    from collections import Counter

    common = Counter(m["engine"] for m in members).most_common(1)[0][0]
    r = next(m for m in members if m["engine"] == common)  # the grid's engine; presets may use their own
    if not r["priced"]:
        return [f"not priced ({r['priced_as']}); ranked by {r['ranked_by']}"]
    profiles = sorted({f"the {m['preset']} preset with the {m['engine']} engine profile" if m["preset"] else
                       f"{m['policy']} with the {m['engine']} engine profile" for m in members
                       if m["engine"] != r["engine"]})
    priced = r["priced_as"] + (f" ({'; '.join(profiles)})" if profiles else "")
    lines = [f"priced as {priced}; speed-up over {r['baseline'] or '(no baseline row)'}; "
             f"ranked by {r['ranked_by']}"]
    unfit = [m for m in members if m.get("fits_in_vram") is False]
    if unfit:
        u = unfit[0]
        free = u.get("vram_gib_free")
        which = "these times" if len(unfit) == len(members) else "the times of the rows marked fits = NO"
        lines.append(f"WARNING: this cache needs {u['vram_gib_for_cache']:.1f} GiB of VRAM"
                     + (f" and {r['hw']} has {free:.1f} GiB free for experts" if free is not None else "")
                     + f": it does not fit, so {which} describe a machine that does not exist (choose a smaller "
                     "--budget or a smaller --quant)")
    return lines


def ci_line(members: list[dict]) -> str | None:
    """What the ± and the vs-best column of a group's table mean, or None without intervals."""
    from moesim.simulator.bootstrap import method_note
    from moesim.simulator.units import describe

    with_ci = [m for m in members if m.get("ci_level") is not None and m.get("ci_units")]
    if not with_ci:
        return None
    r = with_ci[0]
    units = describe(r["ci_unit"], r["ci_units"], r["ci_block_steps"], "batch step" if r["batch"] > 1 else "token")
    if r["ci_units"] < 2:
        return f"no {r['ci_level']:g}% interval: {single_unit(r['ci_unit'], units)}"
    what = "time" if r["priced"] else "hit-rate"
    few = " (few units: a coarse interval)" if r["ci_units"] < FEW_UNITS else ""
    missing = f"; {len(members) - len(with_ci)} rows without intervals" if len(with_ci) < len(members) else ""
    return (f"± = half the {r['ci_level']:g}% interval: percentile bootstrap over {units}{few}, "
            f"{r['ci_resamples']} resamples; {method_note(r.get('ci_method'))} (docs/uncertainty.md); "
            f"vs best: {APPROX} = its {what} interval overlaps the best of its class (not resolved by this "
            f"trace){missing}")


FEW_UNITS = 10  # fewer resampling units than this: say the interval is coarse


def single_unit(kind: str, units: str) -> str:
    """Why one unit gives no interval, and what would."""
    if kind == "block":
        return f"{units}, nothing to resample (a trace needs two blocks of at least 64 tokens)"
    return f"{units}, nothing to resample (--ci-unit block resamples blocks of its tokens)"


def vs_best(df) -> dict[str, str]:
    """row_key -> the vs-best cell over whole groups (before --top or --max-mass leave rows out): "best" for
    the first row of each ranking class, ≈ for a row whose interval overlaps it, empty otherwise."""
    out: dict[str, str] = {}
    seen: set = set()
    if "overlaps_best" not in df.columns:
        return out
    for r in df.sort(["group_key", "rank"]).select("row_key", "group_key", "rank", "keeps_first_choice",
                                                   "ranked_by", "overlaps_best").to_dicts():
        by_class = str(r["ranked_by"] or "").startswith("1st-choice")
        klass = (r["group_key"], r["keeps_first_choice"] if by_class else True)
        first = klass not in seen
        seen.add(klass)
        flag = r["overlaps_best"]
        out[r["row_key"]] = "" if flag is None else ("best" if first else (APPROX if flag else ""))
    return out


def lower_bound(members: list[dict]) -> dict | None:
    """The group's belady + fetch-all + oracle prefetch row (depth 1 first), reported as the lower bound on
    time per token; None when the group has none or is not priced."""
    from moesim.sweeps.grid import LOWER_BOUND

    ev, miss, pf = LOWER_BOUND
    found = [r for r in members if r["eviction"] == ev and r["miss"] == miss and r.get("prefetch") == pf
             and r.get("ms_per_token") is not None and r.get("admit") is None and r.get("reroute") in (None, "none")]
    if not found:
        return None
    r = min(found, key=lambda r: (r.get("prefetch_depth") or 1, r["ms_per_token"]))
    return {"policy": r["policy"], "ms_per_token": r["ms_per_token"], "group_key": r["group_key"]}


def sweep_tables(df, top: int | None = None, wide: bool = False, dropped: dict | None = None,
                 best: dict[str, str] | None = None) -> list[Table]:
    """One ranked table per group (trace, machine, cache size, allocation, batch...), in frame order.
    ``dropped``: group_key -> how many rows a filter (--max-mass) left out, said in the note; ``best``: the
    vs-best cells (``vs_best``) of the whole groups when ``df`` holds only some of their rows."""
    best = vs_best(df) if best is None else best
    groups: dict[str, list[dict]] = {}
    for r in df.to_dicts():
        r["vs_best"] = best.get(r["row_key"], "")
        groups.setdefault(r["group_key"], []).append(r)
    tables = []
    for key, members in groups.items():
        members.sort(key=lambda r: r["rank"])
        shown = members[:top] if top else members
        priced = members[0]["priced"]
        interval_line = ci_line(members)
        cols = columns_for(priced, wide, any(m.get("fits_in_vram") is False for m in members),
                           any(m.get("overlaps_best") is not None for m in members))
        if "dppl_shown" in members[0]:   # sweep --quality: measured (or, marked ~, estimated) dppl
            at = next(i for i, c in enumerate(cols) if c.key == "pareto")
            kl = [KL_COLUMN] if any(m.get("kl") is not None for m in members) else []
            cols = cols[:at] + [DPPL_COLUMN, *kl] + cols[at:]
        quant = members[0].get("quant_choice") or ""
        note = ((f"Quantization {quant}. " if quant and not quant.endswith(": given") else "")
                + NOTE_COLUMNS
                + (" Pareto: no other row of its class is faster with less substituted mass." if priced else
                   " Not priced: ranked by hit rate. Pareto: no other row of its class has a higher hit rate "
                   "with less substituted mass."))
        if dropped and dropped.get(key):
            note += f" {dropped[key]} configs above the --max-mass limit left out."
        if len(shown) < len(members):
            note += f" Top {len(shown)} of {len(members)} configs."
        if "dppl_shown" in members[0]:
            note += " " + quality_note(members)
        bound = lower_bound(members)
        if bound is not None:
            note += (f" Lower bound on time per token of a policy that runs every selected expert on the GPU: "
                     f"{bound['ms_per_token']:.2f} ms ({bound['policy']}: the offline eviction with a perfect "
                     "prefetcher).")
        lines = pricing_lines(members) + ([interval_line] if interval_line else [])
        tables.append(Table(group_title(members[0]), cols, cells(shown, cols), note, lines))
    return tables


def ci_header(df) -> dict | None:
    """The JSON header's account of the rows' intervals (None when no row has one)."""
    from moesim.simulator.bootstrap import ASSUMPTION, SEED
    from moesim.simulator.units import describe

    if "ci_level" not in df.columns:
        return None
    rows = [r for r in df.to_dicts() if r.get("ci_level") is not None and r.get("ci_units")]
    if not rows:
        return None
    return {"method": ASSUMPTION, "seed": SEED,
            "levels": sorted({r["ci_level"] for r in rows}), "resamples": sorted({r["ci_resamples"] for r in rows}),
            "units": sorted({describe(r["ci_unit"], r["ci_units"], r["ci_block_steps"],
                                      "batch step" if r["batch"] > 1 else "token") for r in rows}),
            "rows_with_intervals": len(rows), "rows": df.height}


# ---------------------------------------------------------------------------------------------- mrc tables


def mrc_tables(df, slots: list[int] | None = None) -> list[Table]:
    """Hit rate (%) per cache size (rows) and eviction policy (columns), one table per allocation."""
    tables: list[Table] = []
    if df.height == 0:
        return tables
    first = df.row(0, named=True)
    data = SYNTHETIC_TAG if first["synthetic"] else "real trace"
    for allocation in dict.fromkeys(df["allocation"].to_list()):
        part = df.filter(df["allocation"] == allocation)
        evictions = list(dict.fromkeys(part["eviction"].to_list()))
        grid = sorted(set(part["slots_per_layer"].to_list())) if slots is None else slots
        hit = {(r["eviction"], r["slots_per_layer"]): r for r in part.to_dicts()}
        cols = [Column("slots", "slots/layer", _text), Column("budget", "budget", _text)] + \
            [Column(e, f"{e} hit %", _text, latex=latex_escape(e) + r" hit \%") for e in evictions]
        rows = []
        for s in grid:
            if not any((e, s) in hit for e in evictions):
                continue
            any_row = next(hit[(e, s)] for e in evictions if (e, s) in hit)
            row = [str(s), f"{any_row['budget']:.4g}"]
            row += [_hit_cell(hit[(e, s)]) if (e, s) in hit else "-" for e in evictions]
            rows.append(row)
        title = (f"{first['trace']} ({first['model_id']}, {data}): hit rate by cache size, {allocation} "
                 f"allocation, fetch-all, cold start")
        methods = sorted(set(part["method"].to_list()))
        note = "lru: one stack-distance pass (exact); others: one replay per size." if len(methods) > 1 else ""
        lines = [mrc_ci_line(first)] if first.get("ci_level") is not None else []
        tables.append(Table(title, cols, rows, note, [x for x in lines if x]))
    return tables


_PCT2 = _f(".2f", 100)


def _hit_cell(r: dict) -> str:
    return with_interval(_PCT2(r["hit_rate"]), _PCT2, r.get("hit_rate_low"), r.get("hit_rate_high"))


def mrc_ci_line(r: dict) -> str:
    from moesim.simulator.bootstrap import method_note
    from moesim.simulator.units import describe

    units = describe(r["ci_unit"], r["ci_units"], r["ci_block_steps"])
    if r["ci_units"] < 2:
        return f"no interval: {single_unit(r['ci_unit'], units)}"
    few = " (few units: a coarse interval)" if r["ci_units"] < FEW_UNITS else ""
    return (f"± = half the {r['ci_level']:g}% interval: percentile bootstrap over {units}{few}, {r['ci_resamples']} "
            f"resamples; {method_note(r.get('ci_method'))} (docs/uncertainty.md)")
