"""A request's scripted lengths, lifecycle and timestamps.

The scheduler follows vLLM v1's rule: a request *knows* its prompt plus the
tokens it has emitted, and its *computed* tokens (those with KV in cache)
catch up to the known ones under the step's token budget. A step that brings
computed up to known emits one token. Preemption by recompute simply resets
computed to zero; the same rule then re-prefills prompt and output so far.

Memory: at overload the waiting queue holds most of a run's requests, so a
request that has only arrived is a twelve-slot object (128 bytes) of the
fields the hot paths touch; its counters, rejection reason and prompt contents
(which most simulated requests do without) live in a `_Details`, made at the
first write of one (as it leaves a running set), or at once for a request
with contents.
"""

from __future__ import annotations

from enum import Enum
from typing import Protocol

ABORTED_REASON = "aborted"  # the reason an aborted request is recorded under
DEFAULT_PREFIX_UNIT_TOKENS = 512


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


class _Details:
    """A request's own progress counters, rejection reason and prompt contents."""

    __slots__ = ("num_computed_tokens", "num_output_done", "spec_drafted", "spec_accepted",
                 "rejection_reason", "prompt_token_ids", "prefix_block_ids",
                 "prefix_unit_tokens")

    def __init__(self, prompt_token_ids: tuple[int, ...] | None = None,
                 prefix_block_ids: tuple[int, ...] | None = None,
                 prefix_unit_tokens: int = DEFAULT_PREFIX_UNIT_TOKENS,
                 counters: tuple[int, int, int, int] = (0, 0, 0, 0)) -> None:
        (self.num_computed_tokens, self.num_output_done, self.spec_drafted,
         self.spec_accepted) = counters
        self.rejection_reason: str | None = None
        self.prompt_token_ids = prompt_token_ids
        self.prefix_block_ids = prefix_block_ids
        self.prefix_unit_tokens = prefix_unit_tokens


class Request:
    """Mutable per-request state; kept compact because the hot loop touches it every step
    and an overloaded queue holds most of a run's requests.

    While a request runs under the continuous scheduler its progress counters
    (`num_computed_tokens`, `num_output_done`, `spec_drafted`, `spec_accepted`)
    live in the scheduler's numpy columns (`_live`) and these properties read them
    there; `first_scheduled_s`, `first_token_s`, `finish_s`, `state` and
    `num_preemptions` are set at the step they belong to.
    """

    __slots__ = ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "state",
                 "first_scheduled_s", "first_token_s", "finish_s", "num_preemptions",
                 "prefix_hit_tokens", "_live", "_details")

    def __init__(self, request_id: int, arrival_s: float, prompt_tokens: int,
                 output_tokens: int, prompt_token_ids: tuple[int, ...] | None = None,
                 prefix_block_ids: tuple[int, ...] | None = None,
                 prefix_unit_tokens: int = DEFAULT_PREFIX_UNIT_TOKENS) -> None:
        """`prefix_block_ids`: content ids of the prompt's consecutive
        `prefix_unit_tokens`-token pieces (the last may be partial): equal ids = equal
        tokens, as in Mooncake's hash_ids."""
        if prompt_tokens < 1:
            raise ValueError(f"request {request_id}: prompt_tokens must be >= 1")
        if output_tokens < 1:
            raise ValueError(f"request {request_id}: output_tokens must be >= 1")
        self.request_id = request_id
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.state = RequestState.WAITING
        self.first_scheduled_s: float | None = None
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.num_preemptions = 0
        self.prefix_hit_tokens = 0
        self._live: LiveCounters | None = None
        plain = (prompt_token_ids is None and prefix_block_ids is None
                 and prefix_unit_tokens == DEFAULT_PREFIX_UNIT_TOKENS)
        self._details = None if plain else _Details(prompt_token_ids, prefix_block_ids,
                                                    prefix_unit_tokens)

    def __repr__(self) -> str:
        return (f"Request(request_id={self.request_id!r}, arrival_s={self.arrival_s!r}, "
                f"prompt_tokens={self.prompt_tokens!r}, output_tokens={self.output_tokens!r}, "
                f"state={self.state})")

    def _made_details(self) -> _Details:
        details = self._details = _Details()
        return details

    def rescripted(self, arrival_s: float, output_tokens: int) -> Request:
        """A fresh copy, nothing scheduled yet, arriving at `arrival_s` with `output_tokens`."""
        return Request(self.request_id, arrival_s, self.prompt_tokens, output_tokens,
                       self.prompt_token_ids, self.prefix_block_ids, self.prefix_unit_tokens)

    # -- the prompt's contents ---------------------------------------------------------
    @property
    def prompt_token_ids(self) -> tuple[int, ...] | None:
        details = self._details
        return None if details is None else details.prompt_token_ids

    @property
    def prefix_block_ids(self) -> tuple[int, ...] | None:
        details = self._details
        return None if details is None else details.prefix_block_ids

    @property
    def prefix_unit_tokens(self) -> int:
        details = self._details
        return DEFAULT_PREFIX_UNIT_TOKENS if details is None else details.prefix_unit_tokens

    # -- the progress counters: the request's own unless a running set holds them --------
    @property
    def num_computed_tokens(self) -> int:
        """Tokens with KV in cache."""
        live = self._live
        if live is not None:
            return live.counter(self, "num_computed_tokens")
        details = self._details
        return 0 if details is None else details.num_computed_tokens

    @num_computed_tokens.setter
    def num_computed_tokens(self, value: int) -> None:
        if self._live is not None:
            self._live.set_counter(self, "num_computed_tokens", value)
        else:
            (self._details or self._made_details()).num_computed_tokens = value

    @property
    def num_output_done(self) -> int:
        """Output tokens emitted so far."""
        live = self._live
        if live is not None:
            return live.counter(self, "num_output_done")
        details = self._details
        return 0 if details is None else details.num_output_done

    @num_output_done.setter
    def num_output_done(self, value: int) -> None:
        if self._live is not None:
            self._live.set_counter(self, "num_output_done", value)
        else:
            (self._details or self._made_details()).num_output_done = value

    @property
    def spec_drafted(self) -> int:
        """Speculative decoding: draft tokens verified."""
        live = self._live
        if live is not None:
            return live.counter(self, "spec_drafted")
        details = self._details
        return 0 if details is None else details.spec_drafted

    @spec_drafted.setter
    def spec_drafted(self, value: int) -> None:
        if self._live is not None:
            self._live.set_counter(self, "spec_drafted", value)
        else:
            (self._details or self._made_details()).spec_drafted = value

    @property
    def spec_accepted(self) -> int:
        """Speculative decoding: draft tokens accepted."""
        live = self._live
        if live is not None:
            return live.counter(self, "spec_accepted")
        details = self._details
        return 0 if details is None else details.spec_accepted

    @spec_accepted.setter
    def spec_accepted(self, value: int) -> None:
        if self._live is not None:
            self._live.set_counter(self, "spec_accepted", value)
        else:
            (self._details or self._made_details()).spec_accepted = value

    def counters(self) -> tuple[int, int, int, int]:
        """(num_computed_tokens, num_output_done, spec_drafted, spec_accepted) in one read."""
        if self._live is not None:
            return (self.num_computed_tokens, self.num_output_done, self.spec_drafted,
                    self.spec_accepted)
        details = self._details
        if details is None:
            return (0, 0, 0, 0)
        return (details.num_computed_tokens, details.num_output_done, details.spec_drafted,
                details.spec_accepted)

    def take_counters(self, computed: int, output_done: int, drafted: int,
                      accepted: int) -> None:
        """The running set that held its counters hands them back (it leaves the set)."""
        self._live = None
        details = self._details
        if details is None:  # a request without contents: the first write of its own
            self._details = _Details(counters=(computed, output_done, drafted, accepted))
            return
        details.num_computed_tokens = computed
        details.num_output_done = output_done
        details.spec_drafted = drafted
        details.spec_accepted = accepted

    # -- the rarer lifecycle fields ------------------------------------------------------
    @property
    def rejection_reason(self) -> str | None:
        details = self._details
        return None if details is None else details.rejection_reason

    @rejection_reason.setter
    def rejection_reason(self, value: str | None) -> None:
        (self._details or self._made_details()).rejection_reason = value

    # -- derived -------------------------------------------------------------------------
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
        details = self._details or self._made_details()
        details.num_computed_tokens += num_new_tokens
        if not emits_token:
            return False
        details.num_output_done += 1
        if self.first_token_s is None:
            self.first_token_s = now
        if details.num_output_done < self.output_tokens:
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
