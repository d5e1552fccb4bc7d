"""Shared chart plumbing: titles that say synthetic, a row guard, and PNG/SVG export with vl-convert.

The chart builders live in charts_trace.py (from a decoded trace and replays of it) and
charts_sweep.py (from sweep results); each takes data that is already aggregated."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moesim.errors import MoesimError

# Altair refuses inline data over 5000 rows; builders aggregate well below it, and this guard
# turns a builder that forgot to into a clear error instead of a silently truncated chart.
ROW_LIMIT = 5000
PNG_SCALE = 2
SYNTHETIC_TAG = " (synthetic trace)"

# Colours stay fixed per policy across charts, so a reader can match them between figures.
EVICTION_ORDER = ["lru", "lfu", "freq", "fifo", "static", "belady"]


@dataclass
class Figure:
    """One chart of a report: a file stem, the Altair chart and a sentence saying what it shows."""

    name: str
    chart: Any  # an Altair chart
    caption: str
    notes: list[str] = field(default_factory=list)
    _spec: dict | None = field(default=None, repr=False)

    def spec(self) -> dict:
        # to_dict validates against the Vega-Lite schema (~0.1 s a chart): once is enough. Control characters
        # from data (domains, model ids) are escaped: vl-convert aborts the whole process on them.
        if self._spec is None:
            from moesim.textsafe import clean

            self._spec = clean(styled(self.chart).to_dict())
        return self._spec


# Text sizes for reading a chart on a page or a slide: axis and legend text of at least 12 px.
FONT = {"label": 12, "title": 13, "chart_title": 15, "subtitle": 12}
PLOT_WIDTH = 640  # the plot area of a chart (or of each panel), in px


def styled(chart):
    """The report's common text sizes, set once on the top-level chart."""
    return (chart.configure_axis(labelFontSize=FONT["label"], titleFontSize=FONT["title"])
            .configure_legend(labelFontSize=FONT["label"], titleFontSize=FONT["title"], labelLimit=320)
            .configure_header(labelFontSize=FONT["title"], titleFontSize=FONT["title"])
            .configure_title(fontSize=FONT["chart_title"], subtitleFontSize=FONT["subtitle"])
            .configure_text(fontSize=FONT["label"]))


def title(text: str, synthetic: bool, subtitle: str | list[str] | None = None):
    import altair as alt

    full = text + (SYNTHETIC_TAG if synthetic else "")
    if subtitle is None:
        return alt.TitleParams(full, anchor="start")
    return alt.TitleParams(full, subtitle=subtitle, anchor="start", subtitleColor="#555")


def check_rows(frame, what: str):
    n = len(frame)
    if n > ROW_LIMIT:
        raise MoesimError(f"internal: chart '{what}' got {n} rows; aggregate before plotting (limit {ROW_LIMIT})")
    return frame


def vl_version() -> str:
    """The Vega-Lite version Altair writes (e.g. '6.4'), used for rendering and for the inlined JS."""
    import altair as alt

    major, minor = alt.SCHEMA_VERSION.lstrip("v").split(".")[:2]
    return f"{major}.{minor}"


def export(fig: Figure, directory: Path) -> dict[str, Path]:
    """Write ``fig`` as SVG, PNG (2x) and its Vega-Lite JSON spec; returns the paths by kind."""
    import vl_convert as vlc

    from moesim.files import write_text

    spec = fig.spec()
    v = vl_version()
    directory.mkdir(parents=True, exist_ok=True)
    svg = vlc.vegalite_to_svg(spec, vl_version=v)
    png = vlc.svg_to_png(svg, scale=PNG_SCALE)  # rasterize the same SVG: faster than a second Vega run
    out = {
        "svg": write_text(svg, directory / f"{fig.name}.svg"),
        "png": directory / f"{fig.name}.png",
        "spec": write_text(json.dumps(spec), directory / f"{fig.name}.vl.json"),
    }
    out["png"].write_bytes(png)
    return out


__all__ = ["Figure", "title", "check_rows", "vl_version", "export", "styled", "ROW_LIMIT", "EVICTION_ORDER",
           "SYNTHETIC_TAG", "FONT", "PLOT_WIDTH"]
