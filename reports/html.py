"""A self-contained HTML page: Vega, Vega-Lite and vega-embed inlined (from vl-convert's bundle),
chart specs embedded as JSON with their data, tables as HTML. It loads nothing from the network;
a Content-Security-Policy makes the browser refuse any attempt, so a regression shows as an error.

The page writes its own rendering status into ``<html data-moesim-charts="done|error">`` and
``<pre id="moesim-status">`` (JSON: charts rendered, errors) for the browser test and for a reader
whose chart did not appear."""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

# 'unsafe-eval': Vega compiles its expressions with the Function constructor.
CSP = ("default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; "
       "img-src data: blob:; font-src data:")

EMBED_OPTIONS = {"renderer": "svg", "actions": {"export": True, "source": False, "compiled": False, "editor": False}}

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1100px; padding: 0 1em; color: #222; line-height: 1.45; }
h1 { font-size: 1.6em; margin-bottom: .2em; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; }
.banner { background: #fff3cd; border: 1px solid #e0c36a; padding: .6em 1em; margin: 1em 0; }
.meta td { padding: .1em 1em .1em 0; vertical-align: top; } .meta td:first-child { color: #666; }
figure { margin: 1.5em 0; } figcaption { color: #444; max-width: 900px; margin-top: .4em; }
.files, .note { font-size: .9em; color: #666; }
table.data { border-collapse: collapse; font-size: .9em; margin: .5em 0; }
table.data th, table.data td { border-bottom: 1px solid #ddd; padding: .25em .7em; }
.chart { overflow-x: auto; }
table.data th { border-bottom: 2px solid #888; }
"""

RUNNER = """
(async function () {
  const status = { charts: %d, rendered: 0, errors: [] };
  window.addEventListener('error', e => status.errors.push('error: ' + e.message));
  const opts = %s;
  for (let i = 0; i < status.charts; i++) {
    const el = document.getElementById('chart-' + i);
    try {
      const spec = JSON.parse(document.getElementById('spec-' + i).textContent);
      await vegaEmbed(el, spec, opts);
      status.rendered++;
    } catch (err) {
      status.errors.push('chart ' + i + ': ' + err);
      el.textContent = 'This chart failed to render: ' + err;
    }
  }
  const line = document.getElementById('moesim-status');
  line.textContent = JSON.stringify(status);
  line.hidden = status.errors.length === 0;
  document.documentElement.dataset.moesimCharts = status.errors.length ? 'error' : 'done';
})();
"""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "moesim"


def vega_bundle(vl_version: str) -> str:
    """vega-embed + Vega-Lite + Vega as one script (~0.9 MB). vl-convert builds it in ~3-10 s,
    so it is cached per (vl-convert, Vega-Lite) version under ~/.cache/moesim."""
    import vl_convert as vlc

    path = cache_dir() / f"vega-bundle-vlc{getattr(vlc, '__version__', 'x')}-vl{vl_version}.js"
    try:
        text = path.read_text()
        if text:
            return text
    except OSError:
        pass
    text = vlc.javascript_bundle(vl_version=vl_version)  # type: ignore[call-arg]  # the snippet is optional
    from moesim.errors import MoesimError
    from moesim.files import write_text

    try:
        write_text(text, path)
    except (OSError, MoesimError):
        pass  # a read-only or full home only costs the rebuild next time
    return text


def _script_json(doc) -> str:
    # every <, > and & as a \\u escape: neither "</script>" nor "<!--" can end or change the element
    from moesim.textsafe import script_json

    return script_json(doc)


def table_html(table) -> str:
    """A reports.tables.Table (the same rounded cells as its Markdown and LaTeX) as an HTML table."""
    align = ["left" if c.align == "l" else "right" for c in table.columns]
    head = "".join(f'<th style="text-align:{a}">{html.escape(c.header)}</th>' for c, a in zip(table.columns, align))
    rows = ["<tr>" + "".join(f'<td style="text-align:{a}">{html.escape(v)}</td>' for v, a in zip(row, align))
            + "</tr>" for row in table.cells]
    return f'<table class="data"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def render_page(*, title: str, meta_rows: list[tuple[str, str]], banner: str | None, figures: list[dict],
                tables: list[dict], notes: list[str], vl_version: str) -> str:
    """``figures``: dicts with title, caption, spec, files ({kind: relative path}), notes.
    ``tables``: dicts with title, caption, table (a reports.tables.Table), files."""
    e = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{e(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{e(title)}</h1>",
    ]
    if banner:
        parts.append(f'<div class="banner">{e(banner)}</div>')
    parts.append('<table class="meta">' + "".join(f"<tr><td>{e(k)}</td><td>{e(str(v))}</td></tr>"
                                                  for k, v in meta_rows) + "</table>")
    for n in notes:
        parts.append(f'<p class="note">{e(n)}</p>')
    if figures:
        parts.append("<h2>Charts</h2>")
    for i, fig in enumerate(figures):
        links = " · ".join(f'<a href="{e(p)}">{e(kind.upper())}</a>' for kind, p in fig["files"].items())
        parts.append(f'<figure><div class="chart" id="chart-{i}"></div>'
                     f"<figcaption>{e(fig['caption'])}"
                     + "".join(f" {e(n)}" for n in fig.get("notes", []))
                     + f'<br><span class="files">files: {links}</span></figcaption></figure>'
                     f'<script type="application/json" id="spec-{i}">{_script_json(fig["spec"])}</script>')
    if tables:
        parts.append("<h2>Tables</h2>")
    for t in tables:
        links = " · ".join(f'<a href="{e(p)}">{e(kind)}</a>' for kind, p in t["files"].items())
        parts.append(f"<h3>{e(t['title'])}</h3><p>{e(t['caption'])}</p>"
                     + table_html(t["table"])
                     + f'<p class="files">files: {links}</p>')
    parts.append('<pre id="moesim-status" class="note" hidden></pre>')
    parts.append(f"<script>{vega_bundle(vl_version)}</script>")
    parts.append(f"<script>{RUNNER % (len(figures), json.dumps(EMBED_OPTIONS))}</script>")
    parts.append("</body></html>")
    return "\n".join(parts)


__all__ = ["render_page", "vega_bundle", "table_html", "CSP"]
