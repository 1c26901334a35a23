"""One speculative decoding step on the engine: draft, run the target once over all drafts, verify.

The plan says how many drafts each decoding sequence gets (k_i, sim/core/plan.py);
the drafter proposes them (prompt lookup or a draft model, gpu_engine.drafters),
the target model runs once over all 1 + k_i positions, and each sequence keeps
its accepted drafts plus the target's next token.

Host work is bookkeeping only (which rows hold whose drafts); the drafts of a
draft model never come to the host before verification, the acceptance rule
runs on the device for every row at once (`speculative.verify`), and the one
transfer back is the step's result. Device time is the whole step on the
host (drafter passes included), which that one transfer ends.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

import torch

from gpu_engine.drafters import ModelDrafter, NgramDrafter
from gpu_engine.runner import ModelRunner
from gpu_engine.sampling import SamplingParams
from gpu_engine.speculative import DraftRequest, VerifyRow, unpack, verify
from gpu_engine.staging import stage
from sim.core.plan import StepPlan


class SequenceState(Protocol):
    """What a step reads of a sequence the engine serves."""

    token_ids: list[int]
    sampling: SamplingParams
    seed: int | None


def execute_speculative(runner: ModelRunner, drafter: NgramDrafter | ModelDrafter | None,
                        plan: StepPlan, seqs: Sequence[SequenceState],
                        new_ids: list[list[int]]) -> tuple[list[int], tuple[int, ...], float]:
    """Draft k_i tokens per speculating sequence, verify them all in one target pass; returns
    every emitted token (plan order), tokens per emitting sequence, and device seconds."""
    if drafter is None:
        raise RuntimeError("the scheduler speculates but the engine has no drafter")
    started = time.perf_counter()
    for rid in plan.preempted_ids:
        drafter.forget(rid)
    ks = plan.num_spec_tokens
    asks: list[DraftRequest] = []
    draft_of: list[int] = []
    for rid, s, ctx, k, table in zip(plan.request_ids, seqs, plan.context_tokens, ks,
                                     plan.block_tables, strict=True):
        draft_of.append(len(asks) if k else -1)
        if k:
            asks.append(DraftRequest(rid, s.token_ids, ctx, k, table, s.sampling, s.seed))
    drafts = drafter.propose(asks)
    logits_rows: list[int] = []
    rows: list[VerifyRow] = []
    device_rows: list[int] = []  # token rows that take a draft model's tokens
    device_src: list[int] = []  # their index into drafts.tokens.view(-1)
    width = max(ks)
    start = 0
    for i, (s, k, emits) in enumerate(zip(seqs, ks, plan.emits_token, strict=True)):
        if k:
            d = draft_of[i]
            if drafts.host is not None:
                new_ids[i] = new_ids[i][:1] + list(drafts.host[d])
            else:
                new_ids[i] = new_ids[i][:1] + [0] * k
                device_rows.extend(range(start + 1, start + 1 + k))
                device_src.extend(range(d * width, d * width + k))
        end = start + len(new_ids[i])
        if emits:
            rows.append(VerifyRow(len(logits_rows), k, draft_of[i], len(s.token_ids),
                                  s.sampling, s.seed))
            logits_rows.extend(range(end - 1 - k, end))
        start = end
    inputs = runner.prepare(new_ids, plan.context_tokens, plan.block_tables, plan.emits_token,
                            seq_ids=plan.request_ids, logits_rows=logits_rows)
    if device_rows and drafts.tokens is not None:
        at, src = stage([(device_rows, torch.int64), (device_src, torch.int64)],
                        runner.device).views
        inputs.token_ids.index_copy_(0, at, drafts.tokens[:, :width].reshape(-1)
                                     .index_select(0, src))
    flat, _ = runner.execute(inputs, lambda logits: verify(logits, rows, drafts))
    emitted = unpack(flat, len(rows), max((r.num_drafts for r in rows), default=0))
    token_ids: list[int] = []
    counts: list[int] = []
    for row, out in zip(rows, emitted, strict=True):
        if row.num_drafts:
            rid = asks[row.draft].request_id
            drafter.accepted(rid, row.position - 1, len(out) - 1, row.num_drafts)
        token_ids.extend(out)
        counts.append(len(out))
    return token_ids, tuple(counts), time.perf_counter() - started
