"""The two drafters of speculative decoding: prompt lookup and a draft model.

Both propose the drafts `gpu_engine.speculative.verify` checks, as `Drafts`
for the `DraftRequest`s of a step, and both forget a request whose KV is gone
and hear how many drafts the target accepted. They are apart from the
acceptance rule because they are the engine's choice (`speculative.draft`),
not its correctness: `NgramDrafter` (prompt lookup: continue the latest
earlier occurrence of the sequence's last n tokens; an index per request,
updated with the tokens each step added) runs on the host; `ModelDrafter`
(a smaller model with its own paged KV in the same block ids; it catches up
lazily on the tokens it has not seen, then runs k sequential one-token passes
whose tokens stay on the device) runs a model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from gpu_engine.attention import attention_backend
from gpu_engine.block_tables import BlockTableStore
from gpu_engine.inputs import build_inputs
from gpu_engine.kv_cache import PagedKVCache
from gpu_engine.model import LlamaModel
from gpu_engine.sampling import DRAFT, draw, filtered_probs, row_params, uniforms
from gpu_engine.speculative import DraftRequest, Drafts
from gpu_engine.staging import stage


@dataclass(slots=True)
class _History:
    """Prompt lookup's index for one request: n-gram -> its latest start seen so far."""

    registered: int = 0  # n-grams lying wholly inside tokens[:registered] are indexed
    latest: dict[tuple[int, ...], int] = field(default_factory=dict)


@dataclass(slots=True)
class NgramDrafter:
    """Prompt lookup: the tokens that followed the latest earlier match of the last n tokens.

    Each request keeps an index of its n-grams (n = 1..max_ngram), extended by the
    tokens added since the last lookup, so a lookup costs the new tokens, not the history.
    """

    max_ngram: int = 3
    _index: dict[int, _History] = field(default_factory=dict)

    def propose(self, requests: Sequence[DraftRequest]) -> Drafts:
        host = tuple(self._lookup(r.request_id, r.token_ids, r.num_drafts) for r in requests)
        return Drafts(None, tuple(r.num_drafts for r in requests), host)

    def lookup(self, tokens: Sequence[int], k: int) -> tuple[int, ...]:
        """The drafts for `tokens` from scratch (no index kept)."""
        return _continue(_History(), tokens, k, self.max_ngram)

    def _lookup(self, request_id: int, tokens: Sequence[int], k: int) -> tuple[int, ...]:
        history = self._index.get(request_id)
        if history is None or history.registered > len(tokens) - 1:
            history = self._index[request_id] = _History()
        return _continue(history, tokens, k, self.max_ngram)

    def forget(self, request_id: int) -> None:
        self._index.pop(request_id, None)

    def accepted(self, request_id: int, context_tokens: int, num_accepted: int,
                 num_drafts: int) -> None:
        """Nothing to roll back: the index holds emitted tokens only."""


def _continue(history: _History, tokens: Sequence[int], k: int, max_ngram: int
              ) -> tuple[int, ...]:
    """Index the n-grams that became 'earlier' since the last call, then look up the tail.

    An occurrence counts when it starts at most len - n - 1, so that at least one token
    follows it; the latest such start of each n-gram is kept.
    """
    length = len(tokens)
    end = length - 1  # n-grams inside tokens[:end] have a follower
    for stop in range(history.registered + 1, end + 1):
        for n in range(1, min(max_ngram, stop) + 1):
            history.latest[tuple(tokens[stop - n:stop])] = stop - n
    history.registered = max(history.registered, end)
    for n in range(min(max_ngram, length - 1), 0, -1):
        start = history.latest.get(tuple(tokens[length - n:]))
        if start is not None:
            follow = list(tokens[start + n:start + n + k])
            return tuple(follow + [follow[-1]] * (k - len(follow)))
    return (tokens[-1],) * k  # no match: guess a repeat (cheap, usually rejected)


@dataclass(slots=True)
class ModelDrafter:
    """A draft model whose KV lives in the same block ids as the target's."""

    model: LlamaModel
    kv: PagedKVCache
    device: torch.device
    _computed: dict[int, int] = field(default_factory=dict)  # draft KV tokens per request
    _store: BlockTableStore | None = None

    def forget(self, request_id: int) -> None:
        """Its KV is gone (preempted or finished): the next draft starts from scratch."""
        self._computed.pop(request_id, None)
        if self._store is not None:
            self._store.forget(request_id)

    @torch.inference_mode()
    def propose(self, requests: Sequence[DraftRequest]) -> Drafts:
        """Pass 1 catches the draft KV up to the last emitted token, then one pass per draft;
        every drafted token stays on the device."""
        backend = attention_backend(self.device, self.model.spec.sliding_window)
        if backend == "triton" and self._store is None:
            self._store = BlockTableStore(2 * len(requests) + 2, 64, self.device, growable=True)
        width = max(r.num_drafts for r in requests)
        drafted = torch.zeros((len(requests), width), dtype=torch.int64, device=self.device)
        sampled = [i for i, r in enumerate(requests) if not r.sampling.is_greedy]
        of_sampled = {i: j for j, i in enumerate(sampled)}
        probs = (torch.zeros((len(sampled), width, self.model.spec.vocab_size),
                             dtype=torch.float32, device=self.device) if sampled else None)
        news, starts = [], []
        for r in requests:
            start = min(self._computed.get(r.request_id, 0), r.context_tokens)
            starts.append(start)
            news.append(list(r.token_ids[start:r.context_tokens + 1]))
        active = list(range(len(requests)))
        for depth in range(width):
            ids = [requests[i].request_id for i in active]
            inputs = build_inputs([news[i] for i in active], [starts[i] for i in active],
                                  [requests[i].block_table for i in active],
                                  [True] * len(active), self.kv.block_size, self.device,
                                  backend=backend, store=self._store, seq_ids=ids)
            where = [of_sampled[i] for i in active if i in of_sampled]
            s_rows = [row for row, i in enumerate(active) if i in of_sampled]
            u = uniforms([requests[active[row]].seed for row in s_rows],  # type: ignore[misc]
                         [starts[active[row]] + len(news[active[row]]) for row in s_rows],
                         DRAFT)
            act_t, where_t, s_rows_t, u_t = stage(
                [(active, torch.int64), (where, torch.int64), (s_rows, torch.int64),
                 (u, torch.float64)], self.device).views
            if depth:
                inputs = dataclasses.replace(inputs, token_ids=drafted.index_select(
                    0, act_t)[:, depth - 1].contiguous())
            logits = self.model(inputs, self.kv)
            token = logits.argmax(dim=-1)
            if s_rows:
                chosen = [requests[active[row]].sampling for row in s_rows]
                q = filtered_probs(logits.index_select(0, s_rows_t),
                                   row_params(chosen, logits.shape[-1], self.device))
                token = token.index_copy(0, s_rows_t, draw(q, u_t))
                probs[:, depth].index_copy_(0, where_t, q)  # type: ignore[index]
            drafted[:, depth].index_copy_(0, act_t, token)
            for i in active:
                starts[i] += len(news[i])
                news[i] = [0]  # placeholder: the drafted token is written on the device
            active = [i for i in active if requests[i].num_drafts > depth + 1]
        for r in requests:
            # draft KV now holds every position up to the last draft it was fed
            self._computed[r.request_id] = r.context_tokens + r.num_drafts
        return Drafts(drafted, tuple(r.num_drafts for r in requests), None, probs,
                      tuple(sampled))

    def accepted(self, request_id: int, context_tokens: int, num_accepted: int,
                 num_drafts: int) -> None:
        """Roll the draft KV back to what the target kept."""
        self._computed[request_id] = context_tokens + 1 + min(num_accepted, num_drafts - 1)
