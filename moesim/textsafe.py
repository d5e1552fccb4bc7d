"""Strings from data files (model ids, domains, paths, source notes) shown in a terminal, Markdown or
HTML: escaped, so a hostile trace cannot move the cursor, retitle the terminal (ANSI/OSC escapes),
break a table row or inject markup."""

from __future__ import annotations

import json
import re

# C0 and C1 controls, DEL, the bidirectional overrides/isolates that reorder text on screen, and what XML
# cannot hold (lone surrogates, U+FFFE/U+FFFF: vl-convert aborts the process on an SVG containing them)
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\x1b"}


def _escape(m: re.Match) -> str:
    ch = m.group(0)
    if ch in _NAMED:
        return _NAMED[ch]
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"


def term(value) -> str:
    """``str(value)`` with every control character shown as an escape (``\\x1b``, ``\\n``, ``\\u202e``)."""
    s = value if isinstance(value, str) else str(value)
    return _UNSAFE.sub(_escape, s)


_MD = {"|": "\\|", "<": "&lt;", ">": "&gt;", "&": "&amp;", "\\": "\\\\", "`": "\\`"}
_MD_RE = re.compile(r"[|<>&\\`]")


def clean(doc):
    """A JSON-like document (a chart spec with its data) with ``term`` applied to every string in it."""
    if isinstance(doc, str):
        return term(doc)
    if isinstance(doc, dict):
        return {clean(k): clean(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [clean(v) for v in doc]
    return doc


def markdown(value) -> str:
    """A Markdown table cell or line: no raw HTML, no row break, no column break, controls escaped."""
    return _MD_RE.sub(lambda m: _MD[m.group(0)], term(value))


def script_json(doc) -> str:
    """JSON to embed in an HTML ``<script>`` element: ``<``, ``>`` and ``&`` as \\u escapes (so neither
    ``</script>`` nor ``<!--`` can end or change the element), as are U+2028/U+2029; JSON.parse
    reads the same document back."""
    text = json.dumps(doc, separators=(",", ":"))
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


__all__ = ["term", "clean", "markdown", "script_json"]
