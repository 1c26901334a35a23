"""The serving loop: HTTP arrivals fed to a scheduler on the wall clock, tokens handed back.

It keeps time by sim.core.drive's rules, so a simulation of the served arrivals
makes the very same plans (tests/test_serve.py replays the served log):
- an arrival is stamped on the server's clock when its HTTP headers are in
  (never before the request queued ahead of it); the scheduler gets it at the
  previous arrival's instant plus the gap (as drive and SimPy add it), never at
  or before an instant the loop has already admitted up to (sim.serve.arrivals);
- a step starts where the last one ended (back to back), or, after an idle
  wait, at the arrival or wakeup the wait was for; arrivals by the end of a
  step are added, at their own instants, before the step is applied;
- an abort (a client that went away) is applied between steps.

A backend's `Stepper` (sim.serve.stepper) runs one step: the simulated one holds it for the
latency model's prediction (sim.serve.simulated), the engine's runs the
kernels (sim.cli.serve_engine). The loop records every step and request as
`servesim run` does (sim.results.record.recording), for requests.csv and summary.json.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from sim.core.request import Request
from sim.results.record.recorder import RunRecorder
from sim.results.record.recording import record_step
from sim.serve.api import Generation
from sim.serve.arrivals import ArrivalClock
from sim.serve.metrics import ServeMetrics
from sim.serve.parallel import split_children
from sim.serve.stepper import StepDone, Stepper
from sim.serve.streams import Chunk, Ended, Group, Stream, advance_text, holdback
from sim.text.base import Tokenizer


class ServeLoop:
    """Owns the scheduler between HTTP handlers: submit(), abort(), and run() as a task."""

    def __init__(self, stepper: Stepper, tokenizer: Tokenizer,
                 on_step: Callable[[StepDone], None] | None = None,
                 max_model_len: int = 8192, engine_index: int = 0) -> None:
        self.stepper = stepper
        self.tokenizer = tokenizer
        self.recorder = RunRecorder()
        self.metrics = ServeMetrics(max_model_len, engine_index)
        self.on_step = on_step
        # stamped, not yet added: (stream, request, the instant the scheduler gets it)
        self._arrived: deque[tuple[Stream, Generation, float]] = deque()
        self._streams: dict[int, Stream] = {}
        self._groups: dict[int, Group] = {}  # request id -> its HTTP request's choices
        self._aborts: list[int] = []
        self._wake = asyncio.Event()
        self._next_id = 0
        self._arrivals = ArrivalClock()
        self._stopping = False
        self.end_s = 0.0
        # after each step, before its tokens are handed out (sim.serve.kv_events)
        self.kv_observer: Callable[[tuple[int, ...]], None] | None = None

    # -- called by the HTTP handlers --------------------------------------------
    def now(self) -> float:
        """The server's clock: what an arrival is stamped with."""
        return self.stepper.clock()

    def submit(self, generation: Generation, output_tokens: int,
               arrived_s: float | None = None) -> Group:
        """Queue a checked request as its n choices, all stamped with the same instant and
        added together; `arrived_s` (default now): when its HTTP request came in."""
        at_s, raw_s = self._arrivals.stamp(
            self.stepper.clock() if arrived_s is None else arrived_s)
        group = Group([], asyncio.Queue(), generation.n)
        children = split_children(self._next_id, generation.n, raw_s, generation.prompt_ids,
                                  output_tokens)
        self._next_id += generation.n
        for index, request in enumerate(children):
            child = generation if generation.n == 1 else replace(generation, child_index=index)
            stream = Stream(request, self.tokenizer.decoder_stream(), group.queue, index, child)
            group.streams.append(stream)
            self._groups[request.request_id] = group
            self._arrived.append((stream, child, at_s))
        self._wake.set()
        return group

    def abort(self, request_ids: list[int]) -> None:
        """The client went away: drop its requests at the next step boundary."""
        self._aborts.extend(request_ids)
        self._wake.set()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    def tokens_of(self, request_id: int) -> tuple[list[int], Request] | None:
        """A held request's prompt and output token ids so far, and the request."""
        stream = self._streams.get(request_id)
        if stream is None:
            return None
        prompt = stream.request.prompt_token_ids or ()
        return [*prompt, *stream.output_ids], stream.request

    @property
    def num_arrived(self) -> int:
        """Requests stamped but not yet added to the scheduler."""
        return len(self._arrived)

    @property
    def num_open_streams(self) -> int:
        return len(self._streams) + len(self._arrived)

    # -- the loop -----------------------------------------------------------------
    def _admit_until(self, t_s: float) -> None:
        self._arrivals.admitted_until(t_s)
        while self._arrived and self._arrived[0][2] <= t_s:
            stream, generation, at_s = self._arrived.popleft()
            request = stream.request
            if self.stepper.add(request, generation, at_s):
                self._streams[request.request_id] = stream
            else:
                self.recorder.record_rejected(request)
                self._end(stream, Ended(request, request.rejection_reason, stream.index))

    def _apply_aborts(self, now_s: float) -> None:
        aborts, self._aborts = self._aborts, []
        for rid in aborts:
            stream = self._streams.pop(rid, None)
            if stream is None:  # not added yet: it leaves the arrivals, unseen by the scheduler
                left = [a for a in self._arrived if a[0].request.request_id == rid]
                self._arrived = deque(a for a in self._arrived if a[0].request.request_id != rid)
                for gone, _, _ in left:
                    gone.request.abort(now_s)
                    self.recorder.record_rejected(gone.request)
                    self._end(gone, Ended(gone.request, "aborted", gone.index))
                continue
            request = self.stepper.abort(rid, now_s)
            if request is not None:
                self.recorder.record_rejected(request)
            self._end(stream, Ended(stream.request, "aborted", stream.index))

    def _end(self, stream: Stream, ended: Ended, reason: str | None = None) -> None:
        """A choice is over: its Ended is queued; `reason` (stop, length) when it finished.
        When the last choice of a request ends, the request's n and longest output go to
        the metrics, as vLLM's ParentRequest reports them."""
        rid = stream.request.request_id
        self.metrics.on_ended(rid)
        if reason is not None:
            self.metrics.on_finished(stream.request, reason, stream.emitted,
                                     stream.generation.max_tokens if stream.generation else None)
        stream.queue.put_nowait(ended)
        group = self._groups.pop(rid, None)
        if group is None:
            return
        group.open -= 1
        group.max_generated = max(group.max_generated, stream.emitted)
        if group.open == 0 and reason is not None:
            self.metrics.on_parent_finished(len(group.streams), group.max_generated)

    def _deliver(self, done: StepDone) -> None:
        end_s = done.start_s + done.duration_s
        stopped: list[Stream] = []
        first_prompt_tokens = 0
        emitted_now = 0
        for rid, token_id in done.tokens:
            stream = self._streams.get(rid)
            if stream is None or stream.stopped or stream.emitted >= stream.request.output_tokens:
                continue  # verified drafts past the scripted length (or a stop) are dropped
            position = stream.emitted
            stream.emitted += 1
            stream.output_ids.append(token_id)
            emitted_now += 1
            if position == 0:
                first_prompt_tokens += stream.request.prompt_tokens - \
                    stream.request.prefix_hit_tokens
            finish = advance_text(stream, token_id)
            self.metrics.on_token(stream.request, end_s, position == 0)
            limit = len(stream.text) if finish else max(
                stream.sent, len(stream.text) - holdback(stream))
            piece, stream.sent = stream.text[stream.sent:limit], limit
            stream.queue.put_nowait(Chunk(piece, token_id, stream.index, position, end_s,
                                          finish, done.logprobs.get(rid) if done.logprobs
                                          else None))
            if finish == "stop":
                stream.stopped = True
                stopped.append(stream)
        self.metrics.on_step(done.plan, first_prompt_tokens + emitted_now)
        finished_ids = set()
        for request in done.finished:
            finished_ids.add(request.request_id)
            stream = self._streams.pop(request.request_id, None)
            if stream is not None:
                self._end(stream, Ended(request, None, stream.index),
                          "stop" if stream.stopped else "length")
        for stream in stopped:  # vLLM's frontend finds the stop, then aborts it in the engine
            rid = stream.request.request_id
            if rid in finished_ids or self._streams.pop(rid, None) is None:
                continue
            request = self.stepper.abort(rid, end_s)
            if request is not None:
                request.rejection_reason = "stop"
                self.recorder.record_rejected(request)
            self._end(stream, Ended(stream.request, None, stream.index), "stop")

    async def run(self) -> None:
        """Serve until stop(); a step in flight completes, then every open stream is ended."""
        try:
            await self._serve()
        finally:  # stopped, or a step failed: no stream is left hanging
            self._close_streams(self.end_s)

    async def _serve(self) -> None:
        stepper, scheduler = self.stepper, self.stepper.scheduler
        now_s = 0.0
        while not self._stopping:
            self._apply_aborts(now_s)
            done = await stepper.step(now_s, self._admit_until)
            if done is not None:
                now_s = done.start_s + done.duration_s
                record_step((self.recorder,), scheduler, done.start_s, done.duration_s,
                            done.plan, done.finished, done.kv_slots_held, done.result)
                if self.kv_observer is not None:
                    self.kv_observer(done.plan.request_ids)
                self._deliver(done)
                if self.on_step is not None:
                    self.on_step(done)
                self.end_s = now_s
                continue
            now_s = self.end_s = await self._idle(now_s)

    async def _idle(self, now_s: float) -> float:
        """Wait for an arrival, an abort or the scheduler's wakeup; returns the new instant."""
        wakeup_s = self.stepper.scheduler.next_wakeup(now_s)
        while not self._stopping:
            if self._aborts:
                return now_s
            targets = [] if wakeup_s is None else [max(now_s, wakeup_s)]
            if self._arrived:
                targets.append(max(now_s, self._arrived[0][2]))
            clock_s = self.stepper.clock()
            if targets and (target_s := min(targets)) <= clock_s:
                self._admit_until(target_s)
                return target_s
            self._wake.clear()
            timeout_s = None if not targets else min(targets) - clock_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout_s)
        return now_s

    def _close_streams(self, now_s: float) -> None:
        """Shutting down: every request still held is aborted and its stream ended."""
        self._aborts.extend(self._streams)
        self._apply_aborts(now_s)
        for stream, _, _ in self._arrived:
            self._end(stream, Ended(stream.request, "the server is shutting down", stream.index))
        self._arrived.clear()
