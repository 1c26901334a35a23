"""Step latency models: how long one engine step of a given shape takes."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from sim.core.plan import StepShape
from sim.latency.fixed import FixedLatency
from sim.latency.roofline import RooflineLatency
from sim.latency.runs import each_step_s
from sim.latency.table import TableLatency


@runtime_checkable
class LatencyModel(Protocol):
    """Anything the simulator can ask for the duration of one step."""

    name: str

    def step_time(self, shape: StepShape, moved_s: float = 0.0) -> float:
        """Seconds the step takes, from launch to tokens available; `moved_s`: its
        synchronous KV moves on idle links (sim.latency.kv_transfer.step_moves_s), which
        the model adds where the GPU's stream is busy with them."""
        ...

    def decode_run_s(self, shape: StepShape, steps: int) -> np.ndarray:
        """step_time of each step of a decode run from `shape` (sim.core.decode_run), float for
        float; must not count or record anything: the world may run fewer than it prices."""
        ...


__all__ = ["FixedLatency", "LatencyModel", "RooflineLatency", "TableLatency", "each_step_s"]
