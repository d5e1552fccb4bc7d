"""The parameter an eviction may take (``name:value``, or ``name:value,value2,...`` for one with further values),
parsed and checked in one place."""

from __future__ import annotations

import math
from dataclasses import dataclass

from moesim.errors import MoesimError


@dataclass(frozen=True)
class Param:
    """``key`` names the value inside the kernel's parameter vector (slot 0); ``symbol`` is how help
    text writes it (freq:H); ``what`` completes "expected ..." in error messages; ``extra``: further
    comma-separated values the policy takes after it (each optional, its default when left out)."""

    key: str
    symbol: str
    what: str
    integer: bool = False
    default: float = 0.0
    maximum: float | None = None  # the largest value the policy takes (None: no bound)
    zero: bool = False  # 0 is a value it takes (else values are positive)
    extra: tuple[Param, ...] = ()

    def check(self, spec: str, text: str) -> float:
        """One value: finite, positive (or zero when allowed), whole when ``integer``, at most ``maximum``."""
        try:
            value = float(text)
        except ValueError:
            raise MoesimError(f"bad parameter in {spec!r}: expected {self.what}") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not self.zero) \
                or (self.integer and value != int(value)) or (self.maximum is not None and value > self.maximum):
            raise MoesimError(f"bad parameter in {spec!r}: expected {self.what}")
        return value

    def parse_all(self, spec: str, text: str) -> tuple[float, ...]:
        """Its value and the extra ones (their defaults where left out)."""
        parts = text.split(",")
        if len(parts) > 1 + len(self.extra):
            wanted = ",".join([self.symbol] + [p.symbol for p in self.extra])
            raise MoesimError(f"bad parameter in {spec!r}: expected {wanted} ({self.what})")
        values = [self.check(spec, parts[0])]
        values += [p.check(spec, t) for p, t in zip(self.extra, parts[1:])]
        values += [p.default for p in self.extra[len(parts) - 1:]]
        return tuple(values)

    def parse(self, spec: str, text: str) -> float:
        return self.parse_all(spec, text)[0]
