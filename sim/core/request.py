"""A request's scripted lengths, lifecycle and timestamps.

The scheduler follows vLLM v1's rule: a request *knows* its prompt plus the
tokens it has emitted, and its *computed* tokens (those with KV in cache)
catch up to the known ones under the step's token budget. A step that brings
computed up to known emits one token. Preemption by recompute simply resets
computed to zero; the same rule then re-prefills prompt and output so far.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

ABORTED_REASON = "aborted"  # the reason an aborted request is recorded under


class RequestState(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    REJECTED = "rejected"
    ABORTED = "aborted"  # dropped before it finished (a client went away)


class LiveCounters(Protocol):
    """Where a running request's progress counters live (the continuous scheduler's
    numpy-column running set): read and written there while it runs."""

    def counter(self, request: Request, name: str) -> int: ...

    def set_counter(self, request: Request, name: str, value: int) -> None: ...


@dataclass(slots=True, eq=False)
class Request:
    """Mutable per-request state; kept compact because the hot loop touches it every step.

    While a request runs under the continuous scheduler its progress counters
    (`num_computed_tokens`, `num_output_done`, `spec_drafted`, `spec_accepted`)
    live in the scheduler's numpy columns and these properties read them there;
    `first_scheduled_s`, `first_token_s`, `finish_s`, `state` and
    `num_preemptions` are set at the step they belong to.
    """

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prompt_token_ids: tuple[int, ...] | None = None
    # content ids of the prompt's consecutive `prefix_unit_tokens`-token pieces (the
    # last may be partial): equal ids = equal tokens, as in Mooncake's hash_ids
    prefix_block_ids: tuple[int, ...] | None = None
    prefix_unit_tokens: int = 512

    state: RequestState = RequestState.WAITING
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    num_preemptions: int = 0
    prefix_hit_tokens: int = 0
    rejection_reason: str | None = None
    _num_computed_tokens: int = field(default=0, init=False, repr=False)
    _num_output_done: int = field(default=0, init=False, repr=False)
    _spec_drafted: int = field(default=0, init=False, repr=False)
    _spec_accepted: int = field(default=0, init=False, repr=False)
    _live: LiveCounters | None = field(default=None, init=False, repr=False)

    # the progress counters: the request's own unless a running set holds them (_live)
    @property
    def num_computed_tokens(self) -> int:
        """Tokens with KV in cache."""
        live = self._live
        return self._num_computed_tokens if live is None else live.counter(
            self, "num_computed_tokens")

    @num_computed_tokens.setter
    def num_computed_tokens(self, value: int) -> None:
        if self._live is None:
            self._num_computed_tokens = value
        else:
            self._live.set_counter(self, "num_computed_tokens", value)

    @property
    def num_output_done(self) -> int:
        """Output tokens emitted so far."""
        live = self._live
        return self._num_output_done if live is None else live.counter(self, "num_output_done")

    @num_output_done.setter
    def num_output_done(self, value: int) -> None:
        if self._live is None:
            self._num_output_done = value
        else:
            self._live.set_counter(self, "num_output_done", value)

    @property
    def spec_drafted(self) -> int:
        """Speculative decoding: draft tokens verified."""
        live = self._live
        return self._spec_drafted if live is None else live.counter(self, "spec_drafted")

    @spec_drafted.setter
    def spec_drafted(self, value: int) -> None:
        if self._live is None:
            self._spec_drafted = value
        else:
            self._live.set_counter(self, "spec_drafted", value)

    @property
    def spec_accepted(self) -> int:
        """Speculative decoding: draft tokens accepted."""
        live = self._live
        return self._spec_accepted if live is None else live.counter(self, "spec_accepted")

    @spec_accepted.setter
    def spec_accepted(self, value: int) -> None:
        if self._live is None:
            self._spec_accepted = value
        else:
            self._live.set_counter(self, "spec_accepted", value)

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise ValueError(f"request {self.request_id}: prompt_tokens must be >= 1")
        if self.output_tokens < 1:
            raise ValueError(f"request {self.request_id}: output_tokens must be >= 1")

    @property
    def num_known_tokens(self) -> int:
        """Prompt plus tokens emitted so far: what the KV must eventually cover."""
        return self.prompt_tokens + self.num_output_done

    @property
    def max_kv_tokens(self) -> int:
        """KV slots held at the end: the last emitted token is never fed back."""
        return self.prompt_tokens + self.output_tokens - 1

    @property
    def is_done(self) -> bool:
        return self.state in (RequestState.FINISHED, RequestState.REJECTED,
                              RequestState.ABORTED)

    def advance(self, num_new_tokens: int, emits_token: bool, now: float) -> bool:
        """Apply one step's work to this request (request-level batching, whose requests keep
        their own counters); True if it emitted its last token."""
        assert self._live is None, "a running set applies its requests' steps"
        self._num_computed_tokens += num_new_tokens
        if not emits_token:
            return False
        self._num_output_done += 1
        if self.first_token_s is None:
            self.first_token_s = now
        if self._num_output_done < self.output_tokens:
            return False
        self.state = RequestState.FINISHED
        self.finish_s = now
        return True

    def abort(self, now: float, reason: str = ABORTED_REASON) -> None:
        """Dropped by its scheduler before it finished; recorded with the rejected, by reason."""
        self.state = RequestState.ABORTED
        self.rejection_reason = reason
        self.finish_s = now

    def reject(self, reason: str, now: float) -> None:
        self.state = RequestState.REJECTED
        self.rejection_reason = reason
        self.finish_s = now
