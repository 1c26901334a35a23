"""Finished and rejected requests folded into time batches: the summary's and the window's
latencies without one row per request in memory.

Why batches: the measurement window (sim.results.steady) is chosen after the
run, by MSER on series in time, so what a request contributes must be kept by
*when* it arrived, and the batches the window keeps must merge into its
figures. A request goes to the batch of its arrival time: its latencies (TTFT,
TPOT, E2EL, queue) into that batch's `QuantileSketch`es (percentiles within the
sketch's relative error, 0.5%) and exact moments (count, mean, M2 by Welford;
batches merge by Chan's rule), its SLO verdict into a count. Its finish counts
in the batch of its finish time (the window's throughput). For the number in
the system, each batch keeps the count and the sum of the arrival and of the
leave times that fell in it: the time integral of the number in the system up
to an edge e is sum(min(leave, e)) - sum(min(arrival, e)), and both sums are
prefix sums of those columns (sum of times before e, plus e times the count
after it), so a batch's average is exact and merges by addition.

At most `max_batches` batches cover [0, max_batches x width); a time past
that doubles the width by merging adjacent pairs (every field adds), as
`TimeBuckets` does: memory is bounded by the batch count and the sketches'
bucket count, never by the number of requests.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from sim.core.request import Request
from sim.results.sketch import QuantileSketch
from sim.results.slo import SLO
from sim.results.stats import PERCENTILES, STAT_NAMES

METRICS = ("ttft", "tpot", "e2el", "queue")


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
        out = cls()
        for part in parts:
            out.update(part)
        return out

    def describe_ms(self) -> dict[str, float]:
        """Mean, median, population std and tail percentiles in ms (NaN without samples):
        the summary's keys (sim.results.stats.STAT_NAMES)."""
        m = self.moments
        if not m.count:
            return dict.fromkeys(STAT_NAMES, math.nan)
        pct = self.sketch.quantiles([q / 100.0 for q in (50, *PERCENTILES)]) * 1e3
        out = {"mean": m.mean * 1e3, "median": float(pct[0]), "std": m.std * 1e3}
        out.update({f"p{p}": float(x) for p, x in zip(PERCENTILES, pct[1:], strict=True)})
        return out


class RequestTotals:
    """Exact run totals of the recorded requests (what the summary sums)."""

    __slots__ = ("completed", "rejected", "reasons", "input_tokens", "output_tokens",
                 "preemptions", "prefix_hit_tokens", "first_arrival_s", "last_finish_s")

    def __init__(self) -> None:
        self.completed = self.rejected = self.input_tokens = self.output_tokens = 0
        self.preemptions = self.prefix_hit_tokens = 0
        self.reasons: dict[str, int] = {}
        self.first_arrival_s, self.last_finish_s = math.inf, -math.inf

    def add(self, req: Request, reason: str | None) -> None:
        if req.arrival_s < self.first_arrival_s:
            self.first_arrival_s = req.arrival_s
        if req.finish_s is not None and req.finish_s > self.last_finish_s:
            self.last_finish_s = req.finish_s
        if reason is not None:
            self.rejected += 1
            self.reasons[reason] = self.reasons.get(reason, 0) + 1
            return
        self.completed += 1
        self.input_tokens += req.prompt_tokens
        self.output_tokens += req.output_tokens
        self.preemptions += req.num_preemptions
        self.prefix_hit_tokens += req.prefix_hit_tokens


class Batch:
    """What the requests arriving (and leaving) in one time batch contributed."""

    __slots__ = ("arrived", "finished", "good", "latency", "arrival_sum_s", "left",
                 "left_sum_s", "done_here", "good_here")

    def __init__(self) -> None:
        self.arrived = self.finished = self.good = 0  # by arrival time
        self.latency: dict[str, Latency] = {}
        self.arrival_sum_s = 0.0
        self.left = 0  # by leave time (finish, or arrival for a rejected request)
        self.left_sum_s = 0.0
        self.done_here = self.good_here = 0  # finished (and good) by finish time

    def update(self, other: Batch) -> None:
        self.arrived += other.arrived
        self.finished += other.finished
        self.good += other.good
        for name, part in other.latency.items():
            mine = self.latency.get(name)
            if mine is None:
                mine = self.latency[name] = Latency()
            mine.update(part)
        self.arrival_sum_s += other.arrival_sum_s
        self.left += other.left
        self.left_sum_s += other.left_sum_s
        self.done_here += other.done_here
        self.good_here += other.good_here


class RequestBatches:
    """Requests by arrival-time batch (see the module docstring); `slo` counts good ones."""

    __slots__ = ("max_batches", "width_s", "slo", "_batches", "first_arrival_s",
                 "last_arrival_s", "last_leave_s")

    def __init__(self, slo: SLO | None = None, max_batches: int = 256,
                 width_s: float = 1e-3) -> None:
        if max_batches < 2 or max_batches % 2 or not width_s > 0:
            raise ValueError("max_batches must be even and >= 2, width_s > 0")
        self.max_batches, self.width_s = max_batches, width_s
        self.slo = slo if slo is not None and slo.has_bounds else None
        self._batches: list[Batch | None] = [None] * max_batches
        self.first_arrival_s = math.inf
        self.last_arrival_s = -math.inf
        self.last_leave_s = -math.inf

    def _batch(self, t_s: float) -> Batch:
        i = int(t_s / self.width_s)
        while i >= self.max_batches:
            self._merge_pairs()
            i = int(t_s / self.width_s)
        if i < 0:
            raise ValueError(f"a request time must be >= 0, got {t_s}")
        batch = self._batches[i]
        if batch is None:
            batch = self._batches[i] = Batch()
        return batch

    def _merge_pairs(self) -> None:
        half = self.max_batches // 2
        merged: list[Batch | None] = []
        for j in range(half):
            a, b = self._batches[2 * j], self._batches[2 * j + 1]
            if a is None:
                merged.append(b)
            else:
                if b is not None:
                    a.update(b)
                merged.append(a)
        self._batches = merged + [None] * half
        self.width_s *= 2.0

    def add(self, arrival_s: float, first_scheduled_s: float, first_token_s: float,
            finish_s: float, output_tokens: int, finished: bool) -> None:
        """One recorded request (times in s, NaN = never); a rejected one leaves on arrival
        for the number in the system, and none of its latencies count."""
        leave_s = finish_s if finished else arrival_s
        width_s = self.width_s
        gone = self._batch(leave_s)  # widen first, so both batches are of the final width
        here = self._batch(arrival_s)
        if self.width_s != width_s:
            gone = self._batch(leave_s)  # widening merged batches: look it up again
        here.arrived += 1
        here.arrival_sum_s += arrival_s
        gone.left += 1
        gone.left_sum_s += leave_s
        self.first_arrival_s = min(self.first_arrival_s, arrival_s)
        self.last_arrival_s = max(self.last_arrival_s, arrival_s)
        self.last_leave_s = max(self.last_leave_s, leave_s)
        if not finished:
            return
        ttft = first_token_s - arrival_s
        e2el = finish_s - arrival_s
        tpot = (e2el - ttft) / (output_tokens - 1) if output_tokens > 1 else math.nan
        here.finished += 1
        gone.done_here += 1
        latency = here.latency
        for name, x in (("ttft", ttft), ("tpot", tpot), ("e2el", e2el),
                        ("queue", first_scheduled_s - arrival_s)):
            if x == x:  # not NaN
                part = latency.get(name)
                if part is None:
                    part = latency[name] = Latency()
                part.add(x)
        slo = self.slo
        if slo is not None and ((slo.ttft_ms is None or ttft * 1e3 <= slo.ttft_ms)
                                and (slo.tpot_ms is None or math.isnan(tpot)
                                     or tpot * 1e3 <= slo.tpot_ms)
                                and (slo.e2el_ms is None or e2el * 1e3 <= slo.e2el_ms)):
            here.good += 1
            gone.good_here += 1

    @property
    def num_batches(self) -> int:
        """Batches up to the last one any request touched."""
        used = [i for i, b in enumerate(self._batches) if b is not None]
        return used[-1] + 1 if used else 0

    def batches(self) -> list[Batch]:
        """The first `num_batches` batches (an empty one where nothing fell)."""
        return [b if b is not None else Batch() for b in self._batches[: self.num_batches]]

    def latency(self, name: str, batches: Sequence[Batch] | None = None) -> Latency:
        """`name`'s samples over `batches` (default: all) merged."""
        chosen = self.batches() if batches is None else batches
        return Latency.merged(b.latency[name] for b in chosen if name in b.latency)

    def in_system_means(self) -> np.ndarray:
        """Each batch's time-average number of requests in the system (see the module)."""
        rows = self.batches()
        edges = self.width_s * np.arange(len(rows) + 1, dtype=np.float64)
        arr = _integral_to(edges, [b.arrived for b in rows], [b.arrival_sum_s for b in rows])
        left = _integral_to(edges, [b.left for b in rows], [b.left_sum_s for b in rows])
        # sum(min(leave, e)) - sum(min(arrival, e)) = integral of N(t) from 0 to e
        return np.diff(left - arr) / self.width_s


def _integral_to(edges: np.ndarray, counts: list[int], sums_s: list[float]) -> np.ndarray:
    """sum over samples of min(t, e) at each edge e, from per-batch counts and sums of t."""
    n = np.asarray(counts, dtype=np.float64)
    s = np.asarray(sums_s, dtype=np.float64)
    before_n = np.concatenate([[0.0], np.cumsum(n)])  # samples in batches before edge k
    before_s = np.concatenate([[0.0], np.cumsum(s)])
    return before_s + edges * (before_n[-1] - before_n)
