"""A fixed step time: every engine step takes the same `step_s`, whatever its shape.

Why: with it a replica is a queue whose service time follows from the
request lengths alone (one step per output token with one sequence at a
time), so the simulator can be checked against queueing theory (M/G/1, bulk
service; tests/test_queueing_theory.py). Also a quick what-if: "if a step
took 20 ms". Scenario: `latency: {model: fixed, step_ms: 20}`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.core.plan import StepShape


@dataclass(frozen=True, slots=True)
class FixedLatency:
    """Every step takes `step_s` seconds."""

    step_s: float
    name: str = "fixed"

    def __post_init__(self) -> None:
        if not self.step_s > 0:
            raise ValueError(f"a fixed step time must be > 0 s, got {self.step_s}")

    def step_time(self, shape: StepShape, moved_s: float = 0.0) -> float:
        """`step_s`, plus the step's synchronous KV moves (RooflineLatency.step_time)."""
        return self.step_s + moved_s if moved_s else self.step_s

    def decode_run_s(self, shape: StepShape, steps: int) -> np.ndarray:
        """Each step of a decode run: `step_s`, whatever the context grows to."""
        return np.full(steps, self.step_s, dtype=np.float64)
