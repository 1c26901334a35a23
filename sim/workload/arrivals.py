"""Arrival processes: exactly the distribution they name, generated lazily.

Gamma gaps follow vLLM's benchmark convention, shape = burstiness and
scale = 1 / (rate * burstiness), so the mean gap is always 1 / rate and the
coefficient of variation of the gaps is 1 / sqrt(burstiness): burstiness 1 is
Poisson, below 1 is burstier, above 1 is smoother. Gaps are never capped or
truncated (a peer's cap at 3x the mean turned "2.0 req/s" into 2.10).

The first arrival is at t = 0 (as in a trace replay and in vLLM's benchmark,
which sends its first request at once); each later arrival is one gap after
the previous one.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np

ArrivalKind = Literal["poisson", "gamma", "constant"]

DEFAULT_CHUNK_SIZE = 8192


@dataclass(frozen=True, slots=True)
class ArrivalProcess:
    """A renewal process of arrivals at a mean `rate_per_s` requests per second."""

    kind: ArrivalKind
    rate_per_s: float
    burstiness: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in ("poisson", "gamma", "constant"):
            raise ValueError(f"unknown arrival process {self.kind!r}")
        if not (math.isfinite(self.rate_per_s) and self.rate_per_s > 0):
            raise ValueError(f"rate_per_s must be finite and > 0, got {self.rate_per_s}")
        if not (math.isfinite(self.burstiness) and self.burstiness > 0):
            raise ValueError(f"burstiness must be finite and > 0, got {self.burstiness}")
        if self.kind == "poisson" and self.burstiness != 1.0:
            raise ValueError("a poisson process has burstiness 1; use kind='gamma'")

    @property
    def mean_gap_s(self) -> float:
        return 1.0 / self.rate_per_s


def sample_gaps_s(process: ArrivalProcess, rng: np.random.Generator, n: int) -> np.ndarray:
    """Draw `n` inter-arrival gaps in seconds, uncapped."""
    if process.kind == "constant":
        return np.full(n, process.mean_gap_s, dtype=np.float64)
    if process.kind == "poisson" or process.burstiness == 1.0:
        # Gamma(1, s) is Exp(s); one code path keeps poisson == gamma(b=1) bit for bit.
        return rng.exponential(process.mean_gap_s, n)
    scale_s = 1.0 / (process.rate_per_s * process.burstiness)
    return rng.gamma(process.burstiness, scale_s, n)


def arrival_chunks_s(
    process: ArrivalProcess,
    rng: np.random.Generator,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Iterator[np.ndarray]:
    """Endless arrival times (seconds, first at 0) in chunks, so memory stays flat."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if process.kind == "constant":
        # i / rate, not a running sum, so 50 arrivals at 5/s end before 10 s exactly.
        for first in itertools.count(0, chunk_size):
            yield np.arange(first, first + chunk_size, dtype=np.float64) / process.rate_per_s
    start_s = 0.0
    while True:
        gaps_s = sample_gaps_s(process, rng, chunk_size)
        times_s = np.empty(chunk_size, dtype=np.float64)
        times_s[0] = 0.0
        np.cumsum(gaps_s[:-1], out=times_s[1:])
        times_s += start_s
        start_s = float(times_s[-1] + gaps_s[-1])
        yield times_s


def arrival_times_s(
    process: ArrivalProcess,
    rng: np.random.Generator,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Iterator[float]:
    """Endless arrival times one at a time; convenient when chunks are not needed."""
    for chunk in arrival_chunks_s(process, rng, chunk_size):
        yield from chunk.tolist()
