"""Grouped prompts sent in a cycle: G groups of P prompts, a system prompt + a question each.

This is how load generators such as inference-perf build a shared-prefix
benchmark: `groups` x `prompts_per_group` distinct prompts, prompt k of group
g being system prompt g (`system_tokens`, shared by the group) followed by
its own question, sent in order and again from the start once all were sent.
A prompt seen before is therefore the same content in full: with prefix
caching every full block of it can hit, and a prompt new to the cache still
shares its group's system prompt.

Content is named as sim.workload.prefixes names it (`prefix_block_ids`): the
system prompt's full units are the group's, the rest of a prompt's full units
are its own and the same on every lap. A partial last unit is never cached,
so it takes a fresh id. Each distinct prompt draws its length once, the first
time it is sent (`prompt_tokens` is the whole prompt, system prompt included,
and at least `system_tokens` + 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.workload.prefixes import IdSource, SharedPrefix, prompt_ids


@dataclass(frozen=True, slots=True)
class PromptGroups:
    """`groups` system prompts of `system_tokens`, each opening `prompts_per_group` prompts."""

    groups: int
    prompts_per_group: int
    system_tokens: int
    unit_tokens: int = 16

    def __post_init__(self) -> None:
        for name in ("groups", "prompts_per_group", "system_tokens", "unit_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")

    @property
    def num_prompts(self) -> int:
        """Distinct prompts in one lap of the cycle."""
        return self.groups * self.prompts_per_group

    @property
    def system(self) -> SharedPrefix:
        """The groups' system prompts as a SharedPrefix (every request opens with one)."""
        return SharedPrefix(1.0, self.system_tokens, self.groups, self.unit_tokens)

    def group_of(self, prompt: int) -> int:
        """The group of distinct prompt `prompt` (0 .. num_prompts - 1): group-major order."""
        return prompt // self.prompts_per_group


class PromptCycle:
    """The prompts of a PromptGroups workload in send order; each distinct prompt's
    length and content ids fixed the first time it is sent."""

    __slots__ = ("_groups", "_ids", "_known", "_tokens")

    def __init__(self, groups: PromptGroups) -> None:
        self._groups = groups
        self._ids = IdSource(groups.system.num_reserved_ids)
        self._known: list[list[int] | None] = [None] * groups.num_prompts
        self._tokens: list[int] = [0] * groups.num_prompts

    def prompt(self, index: int, drawn_tokens: int) -> tuple[int, tuple[int, ...]]:
        """(prompt tokens, content ids) of the `index`-th request sent; `drawn_tokens` is its
        length if this distinct prompt has not been sent before (ignored otherwise)."""
        g = self._groups
        which = index % g.num_prompts
        known = self._known[which]
        if known is None:
            known = g.system.system_ids(g.group_of(which))
            self._known[which] = known
            self._tokens[which] = max(drawn_tokens, g.system_tokens + 1)
        tokens = self._tokens[which]
        return tokens, prompt_ids(tokens, known, g.unit_tokens, self._ids)
