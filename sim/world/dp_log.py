"""What a lockstep group of data-parallel ranks leaves in the results: per-rank batch and
tokens in timeseries.csv, and the imbalance in summary.json.

Why a log of its own: the ranks' recorders (and the group's, which takes every rank's
steps as a fleet's recorder takes its replicas') see each rank's real steps only; the
imbalance is a property of the lockstep steps: which ranks ran a dummy batch, how many
tokens each brought, and how much of each step the slower ranks cost the faster ones.
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np

from sim.results.record.recorder import RunRecorder


class LockstepLog:
    """Each lockstep step: its start and duration, each rank's batch, tokens and own time."""

    __slots__ = ("ranks", "start_s", "duration_s", "batch", "tokens", "rank_s")

    def __init__(self, ranks: int) -> None:
        self.ranks = ranks
        self.start_s, self.duration_s = array("d"), array("d")
        self.batch, self.tokens = array("q"), array("q")  # ranks entries a step
        self.rank_s = array("d")

    def add(self, start_s: float, duration_s: float, batch: list[int], tokens: list[int],
            rank_s: list[float]) -> None:
        self.start_s.append(start_s)
        self.duration_s.append(duration_s)
        self.batch.extend(batch)
        self.tokens.extend(tokens)
        self.rank_s.extend(rank_s)

    def _matrix(self, column: array) -> np.ndarray:
        return np.frombuffer(column, dtype=column.typecode).reshape(-1, self.ranks) if len(
            column) else np.zeros((0, self.ranks))

    def summary(self) -> dict[str, Any]:
        """summary.json's `data_parallel` block: the ranks' load and what imbalance cost.

        token_imbalance: the mean over steps of (the busiest rank's tokens / the mean
        rank's), 1 when balanced, `ranks` when one rank does everything.
        time_lost_share: the share of the run's step time the ranks spent waiting for the
        slowest one (each step's slowest rank time minus the mean, over the step time)."""
        batch, tokens, rank_s = (self._matrix(c) for c in (self.batch, self.tokens,
                                                            self.rank_s))
        steps = len(self.start_s)
        busy_s = float(np.sum(np.frombuffer(self.duration_s))) if steps else 0.0
        mean_tokens = tokens.mean(axis=1) if steps else np.zeros(0)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(mean_tokens > 0, tokens.max(axis=1, initial=0)
                             / np.where(mean_tokens > 0, mean_tokens, 1), 1.0)
        lost_s = float(np.sum(rank_s.max(axis=1, initial=0) - rank_s.mean(axis=1))) \
            if steps else 0.0
        return {
            "ranks": self.ranks, "lockstep_steps": steps,
            "idle_rank_steps": int(np.sum(batch == 0)),
            "idle_rank_share": float(np.mean(batch == 0)) if steps else 0.0,
            "tokens_by_rank": [int(t) for t in tokens.sum(axis=0)],
            "mean_batch_by_rank": [float(b) for b in batch.mean(axis=0)] if steps
            else [0.0] * self.ranks,
            "token_imbalance": float(np.mean(ratio)) if steps else 1.0,
            "time_lost_share": lost_s / busy_s if busy_s else 0.0,
            "unvalidated": "no public per-step timings of DP+EP serving checked these "
                           "(docs/moe_dp_ep.md)",
        }

    def columns(self, width_s: float, bucket_starts_s: np.ndarray) -> dict[str, np.ndarray]:
        """rank<i>_mean_batch (busy-weighted) and rank<i>_tokens per time bucket of width
        `width_s` (a step in the bucket of its start, as sim.results.record.time_buckets),
        for the buckets starting at `bucket_starts_s`."""
        rows = np.rint(np.asarray(bucket_starts_s) / width_s).astype(np.int64)
        out: dict[str, np.ndarray] = {}
        if not len(self.start_s):
            for r in range(self.ranks):
                out[f"rank{r}_mean_batch"] = np.full(len(rows), np.nan)
                out[f"rank{r}_tokens"] = np.zeros(len(rows), dtype=np.int64)
            return out
        bucket = (np.frombuffer(self.start_s) * (1.0 / width_s)).astype(np.int64)
        duration = np.frombuffer(self.duration_s)
        size = int(max(bucket.max(), rows.max(initial=0))) + 1
        busy = np.bincount(bucket, weights=duration, minlength=size)[rows]
        batch, tokens = self._matrix(self.batch), self._matrix(self.tokens)
        for r in range(self.ranks):
            weighted = np.bincount(bucket, weights=batch[:, r] * duration, minlength=size)
            with np.errstate(invalid="ignore", divide="ignore"):
                out[f"rank{r}_mean_batch"] = np.where(busy > 0, weighted[rows] / busy, np.nan)
            out[f"rank{r}_tokens"] = np.bincount(
                bucket, weights=tokens[:, r], minlength=size)[rows].astype(np.int64)
        return out


class LockstepRecorder(RunRecorder):
    """The group's recorder: a fleet recorder whose time series gains each rank's columns."""

    __slots__ = ("lockstep",)

    def __init__(self, *args: Any, ranks: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lockstep = LockstepLog(ranks)

    def steps_columns(self) -> dict[str, np.ndarray]:
        columns = super().steps_columns()
        columns.update(self.lockstep.columns(self._series.width_s, columns["t_start_s"]))
        return columns
