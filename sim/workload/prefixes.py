"""Prefix content ids for synthetic prompts: who shares which tokens with whom.

Synthetic requests carry no tokens, so their content is named the way the
Mooncake trace names it: `prefix_block_ids[j]` names tokens
[j*unit, (j+1)*unit) of the prompt, equal ids = equal tokens. A partial last
unit always gets an id of its own (its content is a strict prefix of whatever
a longer prompt holds there), so only full units can ever match.

Shared system prompt: system prompt k of S tokens owns ids
k*floor(S/unit) .. (k+1)*floor(S/unit) - 1, reserved before any fresh id. The
unit that straddles the end of the system prompt mixes shared and private
tokens, so it is private. A shared request's prompt is max(drawn, S + 1):
the system prompt counts inside the prompt and at least one private token
(the user's message) follows it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np


def num_units(tokens: int, unit_tokens: int) -> int:
    """Ids a prompt of `tokens` carries: ceil(tokens / unit_tokens)."""
    return -(-tokens // unit_tokens)


class IdSource:
    """Fresh content ids, never handed out twice; one per generated stream, not global."""

    __slots__ = ("_counter",)

    def __init__(self, first_id: int = 0) -> None:
        self._counter = itertools.count(first_id)

    def take(self, n: int) -> list[int]:
        return [next(self._counter) for _ in range(n)]

    def one(self) -> int:
        return next(self._counter)


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    """A `fraction` of requests start with one of `num_prompts` S-token system prompts."""

    fraction: float
    tokens: int
    num_prompts: int = 1
    unit_tokens: int = 16

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"fraction must be in [0, 1], got {self.fraction}")
        if self.tokens < 1 or self.num_prompts < 1 or self.unit_tokens < 1:
            raise ValueError(f"tokens, num_prompts and unit_tokens must be >= 1: {self}")

    @property
    def full_units(self) -> int:
        """Units wholly inside the system prompt: the only ones requests share."""
        return self.tokens // self.unit_tokens

    @property
    def num_reserved_ids(self) -> int:
        return self.num_prompts * self.full_units

    def system_ids(self, which: int) -> list[int]:
        """Content ids of system prompt `which`'s full units."""
        first = which * self.full_units
        return list(range(first, first + self.full_units))

    def draw_choices(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Per request: -1 for a private prompt, else which system prompt it opens with."""
        shared = rng.random(n) < self.fraction
        which = rng.integers(0, self.num_prompts, size=n)
        return np.where(shared, which, -1)


def prompt_ids(
    prompt_tokens: int, known_ids: list[int], unit_tokens: int, ids: IdSource
) -> tuple[int, ...]:
    """Ids for a prompt whose leading full units are `known_ids`; the rest are fresh.

    `known_ids` is extended in place with the fresh ids of the prompt's new full
    units, so a later prompt that extends this one (the next turn) reuses them.
    The partial last unit, if any, gets a fresh id that is not recorded.
    """
    full = prompt_tokens // unit_tokens
    if full > len(known_ids):
        known_ids.extend(ids.take(full - len(known_ids)))
    head = known_ids[:full]
    if prompt_tokens % unit_tokens:
        head = [*head, ids.one()]
    return tuple(head)


def shared_prompt(
    prefix: SharedPrefix, choice: int, drawn_tokens: int, ids: IdSource
) -> tuple[int, tuple[int, ...], list[int]]:
    """(prompt tokens, its ids, its full-unit ids) for a request given its `choice`.

    `ids` must start at or above `prefix.num_reserved_ids`.
    """
    if choice < 0:
        known: list[int] = []
        return drawn_tokens, prompt_ids(drawn_tokens, known, prefix.unit_tokens, ids), known
    tokens = max(drawn_tokens, prefix.tokens + 1)
    known = prefix.system_ids(choice)
    return tokens, prompt_ids(tokens, known, prefix.unit_tokens, ids), known
