"""RequestTotals: the recorded requests' exact run totals (counts, tokens, extremes).

Apart from sim.results.record.batches because these are whole-run sums the summary reports
as they are, not kept by time: no window or sketch is involved, so they fold with a
few numpy sums per block of requests.
"""

from __future__ import annotations

import math

import numpy as np

from sim.results.record.requests import RequestRows


class RequestTotals:
    """Exact run totals of the recorded requests (what the summary sums)."""

    __slots__ = ("completed", "rejected", "reasons", "input_tokens", "output_tokens",
                 "preemptions", "prefix_hit_tokens", "first_arrival_s", "first_finish_s",
                 "last_finish_s")

    def __init__(self) -> None:
        self.completed = self.rejected = self.input_tokens = self.output_tokens = 0
        self.preemptions = self.prefix_hit_tokens = 0
        self.reasons: dict[str, int] = {}
        self.first_arrival_s, self.last_finish_s = math.inf, -math.inf
        self.first_finish_s = math.inf

    def add_many(self, rows: RequestRows) -> None:
        """Recorded requests, as one add a request in order would count them."""
        if not len(rows):
            return
        first = min(rows.arrival_s.tolist())  # min and max keep the first extreme, as a loop
        if first < self.first_arrival_s:
            self.first_arrival_s = first
        finish = rows.finish_s
        known = finish[finish == finish].tolist()  # NaN: never finished
        if known and max(known) > self.last_finish_s:
            self.last_finish_s = max(known)
        if known and min(known) < self.first_finish_s:
            self.first_finish_s = min(known)
        for reason in rows.reasons.values():  # in row order
            self.rejected += 1
            self.reasons[reason] = self.reasons.get(reason, 0) + 1
        done = rows.finished
        self.completed += int(np.count_nonzero(done))
        self.input_tokens += int(rows.prompt_tokens[done].sum())
        self.output_tokens += int(rows.output_tokens[done].sum())
        self.preemptions += int(rows.preemptions[done].sum())
        self.prefix_hit_tokens += int(rows.prefix_hit_tokens[done].sum())
