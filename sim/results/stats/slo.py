"""Service-level objectives: per-request bounds, and which finished requests met them.

vLLM's `--goodput ttft:MS tpot:MS e2el:MS`: a request counts toward goodput
only if it meets every bound given; a one-token output has no TPOT and passes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class SLO:
    """Per-request latency bounds in ms (vLLM's `--goodput ttft:MS tpot:MS e2el:MS`)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms", "e2el_ms"):
            bound = getattr(self, name)
            if bound is not None and not bound > 0:
                raise ValueError(f"SLO {name} must be > 0, got {bound}")

    @property
    def has_bounds(self) -> bool:
        return any(b is not None for b in (self.ttft_ms, self.tpot_ms, self.e2el_ms))

    @classmethod
    def parse(cls, text: str) -> SLO:
        """Parse 'ttft:200 tpot:50 e2el:5000' (spaces or commas between pairs)."""
        bounds: dict[str, float] = {}
        for pair in text.replace(",", " ").split():
            key, sep, value = pair.partition(":")
            if not sep or key not in ("ttft", "tpot", "e2el"):
                raise ValueError(f"bad SLO term {pair!r}; expected ttft|tpot|e2el:MS")
            bounds[f"{key}_ms"] = float(value)
        return cls(**bounds)


def meets_slo(r: dict[str, np.ndarray], slo: SLO) -> np.ndarray:
    """Finished requests within every given bound; 1-token outputs pass TPOT (vLLM)."""
    ok = r["finished"].copy()
    if slo.ttft_ms is not None:
        ok &= r["ttft_s"] * 1e3 <= slo.ttft_ms
    if slo.tpot_ms is not None:
        ok &= np.nan_to_num(r["tpot_s"], nan=0.0) * 1e3 <= slo.tpot_ms
    if slo.e2el_ms is not None:
        ok &= r["e2el_s"] * 1e3 <= slo.e2el_ms
    return ok
