"""The profiling grid: which step shapes to measure, and how to thin it to a time budget.

Four families, as the continuous scheduler emits them (see `default_grid`):
prefill-only steps over chunk sizes from 1 token to the token budget, on an
empty or a cached context; decode-only steps over batch size x context;
mixed steps, some decodes plus one prefill chunk (among them the
budget-filling chunks a saturated chunked-prefill scheduler runs); and
speculative verify steps, decodes that each check k draft tokens (1 + k
query positions), over batch size x context x k.

Thinning is pure arithmetic over per-point cost estimates: the corners of
each family are always measured (first, so their times calibrate the
estimate), and the rest are kept evenly spaced across the grid, as many as
the remaining budget allows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from calibrate.profile.synthetic import geometric_counts
from sim.core.plan import StepShape

PAIRS_PER_ROW = 256  # cost proxy: attention query-key pairs that cost about one matmul row
SPEC_TOKENS = (2, 4, 8)  # draft tokens per verify the grid measures (typical k)


@dataclass(frozen=True, slots=True)
class GridPoint:
    """One step shape to measure: a prefill chunk (`chunk_tokens` > 0) and/or decodes."""

    kind: str
    chunk_tokens: int = 0
    chunk_context: int = 0
    num_decodes: int = 0
    decode_context: int = 0
    ragged: bool = False  # every other decode at 1/8 of decode_context
    spec_tokens: int = 0  # k draft tokens each decode verifies (kind "verify")

    @property
    def decode_contexts(self) -> list[int]:
        """Each decode's context: all equal, or alternating full and an eighth (ragged), so
        the fit can tell attention over each row's own context from padding to the widest."""
        short = max(1, self.decode_context // 8) if self.ragged else self.decode_context
        return [self.decode_context if i % 2 == 0 else short for i in range(self.num_decodes)]

    @property
    def shape(self) -> StepShape:
        """The intended shape (decode contexts grow by one token per repeated step)."""
        chunks = (self.chunk_tokens,) if self.chunk_tokens else ()
        contexts = (self.chunk_context,) if self.chunk_tokens else ()
        spec = self.num_decodes if self.spec_tokens else 0
        return StepShape(chunks, contexts, self.num_decodes, sum(self.decode_contexts),
                         self.decode_context if self.num_decodes else 0,
                         len(chunks) + self.num_decodes, num_spec_decodes=spec,
                         num_spec_tokens=spec * self.spec_tokens,
                         spec_depth=self.spec_tokens if spec else 0,
                         spec_context_sum=sum(self.decode_contexts) if spec else 0)

    @property
    def query_tokens(self) -> int:
        """Positions each decode runs: 1, or 1 + k when verifying k drafts."""
        return 1 + self.spec_tokens

    @property
    def work(self) -> float:
        """A cost proxy in matmul rows: new tokens plus attention's query-key pairs."""
        decode_rows = self.num_decodes * self.query_tokens
        pairs = (self.chunk_tokens * (self.chunk_context + self.chunk_tokens / 2)
                 + decode_rows * self.decode_context)  # decode attention pads to widest
        return self.chunk_tokens + decode_rows + pairs / PAIRS_PER_ROW

    def growth_tokens(self, extra_steps: int) -> int:
        """Most a decode's context grows in `extra_steps` steps (k + 1 when all accepted)."""
        return extra_steps * self.query_tokens + 1

    def kv_tokens(self, extra_steps: int) -> int:
        """KV slots the point holds at its peak, `extra_steps` decode steps in."""
        return (self.chunk_context + self.chunk_tokens + sum(self.decode_contexts)
                + self.num_decodes * (self.growth_tokens(extra_steps) + self.spec_tokens))


@dataclass(frozen=True, slots=True)
class GridLimits:
    """What the engine allows: the scheduler's budgets, the longest sequence, the KV pool."""

    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    pool_tokens: int
    steps_per_point: int  # decode steps a point runs (its decodes' contexts grow that much)

    def fits(self, p: GridPoint) -> bool:
        longest = max(p.chunk_context + p.chunk_tokens + 1,  # + its one output token
                      p.decode_context + p.growth_tokens(self.steps_per_point) + p.spec_tokens
                      if p.num_decodes else 0)
        seqs = p.num_decodes + (1 if p.chunk_tokens else 0)
        return (p.chunk_tokens + p.num_decodes * p.query_tokens <= self.max_num_batched_tokens
                and seqs <= self.max_num_seqs and longest <= self.max_model_len
                and p.kv_tokens(self.steps_per_point) <= self.pool_tokens)


def _log_spaced(low: int, high: int, count: int) -> list[int]:
    """`count` roughly geometric integers from low to high (both included)."""
    if high <= low:
        return [low]
    values = np.unique(np.round(np.geomspace(low, high, count)).astype(int))
    return [int(v) for v in values]


def default_grid(limits: GridLimits) -> list[GridPoint]:
    """Every family's points within `limits`, in a fixed order (prefill, decode, mixed)."""
    budget, seqs, longest = (limits.max_num_batched_tokens, limits.max_num_seqs,
                             limits.max_model_len)
    contexts = [0, *_log_spaced(max(16, longest // 32), longest // 2, 3)]
    grid = [GridPoint("prefill", n, c) for c in contexts
            for n in geometric_counts(1, min(budget, longest))]
    batches = geometric_counts(1, seqs)
    decode_contexts = _log_spaced(16, longest - limits.steps_per_point - 2, 6)
    grid += [GridPoint("decode", num_decodes=b, decode_context=c)
             for c in decode_contexts for b in batches]
    grid += [GridPoint("decode", num_decodes=b, decode_context=c, ragged=True)
             for c in decode_contexts[1::2] for b in batches[1:]]
    mixed_batches = [b for b in batches[::2] if b < seqs and b < budget]
    for c in decode_contexts[1::2]:
        for b in mixed_batches:
            chunks = sorted({n for n in (16, budget // 8, budget // 2, budget - b)
                             if 1 <= n <= budget - b})
            grid += [GridPoint("mixed", n, 0, b, c) for n in chunks]
        grid += [GridPoint("mixed", budget - b, budget, b, c) for b in mixed_batches[::2]]
    grid += [GridPoint("verify", num_decodes=b, decode_context=c, spec_tokens=k)
             for k in SPEC_TOKENS for c in decode_contexts[::2] for b in batches[::2]]
    return [p for p in dict.fromkeys(grid) if limits.fits(p)]


def _axes(p: GridPoint) -> tuple[int, int]:
    if p.kind == "prefill":
        return p.chunk_tokens, p.chunk_context
    if p.kind == "decode":
        return p.num_decodes, p.decode_context * (1 if p.ragged else 2)
    if p.kind == "verify":
        return p.num_decodes * p.query_tokens, p.decode_context
    return p.num_decodes, p.chunk_tokens


def corners(points: Sequence[GridPoint]) -> list[int]:
    """Indices of each family's corners: both ends of one axis, each with both ends of the
    other (so a thinned grid still spans every family's full range)."""
    chosen: set[int] = set()
    for kind in dict.fromkeys(p.kind for p in points):
        members = [i for i, p in enumerate(points) if p.kind == kind]
        for sign_a in (1, -1):
            for sign_b in (1, -1):
                chosen.add(min(members, key=lambda i: (sign_a * _axes(points[i])[0],
                                                       sign_b * _axes(points[i])[1])))
    return sorted(chosen)


def evenly(candidates: Sequence[int], count: int) -> list[int]:
    """`count` of `candidates` spread evenly over them, both ends included."""
    if count >= len(candidates):
        return list(candidates)
    if count <= 0:
        return []
    spots = np.unique(np.round(np.linspace(0, len(candidates) - 1, count)).astype(int))
    return [candidates[i] for i in spots]


def estimate_costs_s(points: Sequence[GridPoint], measured_s: Mapping[int, float]
                     ) -> np.ndarray:
    """Seconds each point should take, from a per-family line through measured (work, s)."""
    work = np.array([p.work for p in points])
    out = np.full(len(points), np.mean(list(measured_s.values())) if measured_s else np.nan)
    for kind in dict.fromkeys(p.kind for p in points):
        members = np.array([i for i, p in enumerate(points) if p.kind == kind])
        done = [i for i in members if i in measured_s]
        if not done:
            continue
        x, y = work[done], np.array([measured_s[i] for i in done])
        if len(set(x.tolist())) >= 2:
            slope, intercept = np.polyfit(x, y, 1)
            slope = max(slope, 0.0)
            intercept = max(intercept, 0.0)
            out[members] = np.maximum(intercept + slope * work[members], y.min())
        else:
            out[members] = y.mean()
    return out


def plan_within(pending: Sequence[int], costs_s: np.ndarray, remaining_s: float) -> list[int]:
    """The most of `pending` (in order) whose estimated costs fit `remaining_s`, spread evenly."""
    low, high = 0, len(pending)
    while low < high:  # largest count whose evenly spread choice fits
        mid = (low + high + 1) // 2
        if float(costs_s[evenly(pending, mid)].sum()) <= remaining_s:
            low = mid
        else:
            high = mid - 1
    return evenly(pending, low)
