"""Shared output helpers for commands: JSON documents and key-value listings."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import click

from moesim.jsonable import plain
from moesim.textsafe import term

FORMAT_OPTION = click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
                             show_default=True, help="Output format.")


class _Finite:
    """A float option that refuses nan and inf (they pass Click's range checks: every comparison is false)."""

    def convert(self, value, param, ctx):
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv


class FiniteFloat(_Finite, click.types.FloatParamType):
    pass


class FiniteRange(_Finite, click.FloatRange):
    pass


FINITE = FiniteFloat()


def echo_json(doc) -> None:
    click.echo(json.dumps(plain(doc), indent=2))


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def echo(text: str = "", err: bool = False) -> None:
    """click.echo with control characters from data (model ids, domains, notes) shown escaped, line by line."""
    click.echo("\n".join(term(line) for line in str(text).split("\n")), err=err)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{term(k)}: {_fmt(x)}" for k, x in v.items()) or "-"
    if isinstance(v, (list, tuple)):
        if len(v) > 12:
            return ", ".join(_fmt(x) for x in v[:12]) + f", ... ({len(v)} in all)"
        return ", ".join(_fmt(x) for x in v) or "-"
    if v is None:
        return "-"
    return term(v)


WIDTH = 120  # terminal output fits this many columns


def echo_kv(rows: list[tuple[str, object]], width: int = WIDTH) -> None:
    """``key  value`` lines; a long value wraps under itself, so a line never exceeds ``width``."""
    import textwrap

    key_w = max(len(k) for k, _ in rows)
    indent = " " * (key_w + 2)
    for k, v in rows:
        text = _fmt(v)
        lines = textwrap.wrap(text, width, initial_indent=term(k).ljust(key_w) + "  ", subsequent_indent=indent,
                              break_on_hyphens=False, break_long_words=True) or [k]
        for line in lines:
            click.echo(line.rstrip())


class Progress:
    """A progress bar on stderr when it is a terminal (opened at the first report, when the total is
    known); nothing in logs, CI or pipes. Called as ``progress(done, total)`` with the running count."""

    def __init__(self, label: str):
        self.label = label
        self.bar: Any = None
        self.shown = 0

    def __call__(self, done: int, total: int) -> None:
        if not sys.stderr.isatty() or total == 0:
            return
        if self.bar is None:
            self.bar = click.progressbar(length=total, label=self.label, file=sys.stderr, show_pos=True)
            self.bar.__enter__()
        self.bar.update(done - self.shown)
        self.shown = done

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def ci_options(f):
    """--ci LEVEL, --ci-resamples B, --ci-unit RULE: confidence intervals (docs/uncertainty.md)."""
    opts = [
        click.option("--ci", "ci", type=FINITE, default=None, metavar="LEVEL",
                     help="Add LEVEL% confidence intervals (e.g. 95): a percentile bootstrap over the trace's "
                          "sequences (blocks of tokens when it has one) of the one replay's counts; tables show "
                          "value ± half-width (docs/uncertainty.md)."),
        click.option("--ci-resamples", "ci_resamples", type=int, default=None, metavar="B",
                     help="Bootstrap resamples for --ci (default 1000; fixed seed)."),
        click.option("--ci-unit", "ci_unit", type=click.Choice(["auto", "sequence", "block"]), default="auto",
                     show_default=True,
                     help="What --ci resamples: sequences (lock-step groups when batched), contiguous blocks of "
                          "max(64, T/50) tokens, or auto: sequences when there are two or more, else blocks."),
        click.option("--ci-method", "ci_method", type=click.Choice(["rotated", "single"]), default="rotated",
                     show_default=True,
                     help="rotated: count every unit with a warm cache (one more replay, of the trace rotated by "
                          "half) and the cold start as a fixed offset; single: each unit as the one replay counted "
                          "it (the first unit carries the cold start)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def make_ci(level, resamples, unit, method="rotated"):
    """The CI settings of --ci/--ci-resamples/--ci-unit/--ci-method (None without --ci)."""
    from moesim.errors import MoesimError
    from moesim.simulator.bootstrap import CI, DEFAULT_RESAMPLES

    if level is None:
        if resamples is not None or unit != "auto" or method != "rotated":
            raise MoesimError("--ci-resamples, --ci-unit and --ci-method need --ci LEVEL (e.g. --ci 95)")
        return None
    return CI(level=level, resamples=DEFAULT_RESAMPLES if resamples is None else resamples, unit=unit,
              method=method)
