"""Ranked tables for the terminal, Markdown and LaTeX (paper tables), from sweep and mrc frames.

A table is (title, columns, cells); the same cells render in every format, so the terminal, the
Markdown and the LaTeX show the same numbers. Synthetic traces say so in every title and caption.
CSV and JSON are the frame's own rows (``frame_csv``, ``frame_json``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass

SYNTHETIC_TAG = "SYNTHETIC trace"


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    fmt: Callable[[object], str] = str
    align: str = "r"  # r | l
    latex: str | None = None  # header in LaTeX, when it needs markup


@dataclass
class Table:
    title: str
    columns: list[Column]
    cells: list[list[str]]
    note: str = ""


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


def cells(rows: list[dict], columns: list[Column]) -> list[list[str]]:
    return [[c.fmt(r.get(c.key)) for c in columns] for r in rows]


# ---------------------------------------------------------------------------------------------- renderers


def to_text(t: Table) -> str:
    heads = [c.header for c in t.columns]
    widths = [max(len(h), *(len(row[i]) for row in t.cells)) if t.cells else len(h) for i, h in enumerate(heads)]

    def line(vals):
        return "  ".join(v.rjust(w) if c.align == "r" else v.ljust(w)
                         for v, w, c in zip(vals, widths, t.columns)).rstrip()

    out = [t.title, line(heads), line(["-" * w for w in widths])] + [line(r) for r in t.cells]
    if t.note:
        out.append(t.note)
    return "\n".join(out)


def _md_escape(s: str) -> str:
    return s.replace("|", "\\|")


def to_markdown(t: Table) -> str:
    out = [f"**{_md_escape(t.title)}**", "",
           "| " + " | ".join(_md_escape(c.header) for c in t.columns) + " |",
           "|" + "|".join("---:" if c.align == "r" else ":---" for c in t.columns) + "|"]
    out += ["| " + " | ".join(_md_escape(v) for v in row) + " |" for row in t.cells]
    if t.note:
        out += ["", _md_escape(t.note)]
    return "\n".join(out)


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_escape(s: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in s)


def to_latex(t: Table, label: str | None = None) -> str:
    spec = "".join(c.align for c in t.columns)
    head = " & ".join(c.latex if c.latex is not None else latex_escape(c.header) for c in t.columns)
    caption = latex_escape(t.title) + (f". {latex_escape(t.note)}" if t.note else "")
    out = [r"\begin{table}[t]", r"\centering", r"\small", rf"\caption{{{caption}}}"]
    if label:
        out.append(rf"\label{{{latex_escape(label)}}}")
    out += [rf"\begin{{tabular}}{{{spec}}}", r"\hline", head + r" \\", r"\hline"]
    out += [" & ".join(latex_escape(v) for v in row) + r" \\" for row in t.cells]
    out += [r"\hline", r"\end{tabular}", r"\end{table}"]
    return "\n".join(out)


def render(tables: list[Table], fmt: str) -> str:
    if fmt == "markdown":
        return "\n\n".join(to_markdown(t) for t in tables)
    if fmt == "latex":
        return "\n\n".join(to_latex(t) for t in tables)
    return "\n\n".join(to_text(t) for t in tables)


def frame_csv(df) -> str:
    return df.write_csv()


def frame_json(df, **header) -> str:
    """{...header, "rows": [...]} with NaN/inf as null."""
    from moesim.jsonable import plain

    return json.dumps(plain({**header, "rows": df.to_dicts()}), indent=2)


# ---------------------------------------------------------------------------------------------- sweep tables

PRICED_COLUMNS = [
    Column("rank", "#", _text),
    Column("policy", "policy", _text, "l"),
    Column("preset", "preset", _text, "l"),
    Column("ms_per_token", "ms/token", _f(".2f")),
    Column("speedup_vs_fetch_all", "speed-up", _f(".2f"), latex=r"speed-up ($\times$)"),
    Column("hit_rate", "hit %", _f(".1f", 100), latex=r"hit \%"),
    Column("substitution_rate", "subst %", _f(".2f", 100), latex=r"subst.\ \%"),
    Column("mass_per_step", "mass/step", _f(".4f"), latex="$m$/step"),
    Column("first_choice_substitutions", "1st-choice subs", _int),
    Column("gb_per_token_sync", "GB/tok sync", _f(".3f")),
    Column("gb_per_token_background", "GB/tok bg", _f(".3f")),
    Column("pareto", "Pareto", _flag, "l"),
]
_TIME_KEYS = {"ms_per_token", "speedup_vs_fetch_all", "gb_per_token_sync", "gb_per_token_background"}
UNPRICED_COLUMNS = [c for c in PRICED_COLUMNS if c.key not in _TIME_KEYS]


def _size(r: dict) -> str:
    if r["budget"] is not None:
        return f"budget {r['budget']:g} ({r['slots_per_layer']} slots per layer)"
    return f"{r['slots']} slots per layer"


def group_title(r: dict) -> str:
    data = SYNTHETIC_TAG if r["synthetic"] else "real trace"
    bits = [_size(r), r["allocation"]]
    if r["batch"] > 1:
        bits.append(f"batch {r['batch']}")
    if r["warm"]:
        bits.append("warm start")
    if r["warmup_tokens"]:
        bits.append(f"first {r['warmup_tokens']} tokens not counted")
    if r["reset_per_sequence"]:
        bits.append("reset per sequence")
    priced = r["priced_as"] if r["priced"] else f"not priced ({r['priced_as']})"
    return (f"{r['trace']} ({r['model_id']}, {data}): {', '.join(bits)}; {priced}; "
            f"ranked by {r['ranked_by']}")


def sweep_tables(df, top: int | None = None) -> list[Table]:
    """One ranked table per group (trace, machine, cache size, allocation, batch...), in frame order."""
    groups: dict[str, list[dict]] = {}
    for r in df.to_dicts():
        groups.setdefault(r["group_key"], []).append(r)
    tables = []
    for members in groups.values():
        members.sort(key=lambda r: r["rank"])
        shown = members[:top] if top else members
        cols = PRICED_COLUMNS if members[0]["priced"] else UNPRICED_COLUMNS
        note = "speed-up: vs fetch-all with the same eviction and cache size. Pareto: no other row is faster " \
               "with less substituted mass." if members[0]["priced"] else \
               "Not priced: ranked by hit rate. Pareto: no other row has a higher hit rate with less substituted mass."
        if len(shown) < len(members):
            note += f" Top {len(shown)} of {len(members)} configs."
        tables.append(Table(group_title(members[0]), cols, cells(shown, cols), note))
    return tables


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
            row += [f"{100 * hit[(e, s)]['hit_rate']:.2f}" if (e, s) in hit else "-" for e in evictions]
            rows.append(row)
        title = (f"{first['trace']} ({first['model_id']}, {data}): hit rate by cache size, {allocation} "
                 f"allocation, fetch-all, cold start")
        methods = sorted(set(part["method"].to_list()))
        note = "lru: one stack-distance pass (exact); others: one replay per size." if len(methods) > 1 else ""
        tables.append(Table(title, cols, rows, note))
    return tables
