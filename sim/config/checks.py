"""Field checks shared by the specs: one short ValueError naming the field, its value and
what is allowed.

Apart from the specs because both ModelSpec and HardwareSpec (and the cost formulas'
arguments) check their numbers the same way, and neither spec module should import the
other for it.
"""

from __future__ import annotations

import math
from typing import Any, get_args

# The largest models published have ~130 layers; the per-layer tables (layer kinds, the
# engine's caches) are built in memory, so a typo of 10**9 layers must stop here.
MAX_LAYERS = 4096
# No model dimension, count or context needs more; larger ones only overflow later.
MAX_DIMENSION = 2**40
SHOWN_CHARS = 60
# Simulated time is a float of seconds: at 1e8 s (about 3 years) it still resolves 15 ns,
# far below a step; a rate of 1e-300 req/s put arrivals at 1e301 s and overflowed later.
MAX_SPAN_S = 1e8
# A request longer than this is beyond every model's context (the longest are ~10M
# tokens); larger counts in a trace only overflow int64 arithmetic later.
MAX_TRACE_TOKENS = 100_000_000


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """repr(value) cut to `limit` characters, so a 5,000-digit number or a pasted file never
    becomes a 5 KB error line (and an int too long for str() is described, not printed)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1:,} digits"
    try:
        text = repr(value)
    except ValueError:  # a container holding an int over Python's digit limit
        return f"a {type(value).__name__} too large to print"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_positive_int(field: str, value: Any, most: int = MAX_DIMENSION) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{field} must be a positive integer, got {shown(value)}")
    if value > most:
        raise ValueError(f"{field} must be at most {most:,}, got {shown(value)}")


def check_non_negative_int(field: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{field} must be a non-negative integer, got {shown(value)}")


def check_positive(field: str, value: Any) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{field} must be a positive number, got {shown(value)}")


def allows_bool(annotation: Any) -> bool:
    """Whether bool (or Any) is among a field's types, through Optional, unions, Annotated."""
    if annotation is bool or annotation is Any:
        return True
    return any(allows_bool(arg) for arg in get_args(annotation))
