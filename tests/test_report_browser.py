"""The report in a real browser: headless Chromium opens index.html from disk and must render every
chart (an SVG with data marks), log no console error or exception, and request nothing but the page
itself. Chromium is driven over the DevTools pipe (tests/report_helpers.py: no Python dependency).
Skips where Chromium is not installed (.ci/run installs Debian's `chromium`)."""

from __future__ import annotations

import json
import time

import pytest
from report_helpers import Chromium, built_report, find_chromium

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


def load(browser: Chromium, path) -> dict:
    """Open ``path`` in a new tab; wait until the page reports its charts done (or 60 s)."""
    url = path.resolve().as_uri()
    browser.events.clear()
    target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Network", "Runtime", "Log", "Page"):
        browser.call(f"{domain}.enable", session=session)
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
    browser.call("Target.closeTarget", {"targetId": target})
    return {"url": url, "probe": probe, "events": events, "errors": console_errors(events),
            "requests": requests(events)}


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
