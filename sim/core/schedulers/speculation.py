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

The running set applies these rules to whole numpy columns (running_batch.py:
k_i per sequence, and which sequences are still prefilling, i.e. did not emit
in their last step); with k = 0 nothing here applies.
"""

from __future__ import annotations

import numpy as np

from sim.core.plan import StepPlan, StepResult

SPECULATIVE_METHODS = ("ngram", "draft_model")
# the methods vLLM 0.32 runs under async scheduling (VllmConfig refuses async scheduling with
# a CPU drafter: "ngram" prompt lookup, like medusa, mlp_speculator and suffix, drafts from
# the sampled tokens on the host, so its steps cannot be scheduled ahead)
ASYNC_SPECULATIVE_METHODS = ("draft_model",)


def async_scheduling_problem(preemption: str, speculative_tokens: int,
                             speculative_method: str) -> str | None:
    """Why these settings cannot schedule asynchronously, or None when they can."""
    if speculative_tokens and speculative_method not in ASYNC_SPECULATIVE_METHODS:
        return (f"vLLM schedules {speculative_method!r} speculative decoding synchronously "
                f"(async scheduling runs only {', '.join(ASYNC_SPECULATIVE_METHODS)} drafts)")
    if preemption == "swap":
        return ("swap preemption is servesim's own and runs synchronously (vLLM v1 only "
                "recomputes)")
    return None


class Speculation:
    """k and the method, and the rules they set, for one sequence or a column of them."""

    __slots__ = ("_k", "_method", "max_model_len")

    def __init__(self, k: int, method: str, max_model_len: int | None) -> None:
        self.max_model_len = max_model_len
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

    def slots_each(self, num_tokens: np.ndarray) -> np.ndarray:
        """slots() of a column."""
        if not self._k or self._method != "draft_model":
            return num_tokens
        num_tokens = num_tokens + self._k
        return num_tokens if self.max_model_len is None else np.minimum(num_tokens,
                                                                        self.max_model_len)

    def drafts_each(self, remaining: np.ndarray, done: np.ndarray,
                    prefilling: np.ndarray) -> np.ndarray:
        """Drafts each running sequence adds to its `remaining` tokens: k when it decodes
        (one token left, some output emitted, not still prefilling), else 0."""
        return np.where((remaining == 1) & (done > 0) & (prefilling == 0), self._k, 0)

    def cap_each(self, computed: np.ndarray, new: np.ndarray) -> np.ndarray:
        """cap() of a column."""
        if self.max_model_len is None or not self._k:
            return new
        return np.minimum(new, self.max_model_len - computed - 1)

    def pads(self, computed: int, running_scheduled: bool, prefill_scheduled: bool) -> bool:
        """Whether an admission with one token left is padded to 1 + k."""
        return (not prefill_scheduled and (running_scheduled or computed > 0)
                and (self.max_model_len is None
                     or computed + 2 + self._k <= self.max_model_len))


def emitted_each(plan: StepPlan, result: StepResult) -> np.ndarray:
    """Tokens each sequence of `plan` emitted (0 for those that did not emit), checked.

    A sequence with k_i drafts emits 1..1 + (its new tokens - 1); one without, 1.
    """
    emitted = result.num_emitted
    if not emitted and not plan.num_spec_tokens:  # one token from each emitter: nothing to check
        return np.array(plan.emits_token, dtype=np.int64)
    emits = np.array(plan.emits_token, dtype=bool)
    counts = emits.astype(np.int64)
    if emitted:
        if len(emitted) != plan.num_emitting:
            raise ValueError(f"StepResult.num_emitted has {len(emitted)} entries for "
                             f"{plan.num_emitting} emitting sequences")
        counts[emits] = emitted
    spec = np.array(plan.num_spec_tokens or (0,) * plan.batch_size, dtype=np.int64)
    new = np.array(plan.num_new_tokens, dtype=np.int64)
    drafts = new - 1
    bad = (emits & ((spec > 0) & ((counts < 1) | (counts > new))
                    | (spec == 0) & (counts != 1))).nonzero()[0]
    if bad.size:
        i = int(bad[0])
        rid, count = plan.request_ids[i], int(counts[i])
        if not spec[i]:
            raise ValueError(f"request {rid}: emitted {count} tokens from a step with no "
                             "draft tokens")
        raise ValueError(f"request {rid}: emitted {count} tokens from a step with "
                         f"{drafts[i]} draft tokens (allowed 1..{1 + drafts[i]})")
    return counts
