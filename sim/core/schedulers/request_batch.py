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

Once prefilled, a batch's plans depend on nothing but its members (arrivals wait
for the next batch): every later step is the last one with every context a token
longer, less the members that finished in it. So the rest of a batch is one
decode run (sim.core.decode_run) across its members' finishes: `decode_run`
describes it, segment by segment (a segment per set of live members), and
`advance_plain` applies a segment's steps in which nobody finishes; the step a
member finishes in is planned and applied as step by step (`plan`, `apply`).
"""

from __future__ import annotations

import numpy as np

from sim.core.decode_run import DecodeRun
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
        live = self._live()
        contexts = tuple(r.num_computed_tokens for r in live)
        tables = tuple(_table(kv, r, c + 1) for r, c in zip(live, contexts, strict=True))
        charged = self._charged(live, contexts)
        n = len(live)
        return StepPlan(tuple(r.request_id for r in live), (1,) * n, contexts, tables,
                        (False,) * n, (True,) * n,
                        self._decode_shape(n, sum(charged), max(charged)))

    def _live(self) -> list[Request]:
        return [r for r in self.members if r.state is RequestState.RUNNING]

    def _charged(self, live: list[Request], contexts: tuple[int, ...]) -> list[int]:
        """The contexts the kernels run over: left padding makes every row as long as the
        longest prompt's (pad_prompts)."""
        if not self.pad_prompts:
            return list(contexts)
        return [c + self._max_prompt - r.prompt_tokens for r, c in zip(live, contexts,
                                                                        strict=True)]

    def _decode_shape(self, n: int, context_sum: int, context_max: int) -> StepShape:
        return StepShape(num_decodes=n, decode_context_sum=context_sum,
                         decode_context_max=context_max, padded_batch=self.padded_batch)

    def decode_run(self, kv: KVManager, num_waiting: int, kv_blocked: bool,
                   max_steps: int) -> DecodeRun | None:
        """The rest of the prefilled batch as one decode run, to its longest member's last
        step: a segment per set of live members, each but the last ending with the step
        some finish in. None before the prefill, or for fewer than two steps."""
        if not self._prefilled:
            return None
        live = self._live()
        left = [r.output_tokens - r.num_output_done for r in live]  # finishes in step left - 1
        steps = min(max(left), max_steps)
        if steps < 2:
            return None
        charged = self._charged(live, tuple(r.num_computed_tokens for r in live))
        segments = []
        for s in sorted({x for x in left if x < steps}):  # after a finishers' step s - 1
            rest = [c for c, x in zip(charged, left, strict=True) if x > s]
            m = len(rest)
            segments.append((s, m, sum(rest) + s * m, max(rest) + s, self.padded_batch))
        return DecodeRun(steps, self._decode_shape(len(live), sum(charged), max(charged)),
                         np.full(steps, kv.num_used_blocks, dtype=np.int64),
                         num_waiting, False, kv.block_size, kv_blocked, tuple(segments))

    def live_context_sum(self) -> int:
        """The live members' contexts as a plan's columns count them (no padding)."""
        return sum(r.num_computed_tokens for r in self._live())

    def advance_plain(self, steps: int, kv: KVManager) -> None:
        """Apply `steps` decode steps in which no member finishes, as step by step would:
        each live member a token further, its table as the last plan showed it."""
        for r in self._live():
            r.num_computed_tokens += steps
            r.num_output_done += steps
            _table(kv, r, r.num_computed_tokens)

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
