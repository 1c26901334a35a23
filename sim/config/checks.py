"""Field checks shared by the specs: one short ValueError naming the field, its value and
what is allowed.

Apart from the specs because both ModelSpec and HardwareSpec (and the cost formulas'
arguments) check their numbers the same way, and neither spec module should import the
other for it.
"""

from __future__ import annotations

import math
from typing import Any


def check_positive_int(field: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{field} must be a positive integer, got {value!r}")


def check_non_negative_int(field: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{field} must be a non-negative integer, got {value!r}")


def check_positive(field: str, value: Any) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{field} must be a positive number, got {value!r}")
