"""ReplicaObserver: what the world calls on each replica's arrivals and steps, fanned out to
the wait clock, the TTFT diagnosis and, for traced requests, the tracer.

Apart from the diagnosis (sim.observe.diagnose) because it is the wiring, not a measure:
it owns one replica's clock, which the diagnoser and the tracer both read, and decides
which of them a step reaches (decode runs reach only the clock).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sim.core.plan import StepPlan, StepShape
from sim.core.request import Request
from sim.core.schedulers.base import Scheduler
from sim.observe.diagnose import TTFTDiagnoser
from sim.observe.trace import RequestTracer, WaitClock


class ReplicaObserver:
    """One replica's observer: its wait clock, TTFT diagnosis and (optionally) a tracer."""

    __slots__ = ("clock", "diagnoser", "tracer")

    def __init__(self, scheduler: Scheduler, step_time: Callable[[StepShape], float],
                 traced: frozenset[int] = frozenset(), hand_off: bool = False,
                 delivery_s: Callable[[StepShape], float] | None = None) -> None:
        self.clock = WaitClock(scheduler)
        self.diagnoser = TTFTDiagnoser(self.clock, scheduler, step_time, hand_off, delivery_s)
        self.tracer = RequestTracer(self.clock, traced) if traced else None

    def on_arrival(self, request: Request, now_s: float) -> None:
        self.diagnoser.on_arrival(request, now_s)
        if self.tracer is not None:
            self.tracer.on_arrival(request, now_s)

    def on_step(self, start_s: float, duration_s: float, plan: StepPlan) -> None:
        self.clock.on_step(start_s, duration_s, plan)
        self.diagnoser.on_step(start_s, duration_s, plan)
        if self.tracer is not None:
            self.tracer.on_step(start_s, duration_s, plan)

    @property
    def takes_decode_runs(self) -> bool:
        """Decode-only steps move only the wait clock (the diagnosis skips them); a traced
        request's timeline needs every step."""
        return self.tracer is None

    def on_decode_steps(self, start_s: np.ndarray, duration_s: np.ndarray,
                        kv_blocked: bool) -> None:
        self.clock.on_decode_steps(start_s, duration_s, kv_blocked)
