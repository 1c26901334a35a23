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

`verify` does this for every row of the step at once, on the device: greedy
rows compare drafts with the argmax and never build a probability vector;
sampled rows build p (and the draft model's q) once and take their uniforms
from `sampling.uniforms` (seed, position), staged with the step's inputs. The
only transfer to the host is the step's result: counts and tokens together.

The rejected drafts' KV slots are rolled back by the scheduler (computed =
context + 1 + accepted), and the next step overwrites them.

Two drafters: `NgramDrafter` (prompt lookup: continue the latest earlier
occurrence of the sequence's last n tokens; an index per request, updated
with the tokens each step added) and `ModelDrafter` (a smaller model with its
own paged KV in the same block ids; it catches up lazily on the tokens it has
not seen, then runs k sequential one-token passes whose tokens stay on the
device).
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
from gpu_engine.sampling import (
    ACCEPT,
    DRAFT,
    SAMPLE,
    SamplingParams,
    draw,
    filtered_probs,
    row_params,
    uniforms,
)
from gpu_engine.staging import stage


@dataclass(frozen=True, slots=True)
class DraftRequest:
    """One sequence to draft for: its tokens so far (the last one is not in KV yet)."""

    request_id: int
    token_ids: Sequence[int]
    context_tokens: int  # target KV before the step = len(token_ids) - 1
    num_drafts: int
    block_table: tuple[int, ...]
    sampling: SamplingParams
    seed: int | None


@dataclass(frozen=True, slots=True)
class Drafts:
    """The drafts of every speculating sequence of a step, in request order.

    `host`: the tokens as tuples when the drafter made them on the host (prompt
    lookup); else `tokens` (S, K) on the device is all there is. `probs`: the
    draft distributions q of the sampled requests (`prob_rows` says whose), or
    None where drafts are deterministic (one-hot q).
    """

    tokens: torch.Tensor | None  # (S, K) int64 on the device, padded past each row's k
    num_drafts: tuple[int, ...]
    host: tuple[tuple[int, ...], ...] | None = None
    probs: torch.Tensor | None = None  # (len(prob_rows), K, V)
    prob_rows: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class VerifyRow:
    """One emitting sequence of a speculative step, as `verify` needs it (host values)."""

    logits_row: int  # its first logits row; it has num_drafts + 1 consecutive ones
    num_drafts: int
    draft: int  # its row in Drafts (-1: it drafts nothing)
    position: int  # where its first emitted token lands (the sequence's length)
    sampling: SamplingParams
    seed: int | None


def verify(logits: torch.Tensor, rows: Sequence[VerifyRow], drafts: Drafts | None
           ) -> torch.Tensor:
    """Accepted drafts + one target token for every row at once.

    Returns int64 (E + E * (K + 1),) on the device: the E emitted counts, then each row's
    K + 1 token slots (its first count tokens are the emitted ones).
    """
    device = logits.device
    num = len(rows)
    width = max((r.num_drafts for r in rows), default=0)
    starts = [r.logits_row for r in rows]
    ks = [r.num_drafts for r in rows]
    sampled = [i for i, r in enumerate(rows) if not r.sampling.is_greedy]
    draft_index = [max(r.draft, 0) for r in rows]
    host = drafts.host if drafts is not None and drafts.tokens is None else None
    flat = [t for h in host for t in (*h, *([0] * (width - len(h))))] if host else []
    positions = [[r.position + j for j in range(width + 1)] for r in rows]
    u_accept = uniforms([rows[i].seed for i in sampled for _ in range(width + 1)],
                        [p for i in sampled for p in positions[i]], ACCEPT) if sampled else ()
    u_final = uniforms([rows[i].seed for i in sampled for _ in range(width + 1)],
                       [p for i in sampled for p in positions[i]], SAMPLE) if sampled else ()
    staged = stage([(starts, torch.int64), (ks, torch.int64), (draft_index, torch.int64),
                    (sampled, torch.int64), (u_accept, torch.float64), (u_final, torch.float64),
                    (flat, torch.int64)], device)
    start_t, k_t, draft_t, sampled_t, u_acc, u_fin, host_t = staged.views
    offsets = torch.arange(width + 1, device=device)
    grid = torch.minimum(start_t.unsqueeze(1) + offsets, (start_t + k_t).unsqueeze(1))
    live = offsets[:width].unsqueeze(0) < k_t.unsqueeze(1)  # (E, K): real draft positions
    if drafts is not None and width:
        table = drafts.tokens if host is None else host_t.view(len(host), -1)
        proposed = table.index_select(0, draft_t)[:, :width]
    else:
        proposed = torch.zeros((num, width), dtype=torch.int64, device=device)
    best = logits.argmax(dim=-1).index_select(0, grid.reshape(-1)).view(num, width + 1)
    accepted = ((proposed == best[:, :width]) & live).long().cumprod(dim=1).sum(dim=1)
    tokens = best  # greedy rows emit the argmax up to and including the first mismatch
    if sampled:
        s_accepted, s_tokens = _verify_sampled(logits, rows, sampled, drafts, grid, live,
                                               proposed, sampled_t, u_acc, u_fin, width)
        accepted = accepted.index_copy(0, sampled_t, s_accepted)
        tokens = tokens.index_copy(0, sampled_t, s_tokens)
    return torch.cat([accepted + 1, tokens.reshape(-1)])


def _verify_sampled(logits: torch.Tensor, rows: Sequence[VerifyRow], sampled: list[int],
                    drafts: Drafts | None, grid: torch.Tensor, live: torch.Tensor,
                    proposed: torch.Tensor, sampled_t: torch.Tensor, u_acc: torch.Tensor,
                    u_fin: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rejection rule for the sampled rows: (accepted counts, K + 1 token slots)."""
    num, vocab = len(sampled), logits.shape[-1]
    device = logits.device
    params = row_params([rows[i].sampling for i in sampled for _ in range(width + 1)], vocab,
                        device)
    s_grid = grid.index_select(0, sampled_t)  # (S, K + 1) logits rows
    p = filtered_probs(logits.index_select(0, s_grid.reshape(-1)), params).view(
        num, width + 1, vocab)
    x = proposed.index_select(0, sampled_t)  # (S, K)
    s_live = live.index_select(0, sampled_t)
    q = None
    if drafts is not None and drafts.probs is not None:
        by_draft = {d: j for j, d in enumerate(drafts.prob_rows)}
        picks = [by_draft.get(rows[i].draft, 0) for i in sampled]
        has_q = [rows[i].draft in by_draft for i in sampled]
        pick_t, has_t = stage([(picks, torch.int64), (has_q, torch.int64)], device).views
        q = drafts.probs.index_select(0, pick_t)[:, :width]  # (S, K, V)
        one_hot = torch.zeros_like(q).scatter_(-1, x.unsqueeze(-1), 1.0)
        q = torch.where(has_t.view(-1, 1, 1).bool(), q, one_hot)
    p_x = p[:, :width].gather(-1, x.unsqueeze(-1)).squeeze(-1).double()
    q_x = (torch.ones_like(p_x) if q is None
           else q.gather(-1, x.unsqueeze(-1)).squeeze(-1).double())
    u_acc = u_acc.view(num, width + 1)[:, :width]
    accept = (q_x > 0) & (u_acc * q_x < p_x) & s_live
    accepted = accept.long().cumprod(dim=1).sum(dim=1)  # (S,)
    at = accepted.view(-1, 1, 1).expand(-1, 1, vocab)
    p_at = p.gather(1, at).squeeze(1)  # (S, V): p at the first rejection (or the bonus row)
    rejected = accepted < s_live.sum(dim=1)
    if width:
        clamped = accepted.clamp(max=width - 1).view(-1, 1, 1).expand(-1, 1, vocab)
        if q is None:
            x_at = x.gather(1, accepted.clamp(max=width - 1).view(-1, 1))
            q_at = torch.zeros_like(p_at).scatter_(-1, x_at, 1.0)
        else:
            q_at = q.gather(1, clamped).squeeze(1)
        residual = (p_at - q_at).clamp_min(0)
        total = residual.sum(dim=-1, keepdim=True)
        use_residual = rejected.unsqueeze(-1) & (total > 0)
        dist = torch.where(use_residual, residual / total.clamp_min(1e-30), p_at)
    else:
        dist = p_at
    final = draw(dist, u_fin.view(num, width + 1).gather(1, accepted.view(-1, 1)).squeeze(1))
    tokens = torch.cat([x, x[:, :1]], dim=1) if width else final.view(-1, 1).clone()
    tokens = tokens.scatter(1, accepted.view(-1, 1), final.view(-1, 1))
    return accepted, tokens


def unpack(flat: list[int], num_rows: int, width: int) -> list[list[int]]:
    """`verify`'s result on the host: each row's emitted tokens."""
    counts = flat[:num_rows]
    out = []
    for i, count in enumerate(counts):
        base = num_rows + i * (width + 1)
        out.append(flat[base:base + count])
    return out


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
