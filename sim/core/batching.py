"""Batch-size buckets for CUDA-graph decode steps, shared by the engine and the simulator.

A captured CUDA graph replays fixed shapes, so the engine pads a decode-only
step's batch up to the next captured size (vLLM captures 1, 2, 4, then every
multiple of 8). The simulator and the calibration tables use the same function,
so a simulated decode step costs what the padded kernels cost.
"""

from __future__ import annotations

from bisect import bisect_left


def graph_batch_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """The batch sizes captured for decode: 1, 2, 4, 8, 16, 24, ... up to max_num_seqs."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    sizes = [s for s in (1, 2, 4) if s < max_num_seqs]
    sizes += range(8, max_num_seqs, 8)
    return (*sizes, max_num_seqs)


def padded_batch_size(num_seqs: int, sizes: tuple[int, ...]) -> int:
    """The smallest captured size holding `num_seqs`; larger batches run unpadded (eager)."""
    if num_seqs < 1:
        raise ValueError(f"num_seqs must be >= 1, got {num_seqs}")
    i = bisect_left(sizes, num_seqs)
    return sizes[i] if i < len(sizes) else num_seqs
