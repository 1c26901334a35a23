"""Run recording and vLLM-style serving metrics.

The recorder sits in the simulator's hot loop, so it keeps no object per
request or step; the caller may drop each Request once recorded. Field names
and formulas follow vLLM's `benchmark_serving`: TTFT = first token - arrival,
TPOT = (E2EL - TTFT) / (output - 1) over requests with more than one output
token, E2EL = finish - arrival. Percentiles use numpy's default 'linear'
definition, as vLLM does, estimated by mergeable sketches within a relative
0.5% (sim.results.sketch); counts, sums, means, std, min and max are exact.

Requests: each is folded into its arrival time batch (sim.results.batches),
which gives the summary and the steady-state window, and its row goes to the
recorder's `rows`: kept in memory (`RequestLog`, the default), streamed to
requests.csv (`RequestCSV`) or dropped (None). A request leaves one tuple of its
fields (`RequestBlock`); blocks of 1,024 are folded in bulk, with the floats and
bytes of folding them one by one, and every read folds first. Streamed or dropped, memory
grows with requests in flight, not requests done; the SLO must then be given
up front, since goodput needs each request's latencies together. Steps are
not stored either: they wait in a fixed block of rows (sim.results.step_buffer)
and are folded in bulk when it fills or the recorder is read, with the floats
of folding them one by one.
Speculative decoding: a decode that emits several tokens at once is one ITL
sample of the step's duration (vLLM's benchmark convention: ITL is the gap
between deliveries a client sees; TPOT counts every token). `record_speculation`
keeps O(1) counters: drafted and accepted tokens and decode sequence-steps,
giving `spec_acceptance_rate` (accepted / drafted), `mean_tokens_per_seq_step`
(tokens each decoding sequence emitted per step, 1 without speculation) and
`mean_tokens_per_spec_step` (the same over sequences that drafted).

Pooled ITL: a step of duration d that runs k decodes contributes k samples of
value d to a `LogHistogram` (exact count/mean/std/min/max, percentiles within
a relative 5e-4). This equals vLLM's list of every gap between tokens
whenever each running sequence is in every step from its first token to its
finish (steps run back to back); the one gap it misses is a re-prefill after
preemption, which still shows in TPOT and E2EL. The time series is kept in
`TimeBuckets` (at most 2048 buckets whose width doubles as the run grows);
the summary's num_steps, mean_batch_size and max_kv_blocks_used are exact
running totals.

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

from sim.core.decode_run import DecodeRun
from sim.core.plan import StepPlan, StepResult
from sim.core.request import Request, RequestState
from sim.results.batches import RequestBatches, RequestTotals
from sim.results.inorder import add_in_order
from sim.results.itl_slices import ITLSlices
from sim.results.requests import RequestBlock, RequestCSV, RequestLog
from sim.results.slo import SLO
from sim.results.stats import LogHistogram, TimeBuckets
from sim.results.step_buffer import StepBuffer

if TYPE_CHECKING:
    import pandas as pd

KEEP = "keep"  # RunRecorder(rows=KEEP): the rows in memory (RequestLog)


def _rate(amount: float, duration_s: float) -> float:
    return amount / duration_s if duration_s > 0 else math.nan


class RunRecorder:
    """Requests in time batches (rows kept, streamed or dropped) and O(1)-size step stats."""

    __slots__ = ("_requests", "_stream", "_batches", "_totals", "_itl", "_series",
                 "_num_steps", "_busy_s",
                 "_batch_x_s", "_max_kv_blocks_used", "_padded_x_s", "_slot_steps",
                 "_useful_slot_steps", "_waste_x_s", "_swap_out_tokens", "_swap_in_tokens",
                 "_spec", "_extra_columns", "_itl_slices", "_steps", "_done")

    def __init__(self, max_buckets: int = 2048, bucket_width_s: float = 0.01, *,
                 rows: RequestCSV | str | None = KEEP, slo: SLO | None = None) -> None:
        self._requests = RequestLog() if rows == KEEP else None
        self._stream = rows if isinstance(rows, RequestCSV) else None
        # recorded requests not yet folded in (_fold_requests); the log keeps the drafts
        self._done = RequestBlock(self._requests is not None or (
            self._stream is not None and self._stream.speculation))
        self._batches = RequestBatches(slo)
        self._totals = RequestTotals()
        self._itl = LogHistogram()
        self._itl_slices = ITLSlices()  # the same gaps by time: the window's ITL (steady_state)
        self._series = TimeBuckets(max_buckets, bucket_width_s)
        self._steps = StepBuffer()  # recorded steps not yet folded into the three above
        self._num_steps = 0
        self._busy_s = 0.0
        self._batch_x_s = 0.0  # sum of batch size x step duration
        self._max_kv_blocks_used: int | None = None
        self._padded_x_s = 0.0  # sum of padded batch x step duration
        self._slot_steps = 0  # sum of padded batch over steps (exact count)
        self._useful_slot_steps = 0  # sum of batch size over steps
        self._waste_x_s = 0.0  # sum of max(0, held - live) x duration; held/live sums: _series
        self._swap_out_tokens = 0  # KV token slots swap preemption moved, from the shapes
        self._swap_in_tokens = 0
        # speculation: [decode seq-steps, drafting seq-steps, drafted, accepted]; None = off
        self._spec: list[int] | None = None
        self._extra_columns: pd.DataFrame | None = None  # add_columns (TTFT diagnosis)

    def record_finished(self, req: Request) -> None:
        if req.state is not RequestState.FINISHED:
            raise ValueError(f"request {req.request_id} is {req.state.value}, not finished")
        done = self._done
        done.append(req)
        if done.full:
            self._fold_requests()

    def record_rejected(self, req: Request) -> None:
        done = self._done
        done.append(req, req.rejection_reason or "unknown")
        if done.full:
            self._fold_requests()

    def _fold_requests(self) -> None:
        """The recorded requests into the time batches, the totals and the rows (kept or
        written), in the order they were recorded; every read of them folds first."""
        if not len(self._done):
            return
        rows = self._done.take()
        self._batches.add_many(rows.arrival_s, rows.first_scheduled_s, rows.first_token_s,
                               rows.finish_s, rows.output_tokens, rows.finished)
        self._totals.add_many(rows)
        if self._requests is not None:
            self._requests.extend(rows)
        if self._stream is not None:
            self._stream.write_rows(rows)

    def close(self) -> None:
        """Close the streamed requests.csv (if any): every row written is on disk."""
        self._fold_requests()
        if self._stream is not None:
            self._stream.close()

    def record_step(self, start_s: float, duration_s: float, plan: StepPlan,
                    num_waiting: int, num_running: int, kv_blocks_used: int,
                    kv_slots_held: int | None = None) -> None:
        """Fold one engine step into the aggregates; every decode emits, so decodes = ITL samples.

        `kv_slots_held`: KV token slots held while the step ran (read after
        schedule(), before on_step_done frees finished requests); None leaves
        the step out of the KV waste figures. Nothing per step is kept: the step
        waits in a fixed-size block (sim.results.step_buffer) folded in bulk.
        """
        shape = plan.shape
        decodes = shape.num_decodes
        batch_size = len(plan.request_ids)
        chunks = shape.prefill_chunk_tokens
        # decode-only steps (most of them) skip the 1.4 us count over a batch of 256
        if chunks:
            emitted = plan.emits_token.count(True)
            new_tokens = sum(chunks) + decodes
        else:
            emitted = new_tokens = decodes
        if shape.swap_out_tokens or shape.swap_in_tokens:
            self._swap_out_tokens += shape.swap_out_tokens
            self._swap_in_tokens += shape.swap_in_tokens
        padded = shape.padded_batch if shape.padded_batch > batch_size else batch_size
        if kv_slots_held is None:
            live = held = -1  # TimeBuckets: no KV waste sample
        else:
            held = kv_slots_held
            # from the plan's columns, not the shape: static batching's shape carries
            # padded work, and padding holds no live token
            live = sum(plan.context_tokens) + sum(plan.num_new_tokens)
        steps = self._steps
        steps.append(start_s, duration_s, batch_size, num_running, new_tokens, emitted,
                     decodes, padded, num_waiting, kv_blocks_used, held, live)
        if steps.full:
            self._fold()
        self._num_steps += 1
        self._slot_steps += padded
        self._useful_slot_steps += batch_size
        if self._max_kv_blocks_used is None or kv_blocks_used > self._max_kv_blocks_used:
            self._max_kv_blocks_used = kv_blocks_used

    def record_decode_run(self, run: DecodeRun, start_s: np.ndarray, duration_s: np.ndarray,
                          num_waiting: np.ndarray) -> None:
        """Fold the first len(duration_s) steps of a decode run into the aggregates, as
        record_step would one by one (the same floats, added in the same order)."""
        shape = run.shape
        n = shape.num_decodes
        padded = shape.padded_batch if shape.padded_batch > n else n
        steps = len(duration_s)
        used = run.kv_blocks_used[:steps]
        buffer = self._steps
        if buffer.size + steps < buffer.capacity:  # most runs: no fold
            buffer.append_run(start_s, duration_s, num_waiting, used, n, padded,
                              run.block_size, shape.decode_context_sum + n)
        else:  # in pieces that fit the block
            done = 0
            while done < steps:
                part = slice(done, done + min(steps - done, buffer.room()))
                buffer.append_run(start_s[part], duration_s[part], num_waiting[part],
                                  used[part], n, padded, run.block_size,
                                  shape.decode_context_sum + n * (done + 1))
                done = part.stop
                if buffer.full:
                    self._fold()
        self._num_steps += steps
        self._slot_steps += padded * steps
        self._useful_slot_steps += n * steps
        top = int(used[-1])  # blocks only grow during a run
        if self._max_kv_blocks_used is None or top > self._max_kv_blocks_used:
            self._max_kv_blocks_used = top

    def _fold(self) -> None:
        """The buffered steps into the ITL histogram and slices, the time series and the
        busy-time sums, in the order they were recorded."""
        steps = self._steps
        if not steps.size:
            return
        start_s, duration_s, c = steps.take()
        held, live, batch, padded = c["kv_held"], c["kv_live"], c["batch_size"], \
            c["padded_batch"]
        waste = np.maximum(held - live, 0)  # record_step's (held - live) where held > live
        terms = np.stack((duration_s, batch * duration_s, padded * duration_s,
                          waste * duration_s), axis=1)
        init = np.array([[self._busy_s, self._batch_x_s, self._padded_x_s, self._waste_x_s]])
        self._busy_s, self._batch_x_s, self._padded_x_s, self._waste_x_s = add_in_order(
            init, terms, np.zeros(1, dtype=np.int64))[0].tolist()
        decodes = c["decodes"]
        if int(decodes.min()) > 0:
            itl_start_s, gaps_s, weights = start_s, duration_s, decodes
        else:
            timed = decodes > 0
            itl_start_s, gaps_s, weights = start_s[timed], duration_s[timed], decodes[timed]
        self._itl.add_many(gaps_s, weights)
        self._itl_slices.add_many(itl_start_s, gaps_s, weights)
        self._series.add_many(start_s, duration_s, batch, c["num_waiting"], c["num_running"],
                              c["kv_blocks_used"], c["tokens"], c["tokens_emitted"], held,
                              live)

    def record_speculation(self, plan: StepPlan, result: StepResult) -> None:
        """Count one step's drafts and accepted tokens (called for every step while on)."""
        spec = self._spec
        if spec is None:
            spec = self._spec = [0, 0, 0, 0]
        spec[0] += plan.shape.num_decodes
        drafts = plan.num_spec_tokens
        if not drafts:
            return
        emitted = iter(result.num_emitted)
        for k, emits in zip(drafts, plan.emits_token, strict=True):
            count = next(emitted, 1) if emits else 0
            if k:
                spec[1] += 1
                spec[2] += k
                spec[3] += count - 1

    @property
    def num_requests(self) -> int:
        return self._totals.completed + self._totals.rejected + len(self._done)

    @property
    def num_steps(self) -> int:
        return self._num_steps

    @property
    def itl_slices(self) -> ITLSlices:
        self._fold()
        return self._itl_slices

    @property
    def streamed_to(self) -> Any:
        """The requests.csv the rows streamed to (a Path), or None."""
        return None if self._stream is None else self._stream.path

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
