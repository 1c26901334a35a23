"""Prototypes of vLLM 0.32's rules on top of sim/core, for measurement only.

Issue 14 phase 1 leaves sim/core unchanged; these subclasses switch on, one
cause at a time, the rules that servesim lacks, so the parity run can say
which causes explain each mismatch (a configuration that matches with all
rules but differs when one is taken away needs that one). They reach into
PagedBlockManager's private state and are to be deleted once sim/core adopts
the rules (NOTES.md says where each belongs).

A  watermark blocks = int(watermark * num_blocks), null block included
B  admission needs blocks for all known tokens (scheduler_reserve_full_isl)
C  blocks are named when allocated, so a later admission in the same step hits them
D  names cover generated tokens too; a resumed request hits its own prompt and output
E  a freed block without a name goes to the front of the free queue, a named one to the back
"""

from __future__ import annotations

from parity.configs import output_token_id
from sim.core.kv import PagedBlockManager
from sim.core.plan import StepPlan, StepResult
from sim.core.prefix import ROOT_HASH
from sim.core.request import Request
from sim.core.schedulers import ContinuousScheduler
from sim.core.schedulers.limits import LengthLimits
from sim.core.schedulers.plan_builder import PlanBuilder

RULES = {
    "A": "watermark = int(wm * num_blocks)",
    "B": "full-sequence admission check",
    "C": "same-step prefix hits (name at allocation)",
    "D": "cached output blocks on resume",
    "E": "free-queue order: unnamed front, named back",
}


def parse_rules(text: str) -> frozenset[str]:
    if text.strip() == "all":
        return frozenset(RULES)
    rules = frozenset(r.strip().upper() for r in text.split(",") if r.strip())
    unknown = sorted(rules - RULES.keys())
    if unknown:
        raise ValueError(f"unknown rule {unknown[0]!r}; allowed: {', '.join(RULES)} or 'all'")
    return rules


def classes(rules: frozenset[str]) -> tuple[type[PagedBlockManager], type[ContinuousScheduler]]:
    """A pool and a scheduler class with `rules` on; sim/core's own classes for none."""
    if not rules:
        return PagedBlockManager, ContinuousScheduler
    tag = "".join(sorted(rules))
    kv = type(f"RulesKV_{tag}", (RulesKV,), {"rules": rules})
    sched = type(f"RulesScheduler_{tag}", (RulesScheduler,), {"rules": rules})
    return kv, sched


class _KnownTokens(LengthLimits):
    """B: what an admission must fit is every known token, not just its first chunk."""

    def reserve_tokens(self, request: Request) -> int | None:
        return request.num_known_tokens


class RulesKV(PagedBlockManager):
    rules: frozenset[str] = frozenset()

    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.01,
                 enable_prefix_cache: bool = False, host_swap_blocks: int = 0) -> None:
        super().__init__(num_blocks, block_size, watermark, enable_prefix_cache,
                         host_swap_blocks)
        if "A" in self.rules:
            self.watermark_blocks = int(watermark * num_blocks)
        self._prompt_ids: dict[int, tuple[int, ...]] = {}
        self._chain_memo: tuple[Request, int, tuple[int, ...]] | None = None

    # -- B and C: allocation -----------------------------------------------------
    def allocate(self, request_id: int, num_tokens: int, use_watermark: bool = True,
                 reserve_tokens: int | None = None, request: Request | None = None) -> int:
        if "B" in self.rules and reserve_tokens is not None:
            hits = self._match(request) if request is not None and self.enable_prefix_cache \
                else []
            revived = sum(1 for b in hits if not self._refcounts[b])
            needed = max(self.blocks_for(reserve_tokens) - len(hits), 0) + revived
            if needed + (self.watermark_blocks if use_watermark else 0) > self.num_free_blocks:
                return -1
        hits = super().allocate(request_id, num_tokens, use_watermark, reserve_tokens, request)
        if hits >= 0 and request is not None and request.prompt_token_ids is not None:
            self._prompt_ids[request_id] = request.prompt_token_ids
        if hits >= 0 and "C" in self.rules:
            self.cache_computed(request_id, num_tokens)
        return hits

    def append_slots(self, request_id: int, num_tokens: int) -> tuple[int, ...] | None:
        table = super().append_slots(request_id, num_tokens)
        if table is not None and "C" in self.rules:
            self.cache_computed(request_id, num_tokens)
        return table

    # -- D: names over prompt and output ------------------------------------------
    def _chain(self, request: Request) -> tuple[int, ...]:
        if "D" not in self.rules or request.prompt_token_ids is None:
            return super()._chain(request)
        known = request.num_known_tokens  # exact: only waiting requests are looked up
        memo = self._chain_memo
        if memo is not None and memo[0] is request and memo[1] == known:
            return memo[2]
        chain = self._names(request.request_id, request.prompt_token_ids, (), known)
        self._chain_memo = (request, known, chain)
        return chain

    def _match(self, request: Request) -> list[int]:
        if "D" not in self.rules:
            return super()._match(request)
        chain, cached = self._chain(request), self._cached
        limit = min(len(chain), (request.num_known_tokens - 1) // self.block_size)
        blocks = []
        for i in range(limit):
            block = cached.get(chain[i])
            if block is None:
                break
            blocks.append(block)
        return blocks

    def cache_computed(self, request_id: int, num_computed_tokens: int) -> None:
        if "D" in self.rules and request_id in self._chains:
            full = num_computed_tokens // self.block_size
            chain = self._chains[request_id]
            if full > len(chain):
                self._chains[request_id] = self._names(
                    request_id, self._prompt_ids[request_id], chain, full * self.block_size)
        super().cache_computed(request_id, num_computed_tokens)

    def _names(self, request_id: int, prompt: tuple[int, ...], chain: tuple[int, ...],
               num_tokens: int) -> tuple[int, ...]:
        """`chain` extended to the full blocks of `num_tokens` tokens (prompt, then output)."""
        bs, p = self.block_size, len(prompt)
        names = list(chain)
        parent = names[-1] if names else ROOT_HASH
        for start in range(len(names) * bs, num_tokens // bs * bs, bs):
            end = start + bs
            if end <= p:
                tokens = prompt[start:end]
            else:
                tokens = prompt[start:p] + tuple(output_token_id(request_id, j - p)
                                                 for j in range(max(start, p), end))
            parent = hash((parent, tokens))
            names.append(parent)
        return tuple(names)

    # -- E: free-queue order -------------------------------------------------------
    def free(self, request_id: int) -> None:
        self._prompt_ids.pop(request_id, None)
        if "E" not in self.rules:
            super().free(request_id)
            return
        if self._chains:
            self._chains.pop(request_id, None)
            self._named.pop(request_id, None)
        refcounts, names = self._refcounts, self._block_hash
        front, back = [], []
        for block in reversed(self._tables.pop(request_id, ())):
            refcounts[block] -= 1
            if not refcounts[block]:
                (back if names[block] is not None else front).append(block)
        # an unnamed block never has a stale queue entry (only hits on named ones do)
        self._free[self._head:self._head] = front
        self._free.extend(back)


class RulesScheduler(ContinuousScheduler):
    rules: frozenset[str] = frozenset()

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if "B" in self.rules:
            self.limits = _KnownTokens(self.limits.max_model_len, self.limits.max_output_tokens)

    def _admit(self, budget: int, step: PlanBuilder, now: float) -> None:
        if "C" in self.rules and self._prefix_cache:
            self._name_rows(step.request_ids, step.contexts, step.num_new)
        super()._admit(budget, step, now)

    def on_step_done(self, plan: StepPlan, result: StepResult, now: float) -> list[Request]:
        if self._prefix_cache and self.rules & {"C", "D"}:
            self._name_rows(plan.request_ids, plan.context_tokens, plan.num_new_tokens)
        return super().on_step_done(plan, result, now)

    def _name_rows(self, request_ids, contexts, num_new) -> None:
        cache = self.kv.cache_computed
        for rid, context, new in zip(request_ids, contexts, num_new, strict=True):
            cache(rid, context + new)
