"""The serving loop: HTTP arrivals fed to a scheduler on the wall clock, tokens handed back.

It keeps time by sim.core.drive's rules, so a simulation of the served arrivals
makes the very same plans (tests/test_serve.py replays the served log):
- an arrival is stamped on the server's clock when its HTTP headers are in
  (never before the request queued ahead of it); the scheduler gets it at the
  previous arrival's instant plus the gap (as drive and SimPy add it), never at
  or before an instant the loop has already admitted up to;
- a step starts where the last one ended (back to back), or, after an idle
  wait, at the arrival or wakeup the wait was for; arrivals by the end of a
  step are added, at their own instants, before the step is applied;
- an abort (a client that went away) is applied between steps.

A backend's `Stepper` runs one step: the simulated one holds it for the
latency model's prediction (sim.serve.simulated), the engine's runs the
kernels (sim.cli.serve_engine). The loop records every step and request as
`servesim run` does (sim.results.record.recording), for requests.csv and summary.json.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from sim.core.kv import KVManager
from sim.core.plan import StepPlan, StepResult
from sim.core.request import Request
from sim.core.schedulers.base import Scheduler
from sim.results.record.recorder import RunRecorder
from sim.results.record.recording import record_step
from sim.serve.api import Generation
from sim.serve.metrics import ServeMetrics
from sim.text.base import DecoderStream, Tokenizer


@dataclass(frozen=True, slots=True)
class StepDone:
    """One applied step: when it ran, its plan, who finished, the tokens it emitted in order."""

    start_s: float
    duration_s: float
    plan: StepPlan
    finished: list[Request]
    tokens: list[tuple[int, int]]  # (request id, token id)
    kv_slots_held: int
    result: StepResult | None = None  # speculation's counts, to record


class Stepper(Protocol):
    """A backend: its scheduler and KV pool, its clock (seconds since the server started),
    one step."""

    scheduler: Scheduler
    kv: KVManager

    def clock(self) -> float: ...

    def add(self, request: Request, generation: Generation, at_s: float) -> bool: ...

    def abort(self, request_id: int, at_s: float) -> Request | None: ...

    async def step(self, start_s: float, admit_until: Callable[[float], None]
                   ) -> StepDone | None: ...


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of one stream: text (may be empty while a character is incomplete)."""

    text: str
    token_id: int
    index: int
    time_s: float
    finished: bool


@dataclass(frozen=True, slots=True)
class Ended:
    """The end of one stream: the request, and why it ended early (None: it finished)."""

    request: Request
    error: str | None = None


@dataclass(slots=True, eq=False)
class Stream:
    """One request's queue of Chunks, then one Ended."""

    request: Request
    decoder: DecoderStream
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    emitted: int = 0


class ServeLoop:
    """Owns the scheduler between HTTP handlers: submit(), abort(), and run() as a task."""

    def __init__(self, stepper: Stepper, tokenizer: Tokenizer,
                 on_step: Callable[[StepDone], None] | None = None) -> None:
        self.stepper = stepper
        self.tokenizer = tokenizer
        self.recorder = RunRecorder()
        self.metrics = ServeMetrics()
        self.on_step = on_step
        # stamped, not yet added: (stream, request, the instant the scheduler gets it)
        self._arrived: deque[tuple[Stream, Generation, float]] = deque()
        self._streams: dict[int, Stream] = {}
        self._aborts: list[int] = []
        self._wake = asyncio.Event()
        self._next_id = 0
        self._last_arrival_s = 0.0  # the last arrival's instant, as drive accumulates them
        self._last_raw_s = 0.0  # and its stamp
        self._admitted_s = -math.inf  # arrivals up to here have been added
        self._stopping = False
        self.end_s = 0.0

    # -- called by the HTTP handlers --------------------------------------------
    def now(self) -> float:
        """The server's clock: what an arrival is stamped with."""
        return self.stepper.clock()

    def submit(self, generation: Generation, output_tokens: int,
               arrived_s: float | None = None) -> Stream:
        """Queue a checked request; `arrived_s` (default now): when its HTTP request came in."""
        raw_s = self.stepper.clock() if arrived_s is None else arrived_s
        # in queue order: a request whose body was read faster than its predecessor's
        # is stamped with that one's instant, so a replay sorted by arrival keeps the order
        raw_s = max(raw_s, self._last_raw_s)
        while (at_s := self._accumulate(raw_s)) <= self._admitted_s:
            raw_s = math.nextafter(max(raw_s, self._admitted_s), math.inf)
        self._last_arrival_s, self._last_raw_s = at_s, raw_s
        request = Request(self._next_id, raw_s, len(generation.prompt_ids), output_tokens,
                          prompt_token_ids=generation.prompt_ids)
        self._next_id += 1
        stream = Stream(request, self.tokenizer.decoder_stream())
        self._arrived.append((stream, generation, at_s))
        self._wake.set()
        return stream

    def _accumulate(self, raw_s: float) -> float:
        """The instant drive() gives an arrival: the previous one plus the gap, as SimPy adds."""
        gap_s = raw_s - self._last_arrival_s
        return self._last_arrival_s + gap_s if gap_s > 0 else self._last_arrival_s

    def abort(self, request_id: int) -> None:
        """The client went away: drop the request at the next step boundary."""
        self._aborts.append(request_id)
        self._wake.set()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    @property
    def num_open_streams(self) -> int:
        return len(self._streams) + len(self._arrived)

    # -- the loop -----------------------------------------------------------------
    def _admit_until(self, t_s: float) -> None:
        self._admitted_s = max(self._admitted_s, t_s)
        while self._arrived and self._arrived[0][2] <= t_s:
            stream, generation, at_s = self._arrived.popleft()
            request = stream.request
            if self.stepper.add(request, generation, at_s):
                self._streams[request.request_id] = stream
            else:
                self.recorder.record_rejected(request)
                stream.queue.put_nowait(Ended(request, request.rejection_reason))

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
                    self.metrics.on_aborted(rid)
                continue
            request = self.stepper.abort(rid, now_s)
            if request is not None:
                self.recorder.record_rejected(request)
                self.metrics.on_aborted(rid)
            stream.queue.put_nowait(Ended(stream.request, "aborted"))

    def _deliver(self, done: StepDone) -> None:
        end_s = done.start_s + done.duration_s
        for rid, token_id in done.tokens:
            stream = self._streams.get(rid)
            if stream is None or stream.emitted >= stream.request.output_tokens:
                continue  # verified drafts past the scripted length are dropped
            index = stream.emitted
            stream.emitted += 1
            finished = stream.emitted >= stream.request.output_tokens
            text = stream.decoder.feed(token_id)
            if finished:
                text += stream.decoder.flush()
            self.metrics.on_token(rid, end_s, stream.request.arrival_s, index == 0)
            stream.queue.put_nowait(Chunk(text, token_id, index, end_s, finished))
        for request in done.finished:
            stream = self._streams.pop(request.request_id, None)
            self.metrics.on_finished(request)
            if stream is not None:
                stream.queue.put_nowait(Ended(request))

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
                self.metrics.on_step(done.plan)
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
            stream.queue.put_nowait(Ended(stream.request, "the server is shutting down"))
        self._arrived.clear()
