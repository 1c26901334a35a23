"""The step contract: what a scheduler asks the world to run, and what came back.

A `StepPlan` is stored column-wise (one tuple per field, aligned by position)
because the simulator builds one per engine step at batch sizes in the
hundreds; `plan.seqs` gives the per-sequence `SeqWork` view when wanted.

Speculative decoding (the scheduler's `speculative_tokens` = k > 0):
- A decoding sequence is scheduled 1 + k_i new tokens: its last emitted token
  plus k_i draft tokens, k_i = k unless the token budget or max_model_len cuts
  it (vLLM's rules, sim/core/schedulers/speculation.py: drafts run to the last
  step, whatever is left to emit). Its `context_tokens` is the KV before the
  step; KV slots are allocated for all 1 + k_i; `is_prefill` is False and
  `emits_token` True. `num_spec_tokens` holds k_i per sequence (0 for
  prefills and plain decodes), or is empty when no sequence of the step
  drafts, so plans without speculation are unchanged.
- The world proposes the k_i draft tokens itself (the plan says how many, not
  which: a draft model's k_i sequential passes, or prompt lookup), runs the
  target once over all 1 + k_i positions, writing their KV at slots context ..
  context + k_i of the block table, and verifies: the sequence emits 1 + a_i
  tokens, a_i the accepted drafts (0 <= a_i <= k_i; the +1 is the target's own
  token after the last accepted draft). `StepResult.num_emitted` reports 1 +
  a_i per emitting sequence (plan order, 1 for those without drafts) and
  `token_ids` all the emitted tokens, sequence after sequence. An empty
  `num_emitted` means every draft was rejected.
- The scheduler applies it: output done += 1 + a_i, computed = context + 1 +
  a_i, except that tokens past the scripted output are discarded (vLLM stops
  at max_tokens). The rejected drafts' KV slots roll back: the next step
  overwrites them, and its plan's context says where the valid KV ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple


class StepShape(NamedTuple):
    """Just what costs time in a step; latency models and tables are keyed on it.

    An immutable NamedTuple rather than a frozen dataclass: the simulator makes one per
    step and decode-run segment and the latency models hash it as their memo key; a
    tuple is built ~5x faster (a frozen dataclass's __init__ sets each field through
    object.__setattr__) and hashed ~3x faster. Equality and hash are the fields' tuple's,
    as the dataclass's were. Change a field with `shape._replace(...)`.
    """

    prefill_chunk_tokens: tuple[int, ...] = ()
    prefill_context_tokens: tuple[int, ...] = ()  # tokens already in KV before each chunk
    num_decodes: int = 0
    decode_context_sum: int = 0  # sum over decodes of tokens in KV before the step
    decode_context_max: int = 0
    padded_batch: int = 0  # slots the kernels run over (>= batch_size; static pads)
    # KV token slots (whole blocks) moved to / from the host pool by swap preemption, as
    # counts (summary.json's swapped bytes): the copies themselves are KVTransfers the
    # scheduler issues (take_transfers) and the latency models price as moved_s
    swap_out_tokens: int = 0
    swap_in_tokens: int = 0
    # speculative decoding: decodes that verify k_i >= 1 draft tokens (part of num_decodes),
    # the sum and max of their k_i, and the sum of their contexts (tokens in KV before)
    num_spec_decodes: int = 0
    num_spec_tokens: int = 0
    spec_depth: int = 0
    spec_context_sum: int = 0
    # (KV loaded back from offload tiers is no part of the shape: the scheduler issues it
    # as KVTransfers, take_transfers, which the world sends on its shared links)

    @property
    def num_prefills(self) -> int:
        return len(self.prefill_chunk_tokens)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(self.prefill_chunk_tokens)

    @property
    def num_tokens(self) -> int:
        """New tokens computed this step (prefill chunks, one per decode, draft tokens)."""
        return self.num_prefill_tokens + self.num_decodes + self.num_spec_tokens

    @property
    def decode_query_tokens(self) -> float:
        """Mean query positions per decode: 1 + k for a speculative verify, else 1.

        What a calibrated table keys multi-token decode shapes on (1 without decodes).
        """
        if not self.num_spec_tokens:
            return 1.0
        return 1.0 + self.num_spec_tokens / self.num_decodes

    @property
    def batch_size(self) -> int:
        return self.num_prefills + self.num_decodes


class SeqWork(NamedTuple):
    """One sequence's share of a step (a NamedTuple, as StepShape: cheap to build)."""

    request_id: int
    num_new_tokens: int
    context_tokens: int  # tokens already in KV before the step
    block_ids: tuple[int, ...]
    is_prefill: bool
    emits_token: bool
    num_spec_tokens: int = 0  # draft tokens among num_new_tokens (speculative decoding)


class StepPlan(NamedTuple):
    """Which requests run, how many new tokens each, their context and blocks.

    An immutable NamedTuple (one per engine step: built ~4x faster than a frozen
    dataclass). Its columns must all have one entry per request: the simulator's own
    builders make them so; a plan made anywhere else (a test, a hand-written step)
    goes through `checked_plan`, which the real engine also applies to what it runs.
    """

    request_ids: tuple[int, ...]
    num_new_tokens: tuple[int, ...]
    context_tokens: tuple[int, ...]
    block_tables: tuple[tuple[int, ...], ...]
    is_prefill: tuple[bool, ...]
    emits_token: tuple[bool, ...]
    shape: StepShape
    preempted_ids: tuple[int, ...] = ()
    # k_i per sequence: draft tokens among its num_new_tokens; () = none drafts this step
    num_spec_tokens: tuple[int, ...] = ()

    @property
    def batch_size(self) -> int:
        return len(self.request_ids)

    @property
    def num_emitting(self) -> int:
        return sum(self.emits_token)

    @property
    def seqs(self) -> Iterator[SeqWork]:
        spec = self.num_spec_tokens or (0,) * len(self.request_ids)
        for fields in zip(self.request_ids, self.num_new_tokens, self.context_tokens,
                          self.block_tables, self.is_prefill, self.emits_token, spec,
                          strict=True):
            yield SeqWork(*fields)


def checked_plan(plan: StepPlan) -> StepPlan:
    """`plan`, if its columns all have one entry per request (num_spec_tokens: or none);
    else ValueError. Not in StepPlan's constructor: the simulator's builders make aligned
    columns by construction, and a check there would double a plan's cost."""
    n = len(plan.request_ids)
    if not (len(plan.num_new_tokens) == len(plan.context_tokens) == len(plan.block_tables)
            == len(plan.is_prefill) == len(plan.emits_token) == n):
        raise ValueError("StepPlan columns must all have one entry per request")
    if plan.num_spec_tokens and len(plan.num_spec_tokens) != n:
        raise ValueError("StepPlan.num_spec_tokens must be empty or one entry per request")
    return plan


class StepResult(NamedTuple):
    """What came back from running a plan (a NamedTuple, as StepShape: cheap to build).

    `token_ids` holds one sampled token per emitting sequence, in plan order;
    the simulator leaves it empty because its output lengths are scripted.

    `num_emitted` (speculative decoding): per emitting sequence, in plan order,
    the tokens it emitted, 1 + accepted drafts (1 <= n <= 1 + its k_i); empty =
    one each. With it, `token_ids` holds every emitted token, sequence after
    sequence (sum(num_emitted) of them) when the world samples real tokens.
    """

    token_ids: tuple[int, ...] = ()
    num_emitted: tuple[int, ...] = ()
