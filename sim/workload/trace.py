"""A request trace as columns: what every trace reader returns and every consumer reads.

Why a module of its own: the readers (sim.workload.traces, and the text reader
sim.workload.text) build a `Trace`, and the request factory reads one; with
the value here, the readers depend on it and not on each other.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from sim.workload.arrivals import ArrivalProcess, arrival_chunks_s

MOONCAKE_UNIT_TOKENS = 512  # tokens each Mooncake hash id names


@dataclass(frozen=True, slots=True, eq=False)
class Trace:
    """A whole trace as columns; `prefix_block_ids` only for traces that carry them.

    Without arrival times (`arrivals_given` False) `arrival_s` is all zeros and
    `arrival_column` names what the file would need to carry them.
    """

    source: str
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix_block_ids: tuple[tuple[int, ...], ...] | None = None
    num_prefix_mismatched: int = 0
    arrivals_given: bool = True
    arrival_column: str = "arrival_s"

    def __len__(self) -> int:
        return int(self.arrival_s.size)


def rebased_s(arrival_s: np.ndarray, time_scale: float) -> np.ndarray:
    return (arrival_s - arrival_s[0]) / time_scale


def replay_times_s(trace: Trace, process: ArrivalProcess | None, seed: int, chunk_size: int
                   ) -> Iterator[float]:
    """The trace's own arrivals, or, for a trace without them, `process` drawn from child 0 of
    two of the scenario seed (text traces' draws have always come from there)."""
    if trace.arrivals_given or process is None:
        return iter(trace.arrival_s.tolist())
    rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(2)[0])
    return (t for chunk in arrival_chunks_s(process, rng, chunk_size) for t in chunk.tolist())
