"""Turning logits into token ids: greedy, temperature, top-k and top-p, seeded per request.

Order of processing, as in vLLM and Hugging Face: divide by the temperature,
keep the k largest logits, then keep the smallest set of tokens whose mass is
at least p (always at least one), renormalise and draw. Greedy rows take the
argmax and consume no randomness, so a greedy request never disturbs a
sampled one's stream. Each sampled row draws one uniform number from its own
generator and inverts the cumulative distribution, so a request's tokens
depend on its seed and its logits only, never on who shares its batch.

Rows are processed together: per-row temperature, k and p are tensors and
the top-k/top-p filters work on one descending sort of the whole batch. Only
the one uniform per row is drawn row by row, on the host (a generator belongs
to a request), then copied over once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

_SEED_MODULUS = 2**64  # torch generators take 64-bit seeds


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request turns logits into tokens; the defaults are greedy."""

    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int | None = None  # None = derived by the engine from its seed and the request id
    stop_at_eos: bool = False  # scripted lengths ignore EOS (the simulator's rule)

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

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0


def make_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """A request's generator, seeded with `seed` (modulo 2**64, so any int works).

    `device` is where the logits live; the generator stays on the host whatever
    it is: a row draws one number per step, which costs less there than a kernel
    launch per row, and a seed then gives the same draws on every device.
    """
    torch.device(device)  # still reject a malformed device name early
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed % _SEED_MODULUS)
    return generator


def _filtered_probs(logits: Tensor, params: Sequence[SamplingParams]) -> Tensor:
    """(E, V) probabilities after temperature, top-k and top-p, one params per row."""
    vocab = logits.shape[-1]
    temperature, top_k, top_p = _row_tensors(params, logits.device)
    scaled = logits.float() / temperature.unsqueeze(-1)
    # decided from the params on the host, so no device sync
    use_k = any(0 < p.top_k < vocab for p in params)
    use_p = any(p.top_p < 1 for p in params)
    if not (use_k or use_p):
        return torch.softmax(scaled, dim=-1)
    ordered, order = scaled.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=scaled.device)
    if use_k:
        k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)
        # ties with the k-th largest logit stay: none of them is smaller than it
        kth = ordered.gather(-1, (k - 1).unsqueeze(-1))
        ordered = ordered.masked_fill(ordered < kth, -math.inf)
    if use_p:
        probs = torch.softmax(ordered.double(), dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        limit = top_p.unsqueeze(-1)
        drop = (mass_before >= limit) & (rank > 0) & (limit < 1)
        ordered = ordered.masked_fill(drop, -math.inf)
    filtered = torch.empty_like(ordered).scatter_(-1, order, ordered)
    return torch.softmax(filtered, dim=-1)


def _row_tensors(params: Sequence[SamplingParams], device: torch.device
                 ) -> tuple[Tensor, Tensor, Tensor]:
    temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32,
                               device=device)
    top_k = torch.tensor([p.top_k for p in params], dtype=torch.long, device=device)
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float64, device=device)
    return temperature, top_k, top_p


def probabilities(logits: Tensor, params: SamplingParams) -> Tensor:
    """(..., V) the distribution `sample` draws from for `params` (one-hot argmax if greedy)."""
    vocab = logits.shape[-1]
    rows = logits.reshape(-1, vocab)
    if params.is_greedy:
        one_hot = torch.zeros(rows.shape, dtype=torch.float32, device=rows.device)
        one_hot.scatter_(-1, rows.argmax(dim=-1, keepdim=True), 1.0)
        return one_hot.reshape(logits.shape)
    return _filtered_probs(rows, [params] * rows.shape[0]).reshape(logits.shape)


def _draw(probs: Tensor, generators: Sequence[torch.Generator]) -> Tensor:
    """One token per row by inverting its CDF at a uniform from the row's own generator."""
    uniforms = torch.cat([torch.rand(1, generator=g, dtype=torch.float64, device=g.device)
                          for g in generators]).to(probs.device)
    cdf = probs.double().cumsum(dim=-1)
    total = cdf[:, -1]
    # strictly below the total even after rounding, so the first cdf above it always
    # exists and is never a zero-probability token (its cdf equals its predecessor's)
    target = torch.minimum(uniforms * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target.unsqueeze(-1), right=True).squeeze(-1)


def sample(logits: Tensor, params: Sequence[SamplingParams],
           generators: Sequence[torch.Generator | None]) -> Tensor:
    """(E, V) logits, one row per emitting sequence -> (E,) int64 token ids."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be (rows, vocab), got shape {tuple(logits.shape)}")
    rows = logits.shape[0]
    if len(params) != rows or len(generators) != rows:
        raise ValueError(f"{rows} logit rows but {len(params)} params and "
                         f"{len(generators)} generators; give one of each per row")
    tokens = logits.argmax(dim=-1)
    sampled = [i for i, p in enumerate(params) if not p.is_greedy]
    if not sampled:
        return tokens
    chosen_generators: list[torch.Generator] = []
    for i in sampled:
        generator = generators[i]
        if generator is None:
            raise ValueError(f"row {i} samples at temperature {params[i].temperature} "
                             "but has no generator; make one with make_generator(seed, device)")
        chosen_generators.append(generator)
    index = torch.tensor(sampled, dtype=torch.long, device=logits.device)
    probs = _filtered_probs(logits.index_select(0, index), [params[i] for i in sampled])
    tokens[index] = _draw(probs, chosen_generators)
    return tokens
