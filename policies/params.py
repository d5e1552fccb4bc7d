"""The one optional parameter an eviction may take (``name:value``), parsed and checked in one place."""

from __future__ import annotations

import math
from dataclasses import dataclass

from moesim.errors import MoesimError


@dataclass(frozen=True)
class Param:
    """``key`` names the value inside the kernel's parameter vector (slot 0); ``symbol`` is how help
    text writes it (freq:H); ``what`` completes "expected ..." in error messages."""

    key: str
    symbol: str
    what: str
    integer: bool = False
    default: float = 0.0
    maximum: float | None = None  # the largest value the policy takes (None: no bound)

    def parse(self, spec: str, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise MoesimError(f"bad parameter in {spec!r}: expected {self.what}") from None
        if not math.isfinite(value) or value <= 0 or (self.integer and value != int(value)) \
                or (self.maximum is not None and value > self.maximum):
            raise MoesimError(f"bad parameter in {spec!r}: expected {self.what}")
        return value
