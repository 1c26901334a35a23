"""A replica's recorder in a disaggregated fleet: steps recorded, requests handed on.

A replica records its steps and finished requests into its recorder
(sim.results.record.recording.record_step). In a disaggregated fleet a request that
finishes on a prefill instance has only begun: the tap records the step into the
replica's own and its pool's recorders and the fleet's, and hands each finished request
to the fleet (`finished`), which records it once when it is really done. Rejections are
final and recorded at once (`rejected` may replace the request recorded).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sim.core.plan import StepPlan, StepResult
from sim.core.request import Request
from sim.results.record.recorder import RunRecorder


def _nothing(*_args: object) -> None:
    return None


class PoolTap:
    """Stands in for a RunRecorder in Replica: the calls Replica and record_step make."""

    __slots__ = ("recorders", "fleet", "finished", "stepped", "rejected", "after",
                 "last_step_s")

    def __init__(self, recorders: Sequence[RunRecorder], fleet: RunRecorder) -> None:
        self.recorders = tuple(recorders)
        self.fleet = fleet
        self.finished: Callable[[Request], None] = _nothing
        self.stepped: Callable[[StepPlan], None] = _nothing
        self.rejected: Callable[[Request], Request] = lambda request: request
        self.after: Callable[[], None] = _nothing
        self.last_step_s = 0.0  # the duration of the last step recorded

    def record_step(self, start_s: float, duration_s: float, plan: StepPlan,
                    num_waiting: int, num_running: int, kv_blocks_used: int,
                    kv_slots_held: int | None = None) -> None:
        for recorder in self.recorders:
            recorder.record_step(start_s, duration_s, plan, num_waiting, num_running,
                                 kv_blocks_used, kv_slots_held)
        self.fleet.record_step(start_s, duration_s, plan, num_waiting, num_running,
                               kv_blocks_used, kv_slots_held)
        self.last_step_s = duration_s
        self.stepped(plan)
        self.after()

    def record_speculation(self, plan: StepPlan, result: StepResult) -> None:
        for recorder in (*self.recorders, self.fleet):
            recorder.record_speculation(plan, result)

    def record_finished(self, request: Request) -> None:
        self.finished(request)  # first: the fleet may restore the request's prefill times
        for recorder in self.recorders:
            recorder.record_finished(request)
        self.after()

    def record_rejected(self, request: Request) -> None:
        for recorder in self.recorders:
            recorder.record_rejected(request)
        self.fleet.record_rejected(self.rejected(request))
