"""The backend interface of the serving loop: one step of a scheduler, and what it did.

A backend's `Stepper` runs one step: the simulated one holds it for the latency
model's prediction (sim.serve.simulated), the engine's runs the kernels
(sim.cli.serve_engine). sim.serve.loop drives either through this protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sim.core.kv import KVManager
from sim.core.plan import StepPlan, StepResult
from sim.core.request import Request
from sim.core.schedulers.base import Scheduler
from sim.serve.api import Generation


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
    # request id -> (the token's log-probability, its k best (id, log-probability))
    logprobs: dict[int, tuple] | None = None


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
