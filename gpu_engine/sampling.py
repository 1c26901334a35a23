"""Turning logits into token ids: greedy, temperature, top-k and top-p, seeded per request.

Order of processing, as in vLLM and Hugging Face: divide by the temperature,
keep the k largest logits, then keep the smallest set of tokens whose mass is
at least p (always at least one), renormalise and draw. Greedy rows take the
argmax, build no probability vector and use no randomness.

Randomness is a pure function, not a generator's state: the uniform that
draws the token at position `pos` of a request with seed `s` is
`uniforms(s, pos, purpose)`, a counter-based hash (splitmix64 rounds in
numpy, computed for all sampled rows of a step at once, on the host). What
that keeps of a seeded generator: a request's tokens depend on its seed, its
logits and positions only, never on who shares its batch or on the device;
the same seed gives the same tokens run after run. What it adds: no state to
carry or roll back, so a request preempted and recomputed draws the very same
uniforms again, and speculative verification can ask for the uniform of any
position without having consumed the ones before it. `purpose` separates the
independent streams a position needs (the draw itself, a draft's acceptance
test, a draft model's own draw).

All rows are processed together: per-row temperature, k and p are tensors
staged to the device with the uniforms in one non-blocking copy, and the
top-k/top-p filters work on one descending sort of the whole batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from gpu_engine.staging import stage

SAMPLE, ACCEPT, DRAFT = 0, 1, 2  # purposes: independent uniform streams of one position
_SEED_MODULUS = 2**64
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request turns logits into tokens; the defaults are greedy."""

    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int | None = None  # None = derived by the engine from its seed and the request id
    stop_at_eos: bool = False  # scripted lengths ignore EOS (the simulator's rule)
    # vLLM's logit adjustments, applied before temperature (adjust_logits); defaults = none
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    logprobs: int | None = None  # return the sampled token's log-probability and the k best

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
            raise ValueError(f"SamplingParams.temperature must be a finite number >= 0 "
                             f"(0 = greedy), got {t!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be an integer >= 0 (0 = off), "
                             f"got {self.top_k!r}")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0 < p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1] (1 = off), got {p!r}")
        if self.seed is not None and (isinstance(self.seed, bool)
                                      or not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"SamplingParams.seed must be an integer >= 0 or None, "
                             f"got {self.seed!r}")
        if not isinstance(self.stop_at_eos, bool):
            raise ValueError(f"SamplingParams.stop_at_eos must be true or false, "
                             f"got {self.stop_at_eos!r}")
        for name in ("presence_penalty", "frequency_penalty", "repetition_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or \
                    not math.isfinite(value) or (name == "repetition_penalty" and value <= 0):
                raise ValueError(f"SamplingParams.{name} must be a finite number"
                                 f"{' > 0' if name == 'repetition_penalty' else ''}, "
                                 f"got {value!r}")

        # a JSON round trip turns the pairs into lists: store them as the declared tuple type
        # so that equality (and hashing) does not depend on where the value came from
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        if self.logprobs is not None and (isinstance(self.logprobs, bool) or not isinstance(
                self.logprobs, int) or not 0 <= self.logprobs <= 20):
            raise ValueError(f"SamplingParams.logprobs must be None or an integer in [0, 20], "
                             f"got {self.logprobs!r}")

    @property
    def adjusts_logits(self) -> bool:
        """Whether adjust_logits changes this row (a penalty or a bias is set)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias
                    or self.repetition_penalty != 1.0)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0


def _bias_pairs(value: object) -> tuple[tuple[int, float], ...]:
    """logit_bias as ((token id, bias), ...), from any sequence of pairs (a JSON list
    of lists included); refuses anything else with the field's name."""
    try:
        pairs = tuple((token, bias) for token, bias in value)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        raise ValueError(f"SamplingParams.logit_bias must be a sequence of (token id, bias) "
                         f"pairs, got {value!r}") from None
    for token, bias in pairs:
        if isinstance(token, bool) or not isinstance(token, int) or token < 0 or \
                isinstance(bias, bool) or not isinstance(bias, int | float) or \
                not math.isfinite(bias):
            raise ValueError(f"SamplingParams.logit_bias needs an integer token id >= 0 and a "
                             f"finite bias in each pair, got {(token, bias)!r}")
    return tuple((token, float(bias)) for token, bias in pairs)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (numpy wraps multiplication mod 2**64)."""
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def uniforms(seeds: Sequence[int], positions: Sequence[int], purpose: int = SAMPLE
             ) -> np.ndarray:
    """float64 uniforms in [0, 1), one per (seed, position): a pure function of the three.

    Seeds are taken modulo 2**64, so any non-negative integer works.
    """
    seed = np.array([s % _SEED_MODULUS for s in seeds], dtype=np.uint64)
    pos = np.asarray(positions, dtype=np.uint64)
    z = _mix(seed + _GOLDEN)
    z = _mix(z ^ (pos * _GOLDEN + np.uint64(purpose + 1)))
    z = _mix(z + _GOLDEN)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


@dataclass(frozen=True, slots=True)
class RowParams:
    """Per-row sampling parameters on the device (E rows) and what the host knows of them."""

    temperature: Tensor  # (E,) float32
    top_k: Tensor  # (E,) int64
    top_p: Tensor  # (E,) float64
    use_k: bool  # some row keeps fewer than the whole vocabulary
    use_p: bool


def row_params(params: Sequence[SamplingParams], vocab: int, device: torch.device
               ) -> RowParams:
    staged = stage([([p.temperature for p in params], torch.float32),
                    ([p.top_k for p in params], torch.int64),
                    ([p.top_p for p in params], torch.float64)], device)
    temperature, top_k, top_p = staged.views
    return RowParams(temperature, top_k, top_p, any(0 < p.top_k < vocab for p in params),
                     any(p.top_p < 1 for p in params))


def filtered_probs(logits: Tensor, rows: RowParams) -> Tensor:
    """(E, V) probabilities after temperature, top-k and top-p, one parameter set per row."""
    vocab = logits.shape[-1]
    scaled = logits.float() / rows.temperature.unsqueeze(-1)
    if not (rows.use_k or rows.use_p):
        return torch.softmax(scaled, dim=-1)
    ordered, order = scaled.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=scaled.device)
    if rows.use_k:
        k = torch.where(rows.top_k > 0, rows.top_k.clamp(max=vocab), vocab)
        # ties with the k-th largest logit stay: none of them is smaller than it
        kth = ordered.gather(-1, (k - 1).unsqueeze(-1))
        ordered = ordered.masked_fill(ordered < kth, -math.inf)
    if rows.use_p:
        probs = torch.softmax(ordered.double(), dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        limit = rows.top_p.unsqueeze(-1)
        drop = (mass_before >= limit) & (rank > 0) & (limit < 1)
        ordered = ordered.masked_fill(drop, -math.inf)
    filtered = torch.empty_like(ordered).scatter_(-1, order, ordered)
    return torch.softmax(filtered, dim=-1)


def probabilities(logits: Tensor, params: SamplingParams) -> Tensor:
    """(..., V) the distribution `sample` draws from for `params` (one-hot argmax if greedy)."""
    vocab = logits.shape[-1]
    rows = logits.reshape(-1, vocab)
    if params.is_greedy:
        one_hot = torch.zeros(rows.shape, dtype=torch.float32, device=rows.device)
        one_hot.scatter_(-1, rows.argmax(dim=-1, keepdim=True), 1.0)
        return one_hot.reshape(logits.shape)
    row = row_params([params] * rows.shape[0], vocab, rows.device)
    return filtered_probs(rows, row).reshape(logits.shape)


def draw(probs: Tensor, u: Tensor) -> Tensor:
    """One token per row by inverting its CDF at the row's uniform `u` (float64, on device)."""
    cdf = probs.double().cumsum(dim=-1)
    total = cdf[:, -1]
    # strictly below the total even after rounding, so the first cdf above it always
    # exists and is never a zero-probability token (its cdf equals its predecessor's)
    target = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target.unsqueeze(-1), right=True).squeeze(-1)


def adjust_logits(logits: Tensor, params: Sequence[SamplingParams],
                  token_ids: Sequence[Sequence[int]], prompt_lens: Sequence[int]) -> Tensor:
    """(E, V) logits with vLLM's adjustments, in vLLM V1's order: the logit bias is added,
    then the penalties. A repetition penalty r divides a positive logit by r and
    multiplies a negative one, for every token in the prompt or the output; the frequency
    penalty subtracts itself once per time a token appears in the output, the presence
    penalty once if it appears at all. `token_ids[i]`: row i's prompt then output so far.
    Rows with nothing to adjust are left as they are (the same tensor when none has)."""
    rows = [i for i, p in enumerate(params) if p.adjusts_logits]
    if not rows:
        return logits
    out = logits.float().clone()
    vocab = out.shape[-1]
    for i in rows:
        p, ids, cut = params[i], token_ids[i], prompt_lens[i]
        row = out[i]
        for token, bias in p.logit_bias:
            if 0 <= token < vocab:
                row[token] += bias
        if p.repetition_penalty != 1.0 and ids:
            seen = torch.tensor(sorted(set(ids)), dtype=torch.int64, device=row.device)
            values = row.index_select(0, seen)
            row.index_copy_(0, seen, torch.where(values > 0, values / p.repetition_penalty,
                                                 values * p.repetition_penalty))
        output = ids[cut:]
        if output and (p.frequency_penalty or p.presence_penalty):
            counts = torch.bincount(torch.tensor(output, dtype=torch.int64, device=row.device),
                                    minlength=vocab)[:vocab].to(row.dtype)
            row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)
    return out


def token_logprobs(logits: Tensor, tokens: Tensor, rows: Sequence[int], k: int
                   ) -> tuple[Tensor, Tensor, Tensor]:
    """For `rows` of (E, V) raw logits (before any adjustment or temperature, as vLLM's
    default `raw_logprobs`): the log-probability of each row's token, and its k most likely
    token ids with theirs; tensors on the logits' device, (R,), (R, k), (R, k)."""
    index = torch.tensor(list(rows), dtype=torch.int64, device=logits.device)
    logp = torch.log_softmax(logits.index_select(0, index).float(), dim=-1)
    chosen = logp.gather(-1, tokens.index_select(0, index).unsqueeze(-1)).squeeze(-1)
    top = logp.topk(min(k, logp.shape[-1]), dim=-1) if k else None
    empty = torch.empty((len(rows), 0), device=logits.device)
    return (chosen, top.indices if top is not None else empty.long(),
            top.values if top is not None else empty)


def sample(logits: Tensor, params: Sequence[SamplingParams], seeds: Sequence[int | None],
           positions: Sequence[int]) -> Tensor:
    """(E, V) logits, one row per emitting sequence -> (E,) int64 token ids.

    `seeds[i]` and `positions[i]`: row i's request seed and the position of the token it
    draws (its sequence's length before the token); only sampled rows read them.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be (rows, vocab), got shape {tuple(logits.shape)}")
    rows = logits.shape[0]
    if not len(params) == len(seeds) == len(positions) == rows:
        raise ValueError(f"{rows} logit rows but {len(params)} params, {len(seeds)} seeds and "
                         f"{len(positions)} positions; give one of each per row")
    tokens = logits.argmax(dim=-1)
    sampled = [i for i, p in enumerate(params) if not p.is_greedy]
    if not sampled:
        return tokens
    for i in sampled:
        if seeds[i] is None:
            raise ValueError(f"row {i} samples at temperature {params[i].temperature} "
                             "but has no seed")
    chosen = [params[i] for i in sampled]
    u = uniforms([seeds[i] for i in sampled], [positions[i] for i in sampled])  # type: ignore[misc]
    staged = stage([(sampled, torch.int64), (u, torch.float64)], logits.device)
    index, u_dev = staged.views
    probs = filtered_probs(logits.index_select(0, index),
                           row_params(chosen, logits.shape[-1], logits.device))
    return tokens.index_copy_(0, index, draw(probs, u_dev))
