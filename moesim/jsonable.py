"""Plain JSON values from what the library returns (numpy scalars and arrays, tuples, NaN)."""

from __future__ import annotations

import math

import numpy as np


def plain(obj):
    """``obj`` with numpy scalars and arrays as Python values, tuples as lists, dict keys as strings,
    and non-finite floats as None (JSON has no NaN)."""
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if isinstance(obj, np.generic):
        return plain(obj.item())
    if isinstance(obj, np.ndarray):
        return plain(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
