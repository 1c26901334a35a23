"""What a calibration profile measures and how: the model, device, budgets, sampling and timing.

A plain frozen value with its own checks (`problems()`), read by the rig that
builds the engine (calibrate.profile.rig), the grid and the profiler (calibrate.profile.run);
keeping it apart is what lets those import it without importing each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ProfileSettings:
    """What to profile; `budget_s` bounds the grid's measuring time (None = the whole grid)."""

    model: str = "tiny"
    device: str = "cpu"
    block_size: int = 16
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 32
    max_model_len: int | None = None  # longest sequence profiled; None = the model's context
    budget_s: float | None = None
    warmup: int = 2
    repeats: int = 7
    sample_s: float | None = None  # a sample's length; None = 20 ms on CPU, 4 ms on CUDA
    passes: int | None = None  # times the grid is measured; None = 3 on CPU, 1 on CUDA
    max_group: int = 8  # most steps one sample averages
    # a prefill-only step (nothing else running) is, in serving, the first after an idle
    # wait; on a shared host such a step runs slower (caches gone cold), so it is timed after
    # this long an idle wait (the engine's own), as a replay runs it; 0 = back to back.
    # 50 ms: near the slow-down's plateau (a replay at moderate load idles ~0.1 s before a
    # request), while the waits stay a modest share of a profile (one per sample of each
    # prefill-only point: 72 of the default grid's 273 points)
    idle_gap_s: float = 0.05
    threads: int | None = 1  # CPU torch threads (1 is steady on a shared machine); None = torch's
    clock: str = "wall"  # "cpu": time the CPU engine by its thread's CPU time (see ThreadCpuClock)
    dtype: str = "auto"
    seed: int = 0
    cuda_graphs: bool = True

    def problems(self) -> list[str]:
        """'field: value, allowed' for every bad setting (empty when all are fine)."""
        out = [f"{name}: must be an integer >= {low}, got {getattr(self, name)!r}"
               for name, low in (("block_size", 1), ("max_num_batched_tokens", 1),
                                 ("max_num_seqs", 1), ("warmup", 0), ("repeats", 1),
                                 ("max_group", 1),
                                 *((("passes", 1),) if self.passes is not None else ()))
               if not isinstance(getattr(self, name), int) or getattr(self, name) < low]
        if self.max_num_batched_tokens < self.max_num_seqs:
            out.append(f"max_num_batched_tokens: must be >= max_num_seqs ({self.max_num_seqs}), "
                       f"got {self.max_num_batched_tokens}")
        if self.budget_s is not None and not (math.isfinite(self.budget_s) and self.budget_s > 0):
            out.append(f"budget_s: must be a number of seconds > 0, got {self.budget_s!r}")
        if not (math.isfinite(self.idle_gap_s) and self.idle_gap_s >= 0):
            out.append(f"idle_gap_s: must be seconds >= 0, got {self.idle_gap_s!r}")
        if self.threads is not None and self.threads < 1:
            out.append(f"threads: must be >= 1, got {self.threads}")
        if self.device not in ("cpu", "cuda"):
            out.append(f"device: must be cpu or cuda, got {self.device!r}")
        if self.clock not in ("wall", "cpu") or (self.clock == "cpu" and self.device != "cpu"):
            out.append(f"clock: must be wall, or cpu with device cpu, got {self.clock!r} "
                       f"with device {self.device!r}")
        return out

    @property
    def steps_per_point(self) -> int:
        """Steps a point's decodes live through: each repeat may need a shaping step."""
        return 2 * (self.warmup + self.repeats * self.max_group) + 2

    @property
    def num_passes(self) -> int:
        if self.passes is not None:
            return self.passes
        return 3 if self.device == "cpu" else 1

    @property
    def sample_seconds(self) -> float:
        if self.sample_s is not None:
            return self.sample_s
        return 0.02 if self.device == "cpu" else 0.004
