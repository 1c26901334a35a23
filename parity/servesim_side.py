"""servesim's ContinuousScheduler + PagedBlockManager (sim.core) behind parity.steps.Side.

A parallel-sampling request (parity.parallel.ParentSpec) is split into its n
children by sim.serve.parallel.split_children, the split `servesim serve` makes.

With `async_scheduling` the scheduler runs as vLLM's AsyncScheduler and the side
keeps the plans scheduled and not yet applied, oldest first (parity.steps'
run_config_async asks for the next step while one runs).
"""

from __future__ import annotations

from collections import deque

from parity.configs import ParityConfig, RequestSpec, accepted_drafts
from parity.parallel import ParentSpec, child_label
from parity.steps import Scheduled
from sim.core.kv import PagedBlockManager
from sim.core.plan import StepPlan, StepResult
from sim.core.request import Request
from sim.core.schedulers import ContinuousScheduler
from sim.serve.parallel import split_children


class ServesimSide:
    def __init__(self, config: ParityConfig, async_scheduling: bool = False) -> None:
        self.kv = PagedBlockManager(config.num_blocks, config.block_size,
                                    watermark=config.watermark,
                                    enable_prefix_cache=config.prefix_caching)
        self.sched = ContinuousScheduler(
            self.kv, config.max_num_seqs, config.max_num_batched_tokens, config.chunked_prefill,
            max_model_len=config.max_model_len,
            speculative_tokens=config.speculative_tokens,
            speculative_method=config.speculative_method, async_scheduling=async_scheduling)
        self.requests: dict[int, Request] = {}
        self._plan: StepPlan | None = None
        self._plans: deque[StepPlan | None] = deque()  # async: scheduled, not applied
        self._now = 0.0  # servesim's continuous policy reads no time; steps count it

    def add(self, spec: RequestSpec) -> None:
        if isinstance(spec, ParentSpec):  # n choices: split as `servesim serve` splits them
            reqs = split_children(child_label(spec.request_id, 0), spec.n, self._now,
                                  spec.prompt_token_ids, spec.output_tokens)
        else:
            reqs = [Request(spec.request_id, self._now, len(spec.prompt_token_ids),
                            spec.output_tokens, prompt_token_ids=spec.prompt_token_ids)]
        for req in reqs:
            if not self.sched.add(req, self._now):
                raise RuntimeError(f"servesim rejected request {req.request_id}: "
                                   f"{req.rejection_reason}")
            self.requests[req.request_id] = req

    def schedule(self) -> Scheduled:
        waiting = {r.request_id for r in self.sched.waiting}
        before = {rid: r.num_preemptions for rid, r in self.requests.items()}
        plan = self._plan = self.sched.schedule(self._now)
        self._plans.append(plan)
        # a plan is None when no one runs, which can follow a preemption: count them directly
        preempted = tuple(rid for rid, r in self.requests.items()
                          if r.num_preemptions > before[rid])
        scheduled: tuple[tuple[int, int], ...] = ()
        admitted: tuple[tuple[int, int], ...] = ()
        drafts: tuple[tuple[int, int], ...] = ()
        if plan is not None:
            scheduled = tuple(zip(plan.request_ids, plan.num_new_tokens, strict=True))
            admitted = tuple((rid, context) for rid, context in
                             zip(plan.request_ids, plan.context_tokens, strict=True)
                             if rid in waiting)
            drafts = tuple((rid, k) for rid, k in zip(plan.request_ids, plan.num_spec_tokens,
                                                      strict=False) if k)
        return Scheduled(scheduled, preempted, admitted, self.kv.num_free_blocks, drafts)

    def _result(self, plan: StepPlan) -> StepResult:
        """The fabricated verifier: 1 + accepted drafts per emitting sequence (plan order)."""
        if not plan.num_spec_tokens:
            return StepResult()
        return StepResult(num_emitted=tuple(
            1 + accepted_drafts(rid, self.requests[rid].num_output_done, k)
            for rid, k, emits in zip(plan.request_ids, plan.num_spec_tokens, plan.emits_token,
                                     strict=True) if emits))

    def step_done(self) -> list[int]:
        plan = self._plans.popleft()
        self._plan = None
        self._now += 1.0
        if plan is None:
            return []
        finished = self.sched.on_step_done(plan, self._result(plan), self._now)
        if not self.sched.async_scheduling:  # (async: a later plan may still name it)
            for req in finished:
                del self.requests[req.request_id]
        return [req.request_id for req in finished]

    def has_unfinished(self) -> bool:
        return self.sched.has_unfinished()
