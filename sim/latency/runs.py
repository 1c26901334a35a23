"""Pricing a run of decode steps (sim.core.decode_run) one step at a time: the reference.

A model whose step time is a closed formula prices a run in numpy instead
(RooflineLatency, TableLatency), with the same operations in the same order,
so every step's float equals step_time's; this loop is what they must equal.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sim.core.decode_run import decode_shape
from sim.core.plan import StepShape


def each_step_s(step_time: Callable[[StepShape], float], shape: StepShape,
                steps: int) -> np.ndarray:
    """`step_time` of each of the `steps` steps of a run starting at `shape`."""
    return np.array([step_time(decode_shape(shape, s)) for s in range(steps)],
                    dtype=np.float64)
