"""Finished and rejected requests folded into time batches: the summary's and the window's
latencies without one row per request in memory.

Why batches: the measurement window (sim.results.files.steady) is chosen after the
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from sim.results.stats.inorder import add_in_order
from sim.results.stats.latency_samples import Latency
from sim.results.stats.sketch import add_grouped
from sim.results.stats.slo import SLO

METRICS = ("ttft", "tpot", "e2el", "queue")


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


@dataclass(frozen=True, slots=True)
class BatchSeries:
    """The batches as the run's statistics read them, taken once when the run is over:
    the window, its intervals and its trend test (sim.results.files.steady) compute from
    this value alone and never call back into the recorder."""

    rows: list[Batch]  # the first `num_batches` batches, an empty one where nothing fell
    width_s: float
    first_arrival_s: float
    last_arrival_s: float
    in_system: np.ndarray  # each batch's time-average number of requests in the system
    with_slo: bool  # the batches count good requests (goodput, attainment)


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

    def add_many(self, arrival_s: np.ndarray, first_scheduled_s: np.ndarray,
                 first_token_s: np.ndarray, finish_s: np.ndarray, output_tokens: np.ndarray,
                 finished: np.ndarray) -> None:
        """add() for each request in order, in bulk: the same batches, counts and floats.

        The requests go in pieces between the widenings add() makes (before the same
        request), so within a piece every batch is of one width; a batch's sums add its
        requests' times in order (`add_in_order`) and its latencies' moments follow them
        one by one (`Moments.add_all`); the sketches take the samples after the last
        widening (`add_grouped`).
        """
        leave_s = np.where(finished, finish_s, arrival_s)
        total, pos, top = len(arrival_s), 0, self.max_batches
        samples: list[tuple[float, dict[str, tuple[np.ndarray, np.ndarray]]]] = []
        while pos < total:
            with np.errstate(invalid="ignore"):  # NaN: refused below, as add() does
                gone = (leave_s[pos:] / self.width_s).astype(np.int64)
                here = (arrival_s[pos:] / self.width_s).astype(np.int64)
            outside = np.flatnonzero((gone >= top) | (here >= top) | (gone < 0) | (here < 0))
            stop = pos + (int(outside[0]) if outside.size else total - pos)
            if stop == pos:  # as add(): widen for its leave time, then its arrival (or refuse)
                self._batch(float(leave_s[pos]))
                self._batch(float(arrival_s[pos]))
                continue
            part = slice(pos, stop)
            samples.append((self.width_s, self._add_covered(
                here[:stop - pos], gone[:stop - pos], arrival_s[part], leave_s[part],
                first_scheduled_s[part], first_token_s[part], finish_s[part],
                output_tokens[part], finished[part])))
            pos = stop
        # the sketches' samples go in after the widenings, at the final width (a batch of
        # a piece is batch // 2^(widenings since)): a sketch's counts, min and max do not
        # depend on the order or the merges they came by, so no merge carries them
        for name in METRICS:
            pieces = [(by_metric[name], round(self.width_s / width_s))
                      for width_s, by_metric in samples if name in by_metric]
            if pieces:
                add_grouped(lambda i, name=name: self._batches[i].latency[name].sketch,
                            np.concatenate([at // widened for (at, _), widened in pieces]),
                            np.concatenate([clamped for (_, clamped), _ in pieces]))

    def _add_covered(self, here: np.ndarray, gone: np.ndarray, arrival_s: np.ndarray,
                     leave_s: np.ndarray, first_scheduled_s: np.ndarray,
                     first_token_s: np.ndarray, finish_s: np.ndarray,
                     output_tokens: np.ndarray, finished: np.ndarray
                     ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Requests whose arrival and leave batches `here` and `gone` are covered; their
        latencies' moments go in here, and their samples (batch, clamped value) by metric
        come back for the sketches (`add_grouped`)."""
        batches = self._batches
        for i in {*here.tolist(), *gone.tolist()}:
            if batches[i] is None:
                batches[i] = Batch()
        for i, count, total_s in _grouped(here, arrival_s, lambda i: batches[i].arrival_sum_s):
            b = batches[i]
            b.arrived += count  # type: ignore[union-attr]
            b.arrival_sum_s = total_s  # type: ignore[union-attr]
        for i, count, total_s in _grouped(gone, leave_s, lambda i: batches[i].left_sum_s):
            b = batches[i]
            b.left += count  # type: ignore[union-attr]
            b.left_sum_s = total_s  # type: ignore[union-attr]
        arrivals = arrival_s.tolist()
        self.first_arrival_s = min(self.first_arrival_s, min(arrivals))
        self.last_arrival_s = max(self.last_arrival_s, max(arrivals))
        self.last_leave_s = max(self.last_leave_s, max(leave_s.tolist()))
        if not finished.any():
            return {}
        done, a = finished, arrival_s
        ttft, e2el, out = first_token_s - a, finish_s - a, output_tokens
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(out > 1, (e2el - ttft) / np.maximum(out - 1, 1), math.nan)
        for i, count in _counts(here[done]):
            batches[i].finished += count  # type: ignore[union-attr]
        for i, count in _counts(gone[done]):
            batches[i].done_here += count  # type: ignore[union-attr]
        slo = self.slo
        if slo is not None:
            with np.errstate(invalid="ignore"):
                good = done.copy()
                if slo.ttft_ms is not None:
                    good &= ttft * 1e3 <= slo.ttft_ms
                if slo.tpot_ms is not None:
                    good &= np.isnan(tpot) | (tpot * 1e3 <= slo.tpot_ms)
                if slo.e2el_ms is not None:
                    good &= e2el * 1e3 <= slo.e2el_ms
            for i, count in _counts(here[good]):
                batches[i].good += count  # type: ignore[union-attr]
            for i, count in _counts(gone[good]):
                batches[i].good_here += count  # type: ignore[union-attr]
        samples: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for name, x in (("ttft", ttft), ("tpot", tpot), ("e2el", e2el),
                        ("queue", first_scheduled_s - a)):
            keep = done & (x == x)  # not NaN
            values, at = x[keep], here[keep]
            if not at.size:
                continue
            order = np.argsort(at, kind="stable")  # each batch's samples in their order
            ordered = at[order]
            starts = np.flatnonzero(np.diff(ordered, prepend=-1))
            ends = [*starts[1:].tolist(), len(ordered)]
            listed = values[order].tolist()
            for i, lo, hi in zip(ordered[starts].tolist(), starts.tolist(), ends, strict=True):
                latency = batches[i].latency  # type: ignore[union-attr]
                part = latency.get(name)
                if part is None:
                    part = latency[name] = Latency()
                part.moments.add_all(listed[lo:hi])
            samples[name] = (at, np.where(values > 0.0, values, 0.0))  # as Latency.add clamps
        return samples

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

    def series(self) -> BatchSeries:
        """What the statistics read, in one value (see `BatchSeries`)."""
        rows = self.batches()
        return BatchSeries(rows, self.width_s, self.first_arrival_s, self.last_arrival_s,
                           self._in_system(rows), self.slo is not None)

    def in_system_means(self) -> np.ndarray:
        """Each batch's time-average number of requests in the system (see the module)."""
        return self._in_system(self.batches())

    def _in_system(self, rows: list[Batch]) -> np.ndarray:
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


def _counts(index: np.ndarray) -> zip:
    """(batch, how many) for each batch in `index`."""
    batches, counts = np.unique(index, return_counts=True)
    return zip(batches.tolist(), counts.tolist(), strict=True)


def _grouped(index: np.ndarray, values_s: np.ndarray, start_of: Callable[[int], float]
             ) -> zip:
    """(batch, count, its sum) for each batch in `index`: the sum from `start_of(batch)`
    plus its `values_s` added in order, as a loop over the requests adds them."""
    order = np.argsort(index, kind="stable")
    at = index[order]
    starts = np.flatnonzero(np.diff(at, prepend=-1))
    batches = at[starts].tolist()
    init = np.array([[start_of(i)] for i in batches])
    sums = add_in_order(init, values_s[order][:, None], starts)[:, 0].tolist()
    counts = np.diff(starts, append=len(at)).tolist()
    return zip(batches, counts, sums, strict=True)
