"""Token-length distributions, sampled vectorised in chunks.

Every sample is rounded to an integer, clipped to [min_tokens, max_tokens]
(values outside are moved to the bound, not redrawn) and floored at 1 because
a request needs at least one prompt and one output token. Clipping and the
floor shift the realised mean away from the nominal one when they bite.

Lognormal is parameterised by the mean and the coefficient of variation
(std / mean) of the *lengths themselves*, the two numbers a trace summary
gives you; internally sigma^2 = ln(1 + cv^2) and mu = ln(mean) - sigma^2 / 2.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Fixed:
    value: int


@dataclass(frozen=True, slots=True)
class Uniform:
    """Integers drawn uniformly from low..high, both inclusive."""

    low: int
    high: int


@dataclass(frozen=True, slots=True)
class Normal:
    mean: float
    std: float


@dataclass(frozen=True, slots=True)
class Lognormal:
    mean: float
    cv: float


@dataclass(frozen=True, slots=True)
class Empirical:
    """Sampled with replacement, so any request count works however few values there are."""

    values: tuple[int, ...]


LengthDist = Fixed | Uniform | Normal | Lognormal | Empirical


@dataclass(frozen=True, slots=True)
class LengthSpec:
    """A distribution plus the clipping applied to every draw."""

    dist: LengthDist
    min_tokens: int = 1
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        _check_dist(self.dist)
        if self.min_tokens < 1:
            raise ValueError(f"min_tokens must be >= 1, got {self.min_tokens}")
        if self.max_tokens is not None and self.max_tokens < self.min_tokens:
            raise ValueError(
                f"max_tokens ({self.max_tokens}) must be >= min_tokens ({self.min_tokens})"
            )


def _check_dist(dist: LengthDist) -> None:
    """Reject parameters that cannot describe token counts."""
    match dist:
        case Fixed(value=value) if value < 1:
            raise ValueError(f"fixed value must be >= 1, got {value}")
        case Uniform(low=low, high=high) if low < 1 or high < low:
            raise ValueError(f"uniform needs 1 <= low <= high, got low={low}, high={high}")
        case Normal(mean=mean, std=std) if not (mean >= 1 and std >= 0):
            raise ValueError(f"normal needs mean >= 1 and std >= 0, got {mean}, {std}")
        case Lognormal(mean=mean, cv=cv) if not (mean >= 1 and cv >= 0):
            raise ValueError(f"lognormal needs mean >= 1 and cv >= 0, got {mean}, {cv}")
        case Empirical(values=values) if not values or min(values) < 1:
            raise ValueError("empirical needs at least one value, all >= 1")
        case Fixed() | Uniform() | Normal() | Lognormal() | Empirical():
            return
        case _:
            raise TypeError(f"not a length distribution: {dist!r}")


def lognormal_params(mean: float, cv: float) -> tuple[float, float]:
    """(mu, sigma) of the underlying normal for a lognormal with this mean and cv."""
    sigma = math.sqrt(math.log1p(cv * cv))
    return math.log(mean) - 0.5 * sigma * sigma, sigma


def _raw_draws(dist: LengthDist, rng: np.random.Generator, n: int) -> np.ndarray:
    match dist:
        case Fixed(value=value):
            return np.full(n, value, dtype=np.int64)
        case Uniform(low=low, high=high):
            return rng.integers(low, high, size=n, endpoint=True, dtype=np.int64)
        case Normal(mean=mean, std=std):
            return rng.normal(mean, std, n)
        case Lognormal(mean=mean, cv=cv):
            mu, sigma = lognormal_params(mean, cv)
            return rng.lognormal(mu, sigma, n)
        case Empirical(values=values):
            pool = np.asarray(values, dtype=np.int64)
            return pool[rng.integers(0, pool.size, size=n)]
    raise TypeError(f"not a length distribution: {dist!r}")


def sample_lengths(spec: LengthSpec, rng: np.random.Generator, n: int) -> np.ndarray:
    """Draw `n` token counts (int64, all >= 1) from `spec`."""
    raw = _raw_draws(spec.dist, rng, n)
    if raw.dtype.kind == "f":
        # Clip in float first so huge tails cannot overflow the int cast.
        upper = float(spec.max_tokens) if spec.max_tokens is not None else float(2**62)
        raw = np.rint(np.clip(raw, spec.min_tokens, upper))
    return np.clip(raw, spec.min_tokens, spec.max_tokens).astype(np.int64, copy=False)


class DrawStream(Generic[T]):
    """One draw at a time from `sample(n)`, refilled `chunk_size` at a time.

    Numpy scalar draws are slow; a stream over `lambda n: sample_lengths(spec, rng, n)`
    yields the same sequence as repeated `sample_lengths(spec, rng, chunk_size)`.
    """

    __slots__ = ("_buffer", "_chunk_size", "_next", "_sample")

    def __init__(self, sample: Callable[[int], np.ndarray], chunk_size: int) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self._sample, self._chunk_size = sample, chunk_size
        self._buffer: list[T] = []
        self._next = 0

    def draw(self) -> T:
        if self._next == len(self._buffer):
            self._buffer = self._sample(self._chunk_size).tolist()
            self._next = 0
        value = self._buffer[self._next]
        self._next += 1
        return value


def length_stream(spec: LengthSpec, rng: np.random.Generator, chunk_size: int) -> DrawStream[int]:
    return DrawStream(lambda n: sample_lengths(spec, rng, n), chunk_size)
