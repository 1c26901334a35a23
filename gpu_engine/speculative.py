"""Speculative decoding in the engine: drafters propose, the target verifies in one pass.

The scheduler (sim.core) already decided how many drafts each decoding
sequence gets (`plan.num_spec_tokens`) and allocated KV slots for them; here
the engine fills them. A drafter proposes k_i tokens, the target runs once
over the last emitted token plus the drafts, and `verify` keeps a prefix of
the drafts plus one token of the target's own:

- greedy requests accept while the draft equals the target's argmax, so the
  output is exactly plain greedy decoding, whatever the draft;
- sampled requests use the rejection rule of Leviathan et al. / Chen et al.:
  accept draft x with probability min(1, p(x) / q(x)), else sample from
  max(0, p - q) renormalised; all accepted: one more token from p. The output
  is distributed exactly as the target's. A deterministic drafter (prompt
  lookup) has a one-hot q.

The rejected drafts' KV slots are rolled back by the scheduler (computed =
context + 1 + accepted), and the next step overwrites them.

Two drafters: `NgramDrafter` (prompt lookup: continue the latest earlier
occurrence of the sequence's last n tokens; costs no kernels) and
`ModelDrafter` (a smaller model with its own paged KV in the same block ids;
it catches up lazily on the tokens it has not seen, then runs k sequential
one-token passes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from gpu_engine.inputs import build_inputs
from gpu_engine.kv_cache import PagedKVCache
from gpu_engine.model import LlamaModel
from gpu_engine.sampling import SamplingParams, probabilities


@dataclass(frozen=True, slots=True)
class DraftRequest:
    """One sequence to draft for: its tokens so far (the last one is not in KV yet)."""

    request_id: int
    token_ids: Sequence[int]
    context_tokens: int  # target KV before the step = len(token_ids) - 1
    num_drafts: int
    block_table: tuple[int, ...]
    sampling: SamplingParams
    generator: torch.Generator | None


@dataclass(frozen=True, slots=True)
class Draft:
    token_ids: tuple[int, ...]
    probs: torch.Tensor | None  # (k, V) the draft distribution q; None = deterministic


def verify(target_logits: torch.Tensor, draft: Draft, sampling: SamplingParams,
           generator: torch.Generator | None) -> list[int]:
    """Tokens emitted for one sequence: accepted drafts then one target token.

    `target_logits` (k + 1, V): row j predicts the token after draft j (row 0
    after the last emitted token).
    """
    drafts = draft.token_ids
    if sampling.is_greedy:
        best = target_logits.argmax(-1).tolist()
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == best[accepted]:
            accepted += 1
        return [*drafts[:accepted], best[accepted]]
    p = probabilities(target_logits.float(), sampling).cpu()
    q = None if draft.probs is None else draft.probs.float().cpu()
    out: list[int] = []
    for j, x in enumerate(drafts):
        q_x = 1.0 if q is None else float(q[j, x])
        u = float(torch.rand((), generator=generator))
        if q_x > 0 and u * q_x < float(p[j, x]):
            out.append(x)
            continue
        q_row = torch.zeros_like(p[j]) if q is None else q[j]
        if q is None:
            q_row[x] = 1.0
        residual = (p[j] - q_row).clamp_min(0)
        total = float(residual.sum())
        row = residual / total if total > 0 else p[j]
        out.append(int(torch.multinomial(row, 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(p[len(drafts)], 1, generator=generator)))
    return out


@dataclass(frozen=True, slots=True)
class NgramDrafter:
    """Prompt lookup: the tokens that followed the latest earlier match of the last n tokens."""

    max_ngram: int = 3

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        return [Draft(self.lookup(r.token_ids, r.num_drafts), None) for r in requests]

    def lookup(self, tokens: Sequence[int], k: int) -> tuple[int, ...]:
        tokens = list(tokens)
        for n in range(min(self.max_ngram, len(tokens) - 1), 0, -1):
            tail = tokens[-n:]
            for start in range(len(tokens) - n - 1, -1, -1):
                if tokens[start:start + n] == tail:
                    follow = tokens[start + n:start + n + k]
                    return tuple(follow + [follow[-1]] * (k - len(follow)))
        return (tokens[-1],) * k  # no match: guess a repeat (cheap, usually rejected)

    def forget(self, request_id: int) -> None:
        """Nothing is kept per request."""

    def accepted(self, request_id: int, context_tokens: int, num_accepted: int,
                 num_drafts: int) -> None:
        """Nothing to roll back."""


@dataclass(slots=True)
class ModelDrafter:
    """A draft model whose KV lives in the same block ids as the target's."""

    model: LlamaModel
    kv: PagedKVCache
    device: torch.device
    _computed: dict[int, int] = field(default_factory=dict)  # draft KV tokens per request

    def forget(self, request_id: int) -> None:
        """Its KV is gone (preempted or finished): the next draft starts from scratch."""
        self._computed.pop(request_id, None)

    @torch.inference_mode()
    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        drafted: list[list[int]] = [[] for _ in requests]
        rows: list[list[torch.Tensor]] = [[] for _ in requests]
        # pass 1 catches the draft KV up to the last emitted token, then one pass per draft
        news = []
        starts = []
        for r in requests:
            start = min(self._computed.get(r.request_id, 0), r.context_tokens)
            starts.append(start)
            news.append(list(r.token_ids[start:r.context_tokens + 1]))
        active = list(range(len(requests)))
        depth = 0
        while active:
            inputs = build_inputs([news[i] for i in active], [starts[i] for i in active],
                                  [requests[i].block_table for i in active],
                                  [True] * len(active), self.kv.block_size, self.device)
            logits = self.model(inputs, self.kv)
            for row, i in enumerate(active):
                r = requests[i]
                q = probabilities(logits[row].float(), r.sampling)
                if r.sampling.is_greedy:
                    token = int(logits[row].argmax())
                else:
                    token = int(torch.multinomial(q.cpu(), 1, generator=r.generator))
                drafted[i].append(token)
                rows[i].append(q)
                starts[i] += len(news[i])
                news[i] = [token]
            depth += 1
            active = [i for i in active if requests[i].num_drafts > depth]
        out = []
        for i, r in enumerate(requests):
            # draft KV now holds every position up to the last draft it was fed
            self._computed[r.request_id] = r.context_tokens + r.num_drafts
            probs = None if r.sampling.is_greedy else torch.stack(rows[i])
            out.append(Draft(tuple(drafted[i]), probs))
        return out

    def accepted(self, request_id: int, context_tokens: int, num_accepted: int,
                 num_drafts: int) -> None:
        """Roll the draft KV back to what the target kept."""
        self._computed[request_id] = context_tokens + 1 + min(num_accepted, num_drafts - 1)
