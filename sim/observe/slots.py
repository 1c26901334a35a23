"""Who holds which batch slot, step by step: the observer behind `servesim plot slots`.

Why an observer: the same hook the TTFT diagnosis uses (sim.observe.trace's
StepObserver) sees every plan, so recording slots needs nothing from the
world; sim.experiments.slots runs the simulations, sim.plots.slots draws them.
"""

from __future__ import annotations

import heapq

import numpy as np

from sim.core.plan import StepPlan
from sim.core.request import Request


class SlotRecorder:
    """Who holds which batch slot at each of the first `max_steps` steps (an observer).

    A request takes the lowest free slot when it first appears in a plan and
    keeps it until it finishes or is preempted; a held slot it gets no tokens
    in is `stalled`; a step's padding (`padded_batch` beyond its sequences)
    fills the lowest free slots.
    """

    def __init__(self, max_steps: int = 200) -> None:
        self.max_steps = max_steps
        self.steps: list[tuple[float, float, list[tuple[int, int, str]]]] = []
        self.steps_seen = 0  # every step the run took, recorded or past max_steps
        self._requests: dict[int, Request] = {}
        self._slot_of: dict[int, int] = {}
        self._free: list[int] = []
        self._next = 0

    def on_arrival(self, request: Request, now_s: float) -> None:
        if len(self.steps) < self.max_steps:
            self._requests[request.request_id] = request

    def _take(self) -> int:
        if self._free:
            return heapq.heappop(self._free)
        self._next += 1
        return self._next - 1

    def on_step(self, start_s: float, duration_s: float, plan: StepPlan) -> None:
        self.steps_seen += 1
        if len(self.steps) >= self.max_steps:
            return
        for rid, freed in list(self._slot_of.items()):
            if self._requests[rid].finish_s is not None or rid in plan.preempted_ids:
                del self._slot_of[rid]
                heapq.heappush(self._free, freed)
        cells = []
        for rid, prefill in zip(plan.request_ids, plan.is_prefill, strict=True):
            slot = self._slot_of.get(rid)
            if slot is None:
                slot = self._slot_of[rid] = self._take()
            cells.append((slot, rid, "prefill" if prefill else "decode"))
        in_plan = set(plan.request_ids)
        cells += [(slot, rid, "stalled") for rid, slot in self._slot_of.items()
                  if rid not in in_plan]
        taken = [self._take() for _ in range(max(0, plan.shape.padded_batch - plan.batch_size))]
        cells += [(slot, -1, "padded") for slot in taken]
        for slot in taken:
            heapq.heappush(self._free, slot)
        self.steps.append((start_s, duration_s, cells))

    @property
    def takes_decode_runs(self) -> bool:
        return False  # every step is a row of the picture

    def on_decode_steps(self, start_s: np.ndarray, duration_s: np.ndarray,
                        kv_blocked: bool) -> None:
        raise ValueError("the slot picture records every step: run it step by step")

    @property
    def num_slots(self) -> int:
        return self._next

    @property
    def num_finished(self) -> int:
        """Requests that finished within the recorded steps (all that finished, when no step
        was left out: a token streams out a little after the step that made it)."""
        end_s = self.steps[-1][0] + self.steps[-1][1] if self.steps else 0.0
        if self.steps_seen <= len(self.steps):
            end_s = float("inf")
        return sum(r.finish_s is not None and r.finish_s <= end_s and r.first_token_s is not None
                   for r in self._requests.values())
