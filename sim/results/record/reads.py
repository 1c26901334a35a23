"""What a RunRecorder reports: vLLM-style serving metrics, its requests and its time series.

Apart from sim.results.record.recorder because reading is not recording: these methods run
once a run (or a window) is read, never in the hot loop, and hold the figures'
definitions. `RecorderReads` keeps no state of its own; RunRecorder, which holds the
aggregates and folds before every read, inherits them.

Field names and formulas follow vLLM's `benchmark_serving`: TTFT = first token -
arrival, TPOT = (E2EL - TTFT) / (output - 1) over requests with more than one output
token, E2EL = finish - arrival. Percentiles use numpy's default 'linear'
definition, as vLLM does, estimated by mergeable sketches within a relative
0.5% (sim.results.stats.sketch); counts, sums, means, std, min and max are exact.

Speculative decoding: a decode that emits several tokens at once is one ITL
sample of the step's duration (vLLM's benchmark convention: ITL is the gap
between deliveries a client sees; TPOT counts every token). `record_speculation`
keeps O(1) counters: drafted and accepted tokens and decode sequence-steps,
giving `spec_acceptance_rate` (accepted / drafted), `mean_tokens_per_seq_step`
(tokens each decoding sequence emitted per step, 1 without speculation) and
`mean_tokens_per_spec_step` (the same over sequences that drafted).

Waste is measured from the steps that ran, time-averaged over busy time (each
step weighted by its duration; idle gaps, when nothing is held for a running
batch, are left out):
- slot utilisation = sum(batch_size * d) / sum(padded_batch * d): the share of
  the kernels' sequence slots doing real work (static batching pads finished
  members). Slot level, not token level: a padded slot costs one token in a
  decode step, so the two agree on decode steps, and `StepShape` does not
  describe prompt padding that a token-level figure would need.
- live KV tokens of a step = what its sequences have in KV once it ran:
  sum(prefill contexts + chunks) + decode context sum + decodes, straight from
  `StepShape`. With `kv_slots_held` (token slots the scheduler holds while the
  step runs: used blocks x block size when paged, the reservations when
  contiguous) KV waste = held - live, reported as a share of the pool
  (`kv_waste_fraction`) and of what was held (`kv_waste_of_held`). In paged mode
  this is exactly the internal fragmentation of each sequence's last block
  (plus blocks of running sequences left out of a step). Tokens shared through
  the prefix cache count once per sequence in live, so a step's waste is
  clamped at 0 rather than going negative.

Prefix caching and preemption: `prefix_hit_rate` = prompt tokens served from
the cache at each request's first admission / prompt tokens (finished
requests), `prefill_tokens_saved` the numerator; evictions and recomputed
tokens are counters of the pool and scheduler that the caller passes in.
Swapped KV is summed from the steps' shapes (token slots; bytes given the
KV bytes per token).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.results.record.batches import RequestBatches
from sim.results.record.requests import RequestCSV, RequestLog
from sim.results.stats.slo import SLO

if TYPE_CHECKING:
    import pandas as pd

    from sim.results.record.request_totals import RequestTotals
    from sim.results.record.time_buckets import TimeBuckets
    from sim.results.stats.percentiles import LogHistogram


def _rate(amount: float, duration_s: float) -> float:
    return amount / duration_s if duration_s > 0 else math.nan


class RecorderReads:
    """RunRecorder's read side: the summary, its requests' rows and batches, the series.

    The state annotated here is RunRecorder's (its __slots__); `_fold` and
    `_fold_requests` are its folds, run before every read."""

    __slots__ = ()
    _requests: RequestLog | None
    _stream: RequestCSV | None
    _batches: RequestBatches
    _totals: RequestTotals
    _itl: LogHistogram
    _series: TimeBuckets
    _num_steps: int
    _busy_s: float
    _batch_x_s: float
    _max_kv_blocks_used: int | None
    _padded_x_s: float
    _slot_steps: int
    _useful_slot_steps: int
    _waste_x_s: float
    _swap_out_tokens: int
    _swap_in_tokens: int
    _spec: list[int] | None
    _extra_columns: pd.DataFrame | None

    @property
    def finish_span_s(self) -> float:
        """Last finish minus first finish over the recorded requests with a finish time (0.0
        with none): exact, from the totals, whether the rows are kept, streamed or dropped."""
        self._fold_requests()
        t = self._totals
        return t.last_finish_s - t.first_finish_s if math.isfinite(t.last_finish_s) else 0.0

    def request_arrays(self) -> dict[str, np.ndarray]:
        """The recorded requests' columns and derived latencies (RequestLog.arrays); only
        for a recorder that keeps its rows."""
        return self._log().arrays()

    def _log(self) -> RequestLog:
        if self._requests is None:
            raise ValueError("this recorder keeps no request rows (streamed or dropped)")
        self._fold_requests()
        return self._requests

    def request_batches(self, slo: SLO | None = None) -> RequestBatches:
        """The requests' time batches, counting goodput by `slo` (default the recorder's).

        A recorder that keeps its rows folds them again for another SLO (the same
        rows in the same order give the same batches); one that does not refuses.
        """
        want = slo if slo is not None and slo.has_bounds else None
        if want == self._batches.slo:
            self._fold_requests()
            return self._batches
        batches = RequestBatches(want)
        r = self._log().arrays()
        batches.add_many(r["arrival_s"], r["first_scheduled_s"], r["first_token_s"],
                         r["finish_s"], r["output_tokens"], r["finished"])
        return batches

    def summary(self, slo: SLO | None = None, kv_blocks_total: int | None = None,
                block_size: int | None = None, *, prefix_caching: bool = False,
                cache_evictions: int | None = None, recomputed_tokens: int | None = None,
                kv_bytes_per_token: float | None = None) -> dict[str, Any]:
        """vLLM `benchmark_serving` fields plus queue, preemption, batch, KV and waste figures.

        The KV pool in token slots is kv_blocks_total x block_size; without both,
        only `kv_waste_of_held` (which needs no pool) is reported. The keyword
        arguments come from the pool and scheduler (see the module docstring);
        swapped bytes need `kv_bytes_per_token` (else NaN).
        """
        self._fold()
        self._fold_requests()
        t = self._totals
        completed, rejected = t.completed, t.rejected
        duration_s = (t.last_finish_s - t.first_arrival_s
                      if math.isfinite(t.last_finish_s) else math.nan)
        input_tokens, output_tokens = t.input_tokens, t.output_tokens
        out: dict[str, Any] = {
            "duration": duration_s,
            "completed": completed,
            "rejected": rejected,
            "rejection_reasons": dict(t.reasons),
            "total_input_tokens": input_tokens,
            "total_output_tokens": output_tokens,
            "request_throughput": _rate(completed, duration_s),
            "output_throughput": _rate(output_tokens, duration_s),
            "total_token_throughput": _rate(input_tokens + output_tokens, duration_s),
        }
        batches = self.request_batches(slo)
        if batches.slo is not None:
            good = sum(b.good for b in batches.batches())
            out["request_goodput"] = _rate(good, duration_s)
            offered = completed + rejected
            out["slo_attainment"] = good / offered if offered else math.nan
        groups = {"ttft": batches.latency("ttft").describe_ms(),
                  "tpot": batches.latency("tpot").describe_ms(),
                  "itl": self._itl.describe_ms(), "e2el": batches.latency("e2el").describe_ms(),
                  "queue": batches.latency("queue").describe_ms()}
        for metric, stats in groups.items():
            for stat, x in stats.items():
                out[f"{stat}_{metric}_ms"] = x
        out["total_preemptions"] = t.preemptions
        hit_tokens = t.prefix_hit_tokens
        out["total_prefix_hit_tokens"] = hit_tokens
        out["prefix_caching"] = prefix_caching
        out["prefix_hit_rate"] = hit_tokens / input_tokens if input_tokens else math.nan
        out["prefill_tokens_saved"] = hit_tokens
        out["cache_evictions"] = cache_evictions
        out["recomputed_tokens"] = recomputed_tokens
        out["swapped_out_tokens"] = self._swap_out_tokens
        out["swapped_in_tokens"] = self._swap_in_tokens
        per_token = math.nan if kv_bytes_per_token is None else kv_bytes_per_token
        out["swapped_out_bytes"] = self._swap_out_tokens * per_token
        out["swapped_in_bytes"] = self._swap_in_tokens * per_token
        if self._spec is not None:
            out.update(_speculation(*self._spec))
        out["num_steps"] = self.num_steps
        out["mean_batch_size"] = self._batch_x_s / self._busy_s if self._busy_s > 0 else math.nan
        out["max_kv_blocks_used"] = self._max_kv_blocks_used
        # peak running sequences: the concurrency KV memory and max_num_seqs allowed
        out["max_num_running"] = int(self._series.max_running.max()) if self._num_steps else 0
        if kv_blocks_total is not None:
            out["kv_blocks_total"] = kv_blocks_total
        out.update(self._waste(kv_blocks_total, block_size))
        return out

    def _waste(self, kv_blocks_total: int | None, block_size: int | None) -> dict[str, Any]:
        """Busy-time averages of slot use and KV waste (see the module docstring)."""
        nan = math.nan
        pool = kv_blocks_total * block_size if kv_blocks_total and block_size else None
        # bucket merges add sums exactly, so the series' totals are the run's
        kv_s, held = math.fsum(self._series.kv_busy_s), math.fsum(self._series.held_x_s)
        live = math.fsum(self._series.live_x_s)
        return {
            # per iteration, as the formula reads: useful slot-steps / slot-steps
            "slot_utilization": (self._useful_slot_steps / self._slot_steps
                                 if self._slot_steps else nan),
            # the same weighted by step duration (long padded prefills count for more)
            "slot_utilization_time_weighted": (self._batch_x_s / self._padded_x_s
                                               if self._padded_x_s else nan),
            "slot_steps_total": self._slot_steps,
            "slot_steps_useful": self._useful_slot_steps,
            "kv_pool_tokens": pool,
            "mean_kv_slots_held": held / kv_s if kv_s else nan,
            "mean_kv_live_tokens": live / kv_s if kv_s else nan,
            "kv_waste_fraction": self._waste_x_s / (pool * kv_s) if pool and kv_s else nan,
            "kv_waste_of_held": self._waste_x_s / held if held else nan,
        }

    def requests_frame(self) -> pd.DataFrame:
        """One row per recorded request (finished and rejected), latencies in ms; streamed
        rows are read back from requests.csv (after close())."""
        if self._stream is not None:
            import pandas as pd

            self._fold_requests()  # (after close() every row is on disk)
            return pd.read_csv(self._stream.path)
        return self._log().frame(self._spec is not None, self._extra_columns)

    def add_columns(self, columns: pd.DataFrame) -> None:
        """Per-request columns keyed by `request_id` (e.g. the TTFT diagnosis), joined into
        requests_frame(); requests without a row get NaN. Replaces earlier ones."""
        self._extra_columns = columns

    def steps_frame(self) -> pd.DataFrame:
        """The time series, one row per non-empty time bucket (see `TimeBuckets`)."""
        import pandas as pd

        return pd.DataFrame(self.steps_columns())

    def steps_columns(self) -> dict[str, np.ndarray]:
        """steps_frame()'s columns, without pandas."""
        self._fold()
        return self._series.frame()


def _or_nan(x: float | None) -> float:
    return math.nan if x is None else x


def _speculation(decode_steps: int, spec_steps: int, drafted: int, accepted: int
                 ) -> dict[str, Any]:
    """The summary's speculative-decoding fields from the recorder's counters."""
    return {
        "spec_draft_tokens": drafted,
        "spec_accepted_tokens": accepted,
        "spec_acceptance_rate": accepted / drafted if drafted else math.nan,
        "mean_tokens_per_seq_step": (decode_steps + accepted) / decode_steps
        if decode_steps else math.nan,
        "mean_tokens_per_spec_step": (spec_steps + accepted) / spec_steps
        if spec_steps else math.nan,
    }
