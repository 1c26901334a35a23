"""Run recording: requests and steps folded into bounded aggregates as the run goes.

The recorder sits in the simulator's hot loop, so it keeps no object per
request or step; the caller may drop each Request once recorded. What it
reports from them (vLLM's summary figures, the frames) is read by
sim.results.record.reads, whose docstring defines each figure.

Requests: each is folded into its arrival time batch (sim.results.record.batches),
which gives the summary and the steady-state window, and its row goes to the
recorder's `rows`: kept in memory (`RequestLog`, the default), streamed to
requests.csv (`RequestCSV`) or dropped (None). A request leaves one tuple of its
fields (`RequestBlock`); blocks of 1,024 are folded in bulk, with the floats and
bytes of folding them one by one, and every read folds first. Streamed or dropped, memory
grows with requests in flight, not requests done; the SLO must then be given
up front, since goodput needs each request's latencies together. Steps are
not stored either: they wait in a fixed block of rows (sim.results.record.step_buffer)
and are folded in bulk when it fills or the recorder is read, with the floats
of folding them one by one.

Pooled ITL: a step of duration d that runs k decodes contributes k samples of
value d to a `LogHistogram` (exact count/mean/std/min/max, percentiles within
a relative 5e-4). This equals vLLM's list of every gap between tokens
whenever each running sequence is in every step from its first token to its
finish (steps run back to back); the one gap it misses is a re-prefill after
preemption, which still shows in TPOT and E2EL. The time series is kept in
`TimeBuckets` (at most 2048 buckets whose width doubles as the run grows);
the summary's num_steps, mean_batch_size and max_kv_blocks_used are exact
running totals.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from sim.core.decode_run import DecodeRun
from sim.core.plan import StepPlan, StepResult
from sim.core.request import Request, RequestState
from sim.results.record.batches import RequestBatches
from sim.results.record.itl_slices import ITLSlices
from sim.results.record.reads import RecorderReads
from sim.results.record.request_totals import RequestTotals
from sim.results.record.requests import RequestBlock, RequestCSV, RequestLog
from sim.results.record.step_buffer import StepBuffer
from sim.results.record.time_buckets import TimeBuckets
from sim.results.stats.inorder import add_in_order
from sim.results.stats.percentiles import LogHistogram
from sim.results.stats.slo import SLO

if TYPE_CHECKING:
    import pandas as pd

KEEP = "keep"  # RunRecorder(rows=KEEP): the rows in memory (RequestLog)


class RunRecorder(RecorderReads):
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
        waits in a fixed-size block (sim.results.record.step_buffer) folded in bulk.
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
