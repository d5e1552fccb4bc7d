"""Tables generated into the docs between two marker lines (costmodel.validation, sweeps.study_ratios):
``python -m MODULE`` prints the table, ``python -m MODULE --write DOC`` replaces it in DOC."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from moesim.files import write_text


def replace_between(doc: Path, begin: str, end: str, body: str) -> None:
    """Replace what lies between the lines ``begin`` and ``end`` of ``doc`` with ``body`` (atomically)."""
    text = doc.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{doc}: no {begin!r} ... {end!r} markers")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    write_text(head + begin + "\n" + body + "\n" + end + tail, doc)


def between(doc: Path, begin: str, end: str) -> str:
    """The text between the markers (what a test compares with a fresh table)."""
    return doc.read_text().split(begin, 1)[1].split(end, 1)[0].strip()


def table_main(table: Callable[[], str], begin: str, end: str, argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--write"] and len(argv) == 2:
        replace_between(Path(argv[1]), begin, end, table())
    else:
        print(table())
