"""The continuous scheduler's speculative-decoding rules: vLLM v1's, for k drafts per sequence.

The step contract is in sim/core/plan.py. What vLLM's scheduler decides, and
so this module:
- A decoding sequence (its last step emitted a token) is scheduled its last
  token plus all k drafts, cut only by the token budget and by max_model_len
  (positions past max_model_len - 1 are never scheduled), not by how many
  tokens it has left to emit: tokens verified past its scripted output are
  discarded (vLLM stops at max_tokens). A sequence still prefilling never drafts.
- A request admitted with one token left to compute (a resumed decode, or a
  prompt cached but for its last token) is padded to 1 + k, as vLLM pads it to
  keep the step's CUDA-graph shape, when no running prefill is in the step and
  the step has a running request (or the admission computed tokens already),
  and no admission follows if the padded size does not fit the budget.
- The method sets two costs: "draft_model" (a separate draft model) takes one
  extra budget slot per scheduled request and k lookahead KV slots past the
  scheduled tokens (vLLM's max_num_new_slots_for_drafting = 1 and
  num_lookahead_tokens = k); "ngram" (prompt lookup) takes neither.
- After the step each drafting sequence emitted 1 + a_i tokens (the world's
  verifier says a_i); the rejected drafts roll back (computed = context + 1 + a_i).

Speculation runs on a per-request loop (ContinuousScheduler._schedule_each);
with k = 0 nothing here applies.
"""

from __future__ import annotations

from collections.abc import Iterator

from sim.core.plan import StepPlan, StepResult
from sim.core.request import Request

SPECULATIVE_METHODS = ("ngram", "draft_model")


class Speculation:
    """k and the method, plus which running requests are still prefilling (they never draft)."""

    __slots__ = ("_k", "_method", "max_model_len", "_prefilling")

    def __init__(self, k: int, method: str, max_model_len: int | None) -> None:
        self.max_model_len = max_model_len
        self._prefilling: set[int] = set()
        self.k = k
        self.method = method

    @property
    def k(self) -> int:
        return self._k

    @k.setter
    def k(self, k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"speculative_tokens must be an integer >= 0, got {k!r}")
        self._k = k

    @property
    def method(self) -> str:
        return self._method

    @method.setter
    def method(self, method: str) -> None:
        if method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative_method must be one of "
                             f"{', '.join(SPECULATIVE_METHODS)}, got {method!r}")
        self._method = method

    @property
    def draft_slots(self) -> int:
        """Budget slots every scheduled request costs on top of its tokens."""
        return 1 if self._k and self._method == "draft_model" else 0

    def slots(self, num_tokens: int) -> int:
        """KV slots a request needs to compute up to `num_tokens` (+ the draft's lookahead)."""
        if not self._k or self._method != "draft_model":
            return num_tokens
        num_tokens += self._k
        return num_tokens if self.max_model_len is None else min(num_tokens, self.max_model_len)

    def drafts(self, req: Request, new: int) -> int:
        """Drafts a running request adds to its `new` tokens: k when it decodes, else 0."""
        if new == 1 and req.num_output_done and req.request_id not in self._prefilling:
            return self._k
        return 0

    def prefilling(self, req: Request) -> bool:
        return req.request_id in self._prefilling

    def cap(self, computed: int, new: int) -> int:
        """No position past max_model_len - 1 (only drafts can reach it)."""
        if self.max_model_len is None or not self._k:
            return new
        return min(new, self.max_model_len - computed - 1)

    def pads(self, computed: int, running_scheduled: bool, prefill_scheduled: bool) -> bool:
        """Whether an admission with one token left is padded to 1 + k."""
        return (not prefill_scheduled and (running_scheduled or computed > 0)
                and (self.max_model_len is None
                     or computed + 2 + self._k <= self.max_model_len))

    def forget(self, req: Request) -> None:
        """A preempted request drops its drafts; its next admission decides afresh."""
        self._prefilling.discard(req.request_id)

    def apply(self, plan: StepPlan, result: StepResult, now: float,
              in_flight: dict[int, Request]) -> Iterator[Request]:
        """Apply a step: each emitting sequence emitted result.num_emitted[j]; yields the finished.

        Also learns which sequences are still prefilling (those that did not emit).
        """
        emitted = result.num_emitted
        if emitted and len(emitted) != plan.num_emitting:
            raise ValueError(f"StepResult.num_emitted has {len(emitted)} entries for "
                             f"{plan.num_emitting} emitting sequences")
        spec = plan.num_spec_tokens or (0,) * plan.batch_size
        prefilling, j = self._prefilling, 0
        for rid, new, emits, k in zip(plan.request_ids, plan.num_new_tokens, plan.emits_token,
                                      spec, strict=True):
            req = in_flight[rid]
            count = 1
            if emits:
                prefilling.discard(rid)
                if emitted:
                    count = emitted[j]
                    j += 1
            else:
                prefilling.add(rid)
            if k:
                done = req.advance_speculative(new, count, now)
            elif count != 1:
                raise ValueError(f"request {rid}: emitted {count} tokens from a step with no "
                                 "draft tokens")
            else:
                done = req.advance(new, emits, now)
            if done:
                yield req
