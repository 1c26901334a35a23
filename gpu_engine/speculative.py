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

The drafters that propose them (prompt lookup, a draft model) are in gpu_engine.drafters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gpu_engine.sampling import (
    ACCEPT,
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
