"""What one GPU run does and how long it may take: its Plan and its time guard.

`Plan` holds the sizes of a run (the full one on an H100/H200, the smoke run on
any device); `Deadline` is the guard the phases check at safe points, and
`Alarm` the SIGALRM backstop for a phase that overruns. Apart from
calibrate/gpu/check.py so that its phases (calibrate/gpu/phases.py) read them
without importing the script.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Plan:
    """What one run does: `full()` on an H100/H200, `tiny()` the smoke run on any device."""

    device: str
    smoke: bool
    deadline_s: float
    models: tuple[tuple[str, float], ...]  # (model, profile budget in seconds)
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    repeats: int
    speed_model: str
    decode_points: tuple[tuple[int, int], ...]  # (batch, context)
    prefill_sizes: tuple[int, ...]
    speed_repeats: int
    generate: tuple[int, int, int] | None  # (batch, prompt, output) for the HF ratio
    check_model: str  # the correctness checks' model (2 layers of its shape)
    replay_overhead_s: float  # engine build + graph capture, besides the requests' span

    @staticmethod
    def full() -> Plan:
        points = tuple((b, c) for c in (512, 4096) for b in (1, 8, 64, 256)) + ((64, 2048),)
        return Plan("cuda", False, 420.0, (("llama-3-8b", 75.0), ("qwen2.5-1.5b", 35.0)),
                    2048, 128, 8192, 5, "llama-3-8b", points, (512, 2048, 8192), 10,
                    (8, 512, 128), "llama-3-8b", 25.0)

    @staticmethod
    def tiny(device: str) -> Plan:
        cuda = device == "cuda"
        return Plan(device, True, 45.0 if cuda else 240.0, (("tiny", 4.0 if cuda else 3.0),),
                    256, 16, 2048, 2, "tiny", ((1, 128), (8, 128)), (128,), 3,
                    (2, 32, 8) if cuda else None, "tiny", 10.0)


class TimeUp(Exception):
    """The deadline passed."""


class Alarm:
    """The SIGALRM handler: raise TimeUp, remember that it fired, and fire again shortly.

    Python prints and drops an exception raised while a finalizer or gc callback
    runs, so one alarm may never reach `main`: it re-arms until caught, and `main`
    also reads `fired` when the work ended without seeing it.
    """

    rearm_s = 0.5

    def __init__(self) -> None:
        self.fired = False

    def __call__(self, _signum: int, _frame: Any) -> None:
        self.fired = True
        signal.setitimer(signal.ITIMER_REAL, self.rearm_s)
        raise TimeUp


class Deadline:
    """The time guard's clock: `check()` at safe points raises TimeUp once the deadline has
    passed. `clock` (seconds) is the monotonic clock, or a test's fake one."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.seconds = seconds
        self.at_s = clock() + seconds
        self.fired = False

    def left_s(self) -> float:
        return self.at_s - self.clock()

    def check(self) -> None:
        if self.left_s() <= 0:
            self.fired = True
            raise TimeUp
