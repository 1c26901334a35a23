"""Multi-turn conversations: each turn's prompt extends the previous prompt and answer.

Turn k+1's prompt = turn k's prompt + its answer (output_tokens) + a new user
message, so its content ids start with every full unit of turn k's prompt:
within a conversation, unit j gets the same id in every turn where it is full
(history is append-only, so a full unit's tokens never change), and a partial
last unit gets a fresh id each time (see `prefixes`). The answer's units are
first named by the next turn: the simulator knows only prompt ids, so an
id-based cache can reuse a turn's prompt, not its answer, until the next
turn's prefill has computed it.

The simulator scripts arrivals up front, so a follow-up does not wait for the
actual answer: it arrives at the previous turn's arrival + output_tokens *
`assumed_tpot_s` + a think time. With a slow server a follow-up can arrive
before its predecessor finishes; the scheduler then prefills shared history
twice, exactly as a real server would on such a client.

Conversations start by the configured arrival process and are generated
lazily in arrival order with a heap of the conversations in flight, so memory
is bounded by the conversations alive at once, not by the run's length.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from sim.core.request import Request
from sim.workload.arrivals import ArrivalProcess, arrival_times_s
from sim.workload.lengths import DrawStream, LengthSpec, length_stream, lognormal_params
from sim.workload.prefixes import IdSource, SharedPrefix, prompt_ids

TimeKind = Literal["fixed", "exponential", "lognormal"]


@dataclass(frozen=True, slots=True)
class ThinkTime:
    """Seconds a user takes before the next turn: fixed, exponential or lognormal(mean, cv)."""

    kind: TimeKind
    mean_s: float
    cv: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "exponential", "lognormal"):
            raise ValueError(f"unknown think-time distribution {self.kind!r}")
        if not (math.isfinite(self.mean_s) and self.mean_s >= 0 and self.cv >= 0):
            raise ValueError(f"think time needs finite mean_s >= 0 and cv >= 0: {self}")
        if self.kind != "fixed" and self.mean_s == 0:
            raise ValueError(f"{self.kind} think time needs mean_s > 0")

    def sample_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            return np.full(n, self.mean_s)
        if self.kind == "exponential":
            return rng.exponential(self.mean_s, n)
        mu, sigma = lognormal_params(self.mean_s, self.cv)
        return rng.lognormal(mu, sigma, n)


@dataclass(frozen=True, slots=True)
class ConversationSpec:
    """Everything but the arrival process of conversation starts."""

    first_prompt: LengthSpec
    output: LengthSpec
    user: LengthSpec
    turns: LengthSpec
    think: ThinkTime
    assumed_tpot_s: float = 0.0
    num_conversations: int | None = None
    max_prompt_tokens: int | None = None
    shared_prefix: SharedPrefix | None = None
    unit_tokens: int = 16

    def __post_init__(self) -> None:
        if self.unit_tokens < 1:
            raise ValueError(f"unit_tokens must be >= 1, got {self.unit_tokens}")
        if self.shared_prefix is not None and self.shared_prefix.unit_tokens != self.unit_tokens:
            raise ValueError("shared_prefix.unit_tokens must equal the conversation's")
        if not (math.isfinite(self.assumed_tpot_s) and self.assumed_tpot_s >= 0):
            raise ValueError(f"assumed_tpot_s must be finite and >= 0: {self.assumed_tpot_s}")


@dataclass(frozen=True, slots=True)
class Turn:
    """A request and where it sits: conversation number and 0-based turn index."""

    conversation: int
    turn: int
    request: Request


@dataclass(order=True, slots=True)
class _Chat:
    """A conversation in flight, ordered by its next turn's arrival (ties: older first)."""

    arrival_s: float
    conversation: int
    turn: int = field(compare=False)
    turns: int = field(compare=False)
    prompt_tokens: int = field(compare=False)
    known_ids: list[int] = field(compare=False)


def conversation_turns(
    spec: ConversationSpec,
    starts: ArrivalProcess,
    seed: int,
    limit: float = math.inf,
    end_s: float = math.inf,
    chunk_size: int = 8192,
) -> Iterator[Turn]:
    """Turns in arrival order, request ids 0, 1, 2, ...; stops at `limit` or before `end_s`.

    Draws come from child streams of one `SeedSequence` (0 starts, 1 first prompts,
    2 outputs, 3 system-prompt choices, 4 turn counts, 5 user messages, 6 think times).
    """
    rngs = [np.random.default_rng(c) for c in np.random.SeedSequence(seed).spawn(7)]
    starts_s = arrival_times_s(starts, rngs[0], chunk_size)

    first, output, turns, user = (
        length_stream(s, rngs[i], chunk_size)
        for s, i in ((spec.first_prompt, 1), (spec.output, 2), (spec.turns, 4), (spec.user, 5))
    )
    prefix = spec.shared_prefix
    choices: DrawStream[int] | None = None
    if prefix is not None:
        choices = DrawStream(lambda n: prefix.draw_choices(rngs[3], n), chunk_size)
    think: DrawStream[float] = DrawStream(lambda n: spec.think.sample_s(rngs[6], n), chunk_size)
    ids = IdSource(prefix.num_reserved_ids if prefix is not None else 0)
    cap = spec.num_conversations if spec.num_conversations is not None else math.inf
    heap: list[_Chat] = []
    started = 0
    next_start_s = next(starts_s)
    request_id = 0
    while request_id < limit:
        if heap and heap[0].arrival_s <= next_start_s:
            chat = heapq.heappop(heap)
        elif started < cap:
            chat = _Chat(next_start_s, started, 0, turns.draw(), first.draw(), [])
            if choices is not None and prefix is not None and (which := choices.draw()) >= 0:
                chat.prompt_tokens = max(chat.prompt_tokens, prefix.tokens + 1)
                chat.known_ids = prefix.system_ids(which)
            started += 1
            next_start_s = next(starts_s) if started < cap else math.inf
        else:
            return
        if chat.arrival_s >= end_s:
            return
        answer = output.draw()
        prefix_ids = prompt_ids(chat.prompt_tokens, chat.known_ids, spec.unit_tokens, ids)
        request = Request(
            request_id,
            chat.arrival_s,
            chat.prompt_tokens,
            answer,
            prefix_block_ids=prefix_ids,
            prefix_unit_tokens=spec.unit_tokens,
        )
        yield Turn(chat.conversation, chat.turn, request)
        request_id += 1
        if chat.turn + 1 < chat.turns:
            next_prompt = chat.prompt_tokens + answer + user.draw()
            if spec.max_prompt_tokens is None or next_prompt <= spec.max_prompt_tokens:
                chat.arrival_s += answer * spec.assumed_tpot_s + think.draw()
                chat.turn += 1
                chat.prompt_tokens = next_prompt
                heapq.heappush(heap, chat)
