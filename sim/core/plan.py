"""The step contract: what a scheduler asks the world to run, and what came back.

A `StepPlan` is stored column-wise (one tuple per field, aligned by position)
because the simulator builds one per engine step at batch sizes in the
hundreds; `plan.seqs` gives the per-sequence `SeqWork` view when wanted.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StepShape:
    """Just what costs time in a step; latency models and tables are keyed on it."""

    prefill_chunk_tokens: tuple[int, ...] = ()
    prefill_context_tokens: tuple[int, ...] = ()  # tokens already in KV before each chunk
    num_decodes: int = 0
    decode_context_sum: int = 0  # sum over decodes of tokens in KV before the step
    decode_context_max: int = 0
    padded_batch: int = 0  # slots the kernels run over (>= batch_size; static pads)
    # KV token slots (whole blocks) moved to / from the host pool by swap preemption;
    # the transfer costs host-link time on top of the step's kernels
    swap_out_tokens: int = 0
    swap_in_tokens: int = 0

    @property
    def num_prefills(self) -> int:
        return len(self.prefill_chunk_tokens)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(self.prefill_chunk_tokens)

    @property
    def num_tokens(self) -> int:
        """New tokens computed this step (prefill chunks plus one per decode)."""
        return self.num_prefill_tokens + self.num_decodes

    @property
    def batch_size(self) -> int:
        return self.num_prefills + self.num_decodes


@dataclass(frozen=True, slots=True)
class SeqWork:
    """One sequence's share of a step."""

    request_id: int
    num_new_tokens: int
    context_tokens: int  # tokens already in KV before the step
    block_ids: tuple[int, ...]
    is_prefill: bool
    emits_token: bool


@dataclass(frozen=True, slots=True)
class StepPlan:
    """Which requests run, how many new tokens each, their context and blocks."""

    request_ids: tuple[int, ...]
    num_new_tokens: tuple[int, ...]
    context_tokens: tuple[int, ...]
    block_tables: tuple[tuple[int, ...], ...]
    is_prefill: tuple[bool, ...]
    emits_token: tuple[bool, ...]
    shape: StepShape
    preempted_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.request_ids)
        if not (len(self.num_new_tokens) == len(self.context_tokens) == len(self.block_tables)
                == len(self.is_prefill) == len(self.emits_token) == n):
            raise ValueError("StepPlan columns must all have one entry per request")

    @property
    def batch_size(self) -> int:
        return len(self.request_ids)

    @property
    def num_emitting(self) -> int:
        return sum(self.emits_token)

    @property
    def seqs(self) -> Iterator[SeqWork]:
        for fields in zip(self.request_ids, self.num_new_tokens, self.context_tokens,
                          self.block_tables, self.is_prefill, self.emits_token, strict=True):
            yield SeqWork(*fields)


@dataclass(frozen=True, slots=True)
class StepResult:
    """What came back from running a plan.

    `token_ids` holds one sampled token per emitting sequence, in plan order;
    the simulator leaves it empty because its output lengths are scripted.
    """

    token_ids: tuple[int, ...] = ()
