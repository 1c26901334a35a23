"""Synthetic calibration tables: measurements drawn from a known cost function plus noise.

They let the fit be checked against ground truth (a real engine has none)
and let scenarios use a `table` latency model without a profiling run. The
grid mirrors what a profiler measures: prefill-only steps over token counts
(with and without a cached prefix), decode-only steps over batch size x
context, and mixed steps as a chunked-prefill scheduler emits them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.config.specs import ModelSpec
from sim.core.plan import StepShape
from sim.latency.table import step_features
from sim.latency.table_files import write_measurements
from sim.latency.table_format import Measurement, TableMetadata

CostMs = Callable[[StepShape], float]  # step shape -> ms
P90_Z = 1.2816  # standard normal quantile of 0.9


@dataclass(frozen=True, slots=True)
class SyntheticCost:
    """A step cost of the table model's family: linear layers flat up to `bend_tokens` rows
    (memory-bound), then `per_token_ms` per row (compute-bound); attention and overheads."""

    step_ms: float = 1.5
    flat_ms: float = 4.0
    bend_tokens: int = 64
    per_token_ms: float = 0.04
    prefill_attention_ms_per_pair: float = 4e-6
    decode_attention_ms_per_token: float = 2e-4
    prefill_seq_ms: float = 0.08
    decode_seq_ms: float = 0.03
    verify_seq_ms: float = 0.05

    def __call__(self, shape: StepShape) -> float:
        rows, pairs, decode_tokens, prefills, decodes = step_features(shape)
        return (self.step_ms + self.flat_ms + self.per_token_ms * max(0, rows - self.bend_tokens)
                + self.prefill_attention_ms_per_pair * pairs
                + self.decode_attention_ms_per_token * decode_tokens
                + self.prefill_seq_ms * prefills + self.decode_seq_ms * decodes
                + self.verify_seq_ms * shape.num_spec_decodes)


def geometric_counts(low: int, high: int) -> list[int]:
    """Powers of two and the midpoints between them (x1.5), from `low` to `high` inclusive."""
    counts = {high}
    power = 1
    while power <= high:
        counts.update(c for c in (power, power * 3 // 2) if low <= c <= high)
        power *= 2
    return sorted(counts)


def verify_shape(batch: int, context: int, query_tokens: int) -> StepShape:
    """`batch` decodes at `context` tokens, each verifying query_tokens - 1 draft tokens."""
    drafts = query_tokens - 1
    return StepShape(num_decodes=batch, decode_context_sum=batch * context,
                     decode_context_max=context, padded_batch=batch,
                     num_spec_decodes=batch if drafts else 0, num_spec_tokens=batch * drafts,
                     spec_depth=drafts, spec_context_sum=batch * context if drafts else 0)


def shape_grid(max_num_batched_tokens: int, max_num_seqs: int, max_context_tokens: int,
               verify_query_tokens: Sequence[int] = ()) -> list[tuple[str, StepShape]]:
    """(kind, shape) for a profiling grid within the scheduler's budgets; `verify_query_tokens`
    adds speculative verify steps with that many query tokens per decode."""
    budget, grid = max_num_batched_tokens, []
    for chunk in geometric_counts(1, min(budget, max_context_tokens)):
        for context in (0, 256, 2048):
            if chunk + context <= max_context_tokens:
                grid.append(("prefill", StepShape((chunk,), (context,))))
    contexts = [c for c in (16, 128, 512, 2048, 8192) if c < max_context_tokens]
    for batch in geometric_counts(1, min(max_num_seqs, budget)):
        for context in contexts:
            grid.append(("decode", StepShape(num_decodes=batch, decode_context_sum=batch * context,
                                             decode_context_max=context, padded_batch=batch)))
    for chunk in (16, 128, 512, 2048):
        for batch in geometric_counts(1, max_num_seqs)[::2]:
            if chunk + batch <= budget and chunk <= max_context_tokens and contexts:
                context = contexts[len(contexts) // 2]
                grid.append(("mixed", StepShape((chunk,), (0,), batch, batch * context, context,
                                                batch + 1)))
    for query in verify_query_tokens:
        for batch in geometric_counts(1, min(max_num_seqs, budget // query)):
            for context in contexts[::2]:
                grid.append(("verify", verify_shape(batch, context, query)))
    return grid


def synthetic_measurements(cost: CostMs, grid: Sequence[tuple[str, StepShape]],
                           noise_cv: float = 0.03, seed: int = 0, repeats: int = 5
                           ) -> list[Measurement]:
    """One Measurement per shape; medians carry multiplicative lognormal noise of `noise_cv`."""
    rng = np.random.default_rng(seed)
    rows = []
    for kind, shape in grid:
        wall_ms = cost(shape) * math.exp(rng.normal(0.0, noise_cv)) if noise_cv else cost(shape)
        spread = math.exp(P90_Z * noise_cv)
        rows.append(Measurement(
            kind, shape.prefill_chunk_tokens, shape.prefill_context_tokens, shape.num_decodes,
            shape.decode_context_sum, shape.decode_context_max, shape.padded_batch,
            round(shape.decode_query_tokens) if shape.num_decodes else 1, repeats,
            0.9 * wall_ms, 0.9 * wall_ms / spread, 0.9 * wall_ms * spread,
            wall_ms, wall_ms / spread, wall_ms * spread))
    return rows


def write_synthetic_table(directory: str | Path, spec: ModelSpec, block_size: int = 16,
                          cost: CostMs | None = None, noise_cv: float = 0.03, seed: int = 0,
                          max_num_batched_tokens: int = 2048, max_num_seqs: int = 64,
                          device_name: str = "synthetic") -> Path:
    """A table directory (metadata + measurements, no fit yet) from `cost` on `shape_grid`."""
    grid = shape_grid(max_num_batched_tokens, max_num_seqs, spec.max_context_tokens)
    rows = synthetic_measurements(cost or SyntheticCost(), grid, noise_cv, seed)
    metadata = TableMetadata(
        device_name=device_name, device_kind="cpu", torch_version="none", cuda_version=None,
        dtype="float32", model_spec=spec, block_size=block_size,
        max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
        notes=f"synthetic: known cost function, lognormal noise cv {noise_cv}, seed {seed}")
    return write_measurements(directory, rows, metadata)
