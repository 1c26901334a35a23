"""One launched batch of request-level (static or dynamic) batching, run to completion.

All members prefill in one step, then decode together, one token a step, until
the longest finishes. A finished member keeps its slot as padding (the kernels
still run over it) and its KV reservation (the cache tensor is sized for the
batch); nothing joins a running batch.

Padding is charged where it costs time. Classic (HF-style) static batching pads
every prompt to the batch's longest, so the prefill shape carries `max prompt`
tokens for every member, and every live member's decode attends over a
context padded the same way (max prompt + tokens generated). Finished members
and empty slots count in `padded_batch`, which latency models charge as rows of
the linear layers. The plan's own columns (new tokens, contexts, tables) stay
the real ones, so useful work can be told from padding: useful prefill tokens
are `sum(plan.num_new_tokens)` where the shape says `num_prefill_tokens`.
"""

from __future__ import annotations

from sim.core.kv import KVManager
from sim.core.plan import StepPlan, StepShape
from sim.core.request import Request, RequestState


class RequestBatch:
    """`padded_batch`: the slots every step runs over; `pad_prompts`: HF-style prompt padding."""

    __slots__ = ("members", "padded_batch", "pad_prompts", "num_live", "_by_id", "_max_prompt",
                 "_prefilled")

    def __init__(self, members: list[Request], padded_batch: int, pad_prompts: bool = True
                 ) -> None:
        if not members:
            raise ValueError("a batch needs at least one member")
        if padded_batch < len(members):
            raise ValueError(f"padded_batch {padded_batch} < {len(members)} members")
        self.members = members
        self.padded_batch = padded_batch
        self.pad_prompts = pad_prompts
        self.num_live = len(members)
        self._by_id = {r.request_id: r for r in members}
        self._max_prompt = max(r.prompt_tokens for r in members)
        self._prefilled = False

    @property
    def done(self) -> bool:
        return self.num_live == 0

    def plan(self, kv: KVManager) -> StepPlan:
        """The next step: the joint prefill, then a decode of every live member.

        Has no effect but showing reserved blocks in tables, so asking twice is safe.
        """
        return self._decode_plan(kv) if self._prefilled else self._prefill_plan(kv)

    def _prefill_plan(self, kv: KVManager) -> StepPlan:
        members = self.members
        n = len(members)
        prompts = tuple(r.prompt_tokens for r in members)
        tables = tuple(_table(kv, r, r.prompt_tokens) for r in members)
        chunks = (self._max_prompt,) * n if self.pad_prompts else prompts
        shape = StepShape(chunks, (0,) * n, padded_batch=self.padded_batch)
        return StepPlan(tuple(r.request_id for r in members), prompts, (0,) * n, tables,
                        (True,) * n, (True,) * n, shape)

    def _decode_plan(self, kv: KVManager) -> StepPlan:
        live = [r for r in self.members if r.state is RequestState.RUNNING]
        contexts = tuple(r.num_computed_tokens for r in live)
        tables = tuple(_table(kv, r, c + 1) for r, c in zip(live, contexts, strict=True))
        if self.pad_prompts:  # left padding: every row is as long as the longest prompt's
            charged = [c + self._max_prompt - r.prompt_tokens
                       for r, c in zip(live, contexts, strict=True)]
        else:
            charged = list(contexts)
        n = len(live)
        shape = StepShape(num_decodes=n, decode_context_sum=sum(charged),
                          decode_context_max=max(charged), padded_batch=self.padded_batch)
        return StepPlan(tuple(r.request_id for r in live), (1,) * n, contexts, tables,
                        (False,) * n, (True,) * n, shape)

    def abort(self, request_id: int) -> Request | None:
        """Take a live member out of the decodes (the caller marks it aborted); None if the
        batch has no such live member."""
        req = self._by_id.get(request_id)
        if req is None or req.state is not RequestState.RUNNING:
            return None
        req.state = RequestState.ABORTED
        self.num_live -= 1
        return req

    def apply(self, plan: StepPlan, now: float) -> list[Request]:
        """Advance every member in the plan; returns those that emitted their last token."""
        finished = []
        by_id = self._by_id
        for rid, new, emits in zip(plan.request_ids, plan.num_new_tokens, plan.emits_token,
                                   strict=True):
            if by_id[rid].advance(new, emits, now):
                finished.append(by_id[rid])
        self.num_live -= len(finished)
        self._prefilled = True
        return finished


def _table(kv: KVManager, req: Request, num_tokens: int) -> tuple[int, ...]:
    table = kv.append_slots(req.request_id, num_tokens)
    if table is None:  # add() rejected every request whose output outgrows its reservation
        raise RuntimeError(f"request {req.request_id} outgrew its KV reservation")
    return table
