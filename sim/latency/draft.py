"""What drafting adds to a speculative step, on top of the target's verify pass.

A draft model runs k sequential decode passes at the step's batch of drafting
sequences (its first pass also prefills the step's prompt chunks, since the
draft keeps its own KV), priced by its own roofline; prompt lookup (n-gram)
drafting costs a fixed, near-zero CPU time. `SpeculativeLatency` adds that to
the target model's price of the step, which covers the verify pass (k + 1
positions per drafting sequence, from the shape's draft tokens), so it wraps
the roofline and the calibrated table alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from sim.core.plan import StepShape
from sim.latency import LatencyModel
from sim.latency.roofline import RooflineLatency
from sim.latency.runs import each_step_s

if TYPE_CHECKING:
    from sim.config.scenario import Scenario

# A draft pass reuses the step's scheduling and input preparation; what is left is
# launching its kernels (a CUDA-graph replay of a small model: ~0.05-0.2 ms).
DEFAULT_DRAFT_PASS_OVERHEAD_S = 1e-4


class DraftCost(Protocol):
    """Seconds the drafter adds to a step of this shape."""

    name: str

    def draft_time_s(self, shape: StepShape) -> float: ...


@dataclass(frozen=True, slots=True)
class NgramDraft:
    """Prompt lookup: drafts copied from earlier n-grams of the context, on the CPU."""

    overhead_s: float = 0.0
    name: str = "ngram"

    def __post_init__(self) -> None:
        if not self.overhead_s >= 0:
            raise ValueError(f"overhead_s must be >= 0, got {self.overhead_s!r}")

    def draft_time_s(self, shape: StepShape) -> float:
        return self.overhead_s if shape.num_spec_decodes else 0.0


@dataclass(frozen=True, slots=True)
class ModelDraft:
    """A small draft model, priced by its own latency model (its step_overhead = per pass).

    Pass 1 drafts the first token of every drafting sequence and prefills the
    step's prompt chunks into the draft's KV; passes 2..max k_i draft the rest,
    each over one more token of context. Every pass runs at the step's number
    of drafting sequences (those the budget cuts below k are few).
    """

    latency: LatencyModel
    name: str = "draft"

    def draft_time_s(self, shape: StepShape) -> float:
        n, chunks = shape.num_spec_decodes, shape.prefill_chunk_tokens
        if not n and not chunks:
            return 0.0
        step_time, ctx = self.latency.step_time, shape.spec_context_sum
        total = step_time(StepShape(chunks, shape.prefill_context_tokens, n, ctx, 0, 0))
        for j in range(1, shape.spec_depth):
            total += step_time(StepShape(num_decodes=n, decode_context_sum=ctx + j * n))
        return total


@dataclass(frozen=True, slots=True)
class SpeculativeLatency:
    """A target latency model (which prices the verify pass) plus the draft's time."""

    target: LatencyModel
    draft: DraftCost

    @property
    def name(self) -> str:
        return f"{self.target.name} + {self.draft.name} draft"

    def step_time(self, shape: StepShape, moved_s: float = 0.0) -> float:
        return self.target.step_time(shape, moved_s) + self.draft.draft_time_s(shape)

    def decode_run_s(self, shape: StepShape, steps: int) -> np.ndarray:
        return each_step_s(self.step_time, shape, steps)


def draft_cost(scenario: Scenario) -> DraftCost:
    """The scenario's drafter: n-gram lookup, or a draft model on the target's GPUs."""
    cfg = scenario.speculative
    overhead_ms = cfg.draft_overhead_ms
    draft = cfg.draft_spec
    if draft is None:
        return NgramDraft(0.0 if overhead_ms is None else overhead_ms / 1e3)
    lat = scenario.latency
    options: dict[str, float] = {}
    if lat.compute_efficiency is not None:
        options["compute_efficiency"] = lat.compute_efficiency
    if lat.bandwidth_efficiency is not None:
        options["bandwidth_efficiency"] = lat.bandwidth_efficiency
    pass_s = DEFAULT_DRAFT_PASS_OVERHEAD_S if overhead_ms is None else overhead_ms / 1e3
    roofline = RooflineLatency(draft, scenario.hardware_spec, tp=scenario.hardware.count,
                               step_overhead_s=pass_s, seq_overhead_s=0.0, **options)
    return ModelDraft(roofline, name=draft.name)


def with_draft(scenario: Scenario, latency: LatencyModel) -> LatencyModel:
    """`latency` plus the draft's time when the scenario speculates, else `latency` itself."""
    if not scenario.speculative.num_tokens:
        return latency
    return SpeculativeLatency(latency, draft_cost(scenario))
