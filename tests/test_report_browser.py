"""The report in a real browser: headless Chromium opens index.html from disk and must render every
chart (an SVG with data marks), log no console error or exception, and request nothing but the page
itself. Chromium is driven over the DevTools pipe (tests/report_helpers.py: no Python dependency).
Skips where Chromium is not installed (.ci/run installs Debian's `chromium`)."""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path

import pytest
from report_helpers import Chromium, built_report, find_chromium, ink_fraction, read_png

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium not installed (apt-get install -y chromium, "
                                                          "or set MOESIM_CHROMIUM to a Chrome/Chromium binary)")

# Data marks only: axes, legends and titles are role-axis/-legend/-title groups, not role-mark.
PROBE = """(() => {
  const out = {state: document.documentElement.dataset.moesimCharts || null,
               status: document.getElementById('moesim-status').textContent, charts: []};
  document.querySelectorAll('div.chart').forEach(div => {
    const svg = div.querySelector('svg');
    let marks = 0;
    if (svg) svg.querySelectorAll('g.role-mark').forEach(g => {
      marks += g.querySelectorAll(':scope > path, :scope > line, :scope > text, :scope > rect, :scope > g').length;
    });
    out.charts.push({id: div.id, svg: !!svg, width: svg ? svg.getBoundingClientRect().width : 0, marks});
  });
  return JSON.stringify(out);
})()"""


# What a reader sees: the plot width (the widest horizontal axis line of the chart) and the smallest text
# (axis labels and titles, legends, chart titles, text marks), as rendered, in CSS px.
SIZES = """(() => JSON.stringify([...document.querySelectorAll('div.chart')].map(div => {
  const svg = div.querySelector('svg');
  let plot = 0, font = 1e9;
  if (svg) {
    svg.querySelectorAll('g.role-axis-domain').forEach(g => {
      const b = g.getBoundingClientRect();
      if (b.width > b.height) plot = Math.max(plot, b.width);
    });
    svg.querySelectorAll('text').forEach(t => {
      if (t.textContent.trim()) font = Math.min(font, parseFloat(getComputedStyle(t).fontSize));
    });
  }
  const r = (svg || div).getBoundingClientRect();
  return {id: div.id, plot, font, x: r.left + window.scrollX, y: r.top + window.scrollY, w: r.width, h: r.height};
})))()"""


def load(browser: Chromium, path, keep: bool = False) -> dict:
    """Open ``path`` in a new tab (1200 px wide); wait until the page reports its charts done (or 60 s).
    ``keep``: leave the tab open (its ``session`` and ``target`` are returned) for further calls."""
    url = path.resolve().as_uri()
    browser.events.clear()
    target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Network", "Runtime", "Log", "Page"):
        browser.call(f"{domain}.enable", session=session)
    browser.call("Emulation.setDeviceMetricsOverride", {"width": 1200, "height": 900, "deviceScaleFactor": 1,
                                                        "mobile": False}, session=session)
    browser.call("Page.navigate", {"url": url}, session=session)
    deadline = time.monotonic() + 60
    probe = None
    while time.monotonic() < deadline:
        value = browser.call("Runtime.evaluate", {"expression": PROBE, "returnByValue": True},
                             session=session)["result"].get("value")  # no value while the page loads
        probe = json.loads(value) if value else None
        if probe and probe["state"]:
            break
        browser.pump(0.3)
    browser.pump(0.5)  # late console messages or requests
    events = [e for e in browser.events if e.get("sessionId") == session]
    out = {"url": url, "probe": probe, "events": events, "errors": console_errors(events),
           "requests": requests(events)}
    if keep:
        return {**out, "session": session, "target": target}
    browser.call("Target.closeTarget", {"targetId": target})
    return out


def console_errors(events) -> list[str]:
    errors = []
    for ev in events:
        m, p = ev.get("method"), ev.get("params", {})
        if m == "Runtime.exceptionThrown":
            errors.append(p["exceptionDetails"].get("text", "") + " " +
                          str(p["exceptionDetails"].get("exception", {}).get("description", "")))
        elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
            errors.append(f"{p['entry'].get('source')}: {p['entry'].get('text')}")
    return errors


def requests(events) -> list[str]:
    return [ev["params"]["request"]["url"] for ev in events if ev.get("method") == "Network.requestWillBeSent"]


@pytest.fixture(scope="module")
def browser():
    b = Chromium(CHROMIUM)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture(scope="module")
def page(browser):
    rep = built_report()
    return {**load(browser, rep["out"] / "index.html"), "manifest": rep["manifest"]}


def test_every_chart_renders_with_marks(page):
    probe = page["probe"]
    assert probe is not None and probe["state"] == "done", f"page did not finish rendering: {probe}"
    status = json.loads(probe["status"])
    assert status["errors"] == [] and status["rendered"] == len(page["manifest"]["files"]["charts"])
    assert len(probe["charts"]) == len(page["manifest"]["files"]["charts"])
    for chart in probe["charts"]:
        assert chart["svg"] and chart["width"] > 100, chart
        assert chart["marks"] > 0, f"{chart['id']} has no data marks"


def test_charts_read_at_page_size_and_screenshots(browser, tmp_path):
    """As a paper reader sees the page: every plot at least 600 px wide, no text under 12 px. Each chart is
    also captured as a screenshot (to $MOESIM_SCREENSHOTS when set, to look at; else a temporary
    directory) and must not be blank."""
    rep = built_report()
    got = load(browser, rep["out"] / "index.html", keep=True)
    session = got["session"]
    try:
        sizes = json.loads(browser.call("Runtime.evaluate", {"expression": SIZES, "returnByValue": True},
                                        session=session)["result"]["value"])
        names = list(rep["manifest"]["files"]["charts"])
        assert len(sizes) == len(names)
        shots = Path(os.environ.get("MOESIM_SCREENSHOTS") or tmp_path)
        shots.mkdir(parents=True, exist_ok=True)
        for name, chart in zip(names, sizes):
            assert chart["plot"] >= 600, (name, chart)
            assert chart["font"] >= 12, (name, chart)
            clip = {"x": chart["x"], "y": chart["y"], "width": chart["w"], "height": chart["h"], "scale": 1}
            png = browser.call("Page.captureScreenshot", {"format": "png", "clip": clip, "captureBeyondViewport": True},
                               session=session)["data"]
            path = shots / f"{name}.png"
            path.write_bytes(base64.b64decode(png))
            assert ink_fraction(read_png(path)) > 0.02, f"{name}: the screenshot is blank"
    finally:
        browser.call("Target.closeTarget", {"targetId": got["target"]})


def test_no_console_errors(page):
    assert page["errors"] == []


def test_no_network_requests(page):
    assert page["url"] in page["requests"]  # the page itself: request logging works
    others = [u for u in page["requests"] if u != page["url"] and not u.startswith(("data:", "blob:"))]
    assert others == []


def test_harness_catches_a_remote_request_and_an_error(browser, tmp_path):
    """The same page with a remote image and a console error: both must be seen (and CSP blocks the image)."""
    rep = built_report()
    html = (rep["out"] / "index.html").read_text()
    bad = tmp_path / "bad.html"
    bad.write_text(html.replace('<pre id="moesim-status"', '<img src="https://example.com/x.png">'
                                '<script>console.error("boom")</script><pre id="moesim-status"', 1))
    got = load(browser, bad)
    assert "https://example.com/x.png" in got["requests"]
    assert any("boom" in e for e in got["errors"])
    assert any("Content Security Policy" in e for e in got["errors"])
