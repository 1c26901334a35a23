"""One latency metric's samples: a mergeable sketch plus exact moments, in bounded memory.

Apart from sim.results.record.batches because it is the value a batch holds per metric
(TTFT, TPOT, E2EL, queue), not the batching: the summary and the measurement window
(sim.results.files.steady) merge these over whichever batches they keep. Percentiles come
from the sketch (sim.results.stats.sketch, within a relative 0.5%); count, mean and M2 are
exact (Welford's update; Chan's pairwise merge).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from sim.results.stats.percentiles import PERCENTILES, STAT_NAMES
from sim.results.stats.sketch import QuantileSketch


class Moments:
    """Exact count, mean and M2 (sum of squared deviations) of samples; mergeable."""

    __slots__ = ("count", "mean", "m2")

    def __init__(self, count: int = 0, mean: float = 0.0, m2: float = 0.0) -> None:
        self.count, self.mean, self.m2 = count, mean, m2

    def add(self, x: float) -> None:
        self.count += 1
        delta = x - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (x - self.mean)

    def add_all(self, values: list[float]) -> None:
        """add(x) for each x in order: the loop with the fields in locals."""
        count, mean, m2 = self.count, self.mean, self.m2
        for x in values:
            count += 1
            delta = x - mean
            mean += delta / count
            m2 += delta * (x - mean)
        self.count, self.mean, self.m2 = count, mean, m2

    def update(self, other: Moments) -> None:
        """Chan, Golub and LeVeque's pairwise merge."""
        n = self.count + other.count
        if not other.count:
            return
        delta = other.mean - self.mean
        self.mean += delta * other.count / n
        self.m2 += other.m2 + delta * delta * self.count * other.count / n
        self.count = n

    @property
    def std(self) -> float:
        """Population std (as np.std); NaN without samples."""
        return math.sqrt(max(self.m2, 0.0) / self.count) if self.count else math.nan


class Latency:
    """One latency metric's samples in one batch: a sketch and exact moments (seconds)."""

    __slots__ = ("sketch", "moments")

    def __init__(self) -> None:
        self.sketch = QuantileSketch()
        self.moments = Moments()

    def add(self, x: float) -> None:
        # a latency is >= 0; the last bits of a float difference can give -0.0 or -1e-17
        self.sketch.add(x if x > 0.0 else 0.0)
        m = self.moments  # Moments.add, inline (four of these a request)
        m.count += 1
        delta = x - m.mean
        m.mean += delta / m.count
        m.m2 += delta * (x - m.mean)

    def update(self, other: Latency) -> None:
        self.sketch.update(other.sketch)
        self.moments.update(other.moments)

    @classmethod
    def merged(cls, parts: Iterable[Latency]) -> Latency:
        """The parts' sketches in one merge (QuantileSketch.merged); moments one by one."""
        chosen = list(parts)
        out = cls()
        out.sketch = QuantileSketch.merged(part.sketch for part in chosen)
        for part in chosen:
            out.moments.update(part.moments)
        return out

    def describe_ms(self) -> dict[str, float]:
        """Mean, median, population std and tail percentiles in ms (NaN without samples):
        the summary's keys (sim.results.stats.percentiles.STAT_NAMES)."""
        m = self.moments
        if not m.count:
            return dict.fromkeys(STAT_NAMES, math.nan)
        pct = self.sketch.quantiles([q / 100.0 for q in (50, *PERCENTILES)]) * 1e3
        out = {"mean": m.mean * 1e3, "median": float(pct[0]), "std": m.std * 1e3}
        out.update({f"p{p}": float(x) for p, x in zip(PERCENTILES, pct[1:], strict=True)})
        return out
