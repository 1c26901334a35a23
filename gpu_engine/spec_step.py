"""One speculative decoding step on the engine: draft, then verify every draft in one target pass.

The plan says how many drafts each decoding sequence gets (k_i, sim/core/plan.py);
the drafter proposes them (prompt lookup or a draft model, gpu_engine.speculative),
the target model runs once over all 1 + k_i positions, and each sequence keeps
its accepted drafts plus the target's next token. The drafter's passes are
kernels too, so the whole step is timed on the host.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

import torch

from gpu_engine.runner import ModelRunner
from gpu_engine.sampling import SamplingParams, sample
from gpu_engine.speculative import Draft, DraftRequest, ModelDrafter, NgramDrafter, verify
from sim.core.plan import StepPlan
from sim.core.request import Request


class SequenceState(Protocol):
    """What a step reads of a sequence the engine serves."""

    request: Request
    token_ids: list[int]
    sampling: SamplingParams
    generator: torch.Generator | None


def execute_speculative(runner: ModelRunner, drafter: NgramDrafter | ModelDrafter | None,
                        plan: StepPlan, seqs: Sequence[SequenceState], new_ids: list[list[int]]
                        ) -> tuple[list[int], tuple[int, ...], float]:
    """Draft k_i tokens per speculating sequence, verify them all in one target pass; returns
    every emitted token (plan order), tokens emitted per emitting sequence, host seconds."""
    if drafter is None:
        raise RuntimeError("the scheduler speculates but the engine has no drafter")
    started = time.perf_counter()
    for rid in plan.preempted_ids:
        drafter.forget(rid)
    ks = plan.num_spec_tokens
    asks = [DraftRequest(s.request.request_id, s.token_ids, ctx, k, table, s.sampling,
                         s.generator)
            for s, ctx, k, table in zip(seqs, plan.context_tokens, ks, plan.block_tables,
                                        strict=True) if k]
    drafts = iter(drafter.propose(asks))
    by_seq: list[Draft | None] = []
    rows: list[int] = []  # logits rows: all 1 + k_i positions of a speculating sequence
    start = 0
    for i, (k, emits) in enumerate(zip(ks, plan.emits_token, strict=True)):
        draft = next(drafts) if k else None
        if draft is not None:
            new_ids[i] = new_ids[i][:1] + list(draft.token_ids)
        by_seq.append(draft)
        end = start + len(new_ids[i])
        if emits:
            rows.extend(range(end - 1 - k, end))
        start = end
    inputs = runner.prepare(new_ids, plan.context_tokens, plan.block_tables, plan.emits_token)
    inputs = replace(inputs, logits_indices=torch.tensor(rows, device=inputs.token_ids.device))
    counts: list[int] = []

    def draw(logits: torch.Tensor) -> torch.Tensor:
        out: list[int] = []
        row = 0
        for s, k, draft, emits in zip(seqs, ks, by_seq, plan.emits_token, strict=True):
            if not emits:
                continue
            if draft is None:
                token = sample(logits[row:row + 1], [s.sampling], [s.generator])
                emitted = [int(token[0])]
            else:
                emitted = verify(logits[row:row + 1 + k], draft, s.sampling, s.generator)
                drafter.accepted(s.request.request_id, len(s.token_ids) - 1,
                                 len(emitted) - 1, k)
            out.extend(emitted)
            counts.append(len(emitted))
            row += 1 + k
        return torch.tensor(out, dtype=torch.int64)

    token_ids, _ = runner.execute(inputs, draw)
    # the drafter's passes are kernels too: time the whole speculative step on the host
    if runner.device.type == "cuda":
        torch.cuda.synchronize()
    return token_ids, tuple(counts), time.perf_counter() - started
