"""Shared output helpers for commands: JSON documents and key-value listings."""

from __future__ import annotations

import json

import click

from moesim.jsonable import plain

FORMAT_OPTION = click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
                             show_default=True, help="Output format.")


def echo_json(doc) -> None:
    click.echo(json.dumps(plain(doc), indent=2))


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {_fmt(x)}" for k, x in v.items()) or "-"
    if isinstance(v, (list, tuple)):
        if len(v) > 12:
            return ", ".join(_fmt(x) for x in v[:12]) + f", ... ({len(v)} in all)"
        return ", ".join(_fmt(x) for x in v) or "-"
    if v is None:
        return "-"
    return str(v)


def echo_kv(rows: list[tuple[str, object]]) -> None:
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        click.echo(f"{k.ljust(width)}  {_fmt(v)}")
