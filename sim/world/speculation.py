"""Speculative decoding in the simulator: how many drafts are accepted, and what drafting costs.

The step contract is in sim/core/plan.py: a decoding sequence runs 1 + k_i
positions and the world says how many tokens it emitted. Here the world is:

- an acceptance model: per-token acceptance probability alpha, fixed or drawn
  once per request from a distribution. Drafts are accepted left to right,
  each independently with probability alpha, until the first rejection
  (Leviathan et al. 2023), so a step emits 1 + min(k, G) tokens, G geometric,
  with mean (1 - alpha^(k+1)) / (1 - alpha).
- a sampler that draws those counts: a request's alpha from a hash of
  (scenario seed, request id), the acceptances from one seeded stream per
  replica, so a run is deterministic and memory does not grow with requests.
- the draft model's memory: its weights and its KV per token come out of
  the KV pool (sim.assemble.kv_budget). Its time is in sim/latency/draft.py.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sim.core.plan import StepPlan, StepResult

if TYPE_CHECKING:
    from sim.config.scenario import Scenario

ONE_EACH = StepResult()  # a step without drafts: every emitting sequence emitted one token
_MASK = 0xFFFFFFFFFFFFFFFF


def expected_tokens_per_step(alpha: float, k: float) -> float:
    """Mean tokens a sequence emits in a step that verifies k drafts: sum_{j=0..k} alpha^j."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def alpha_for_tokens_per_step(tokens_per_step: float, k: float) -> float:
    """The fixed alpha whose steps verifying k drafts emit `tokens_per_step` on average:
    expected_tokens_per_step inverted (k may be a mean), to give the simulator an engine's
    measured acceptance."""
    if not (k > 0 and 1.0 <= tokens_per_step <= k + 1.0):
        raise ValueError(f"tokens_per_step must be in [1, k + 1] for k = {k!r} > 0, got "
                         f"{tokens_per_step!r}")
    if tokens_per_step == 1.0 or tokens_per_step == k + 1.0:
        return 0.0 if tokens_per_step == 1.0 else 1.0
    from scipy.optimize import brentq  # scipy loads only for speculative scenarios

    return float(brentq(lambda a: expected_tokens_per_step(a, k) - tokens_per_step,  # type: ignore[arg-type]
                        0.0, 1.0 - 1e-12, xtol=1e-12))


def accepted_drafts(u: float, alpha: float, k: int) -> int:
    """Accepted drafts min(k, G), P(G >= j) = alpha^j, from a uniform u in [0, 1).

    Inverse CDF: G >= j exactly when 1 - u <= alpha^j, so G = floor(ln(1 - u) / ln alpha).
    """
    if alpha <= 0.0:
        return 0
    if alpha >= 1.0:
        return k
    g = int(math.log(1.0 - u) / math.log(alpha))
    return g if g < k else k


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def request_uniform(seed: int, request_id: int) -> float:
    """A uniform in (0, 1) that depends only on (seed, request id): a request's own draw."""
    x = _splitmix64(_splitmix64(_splitmix64(seed & _MASK) ^ (request_id & _MASK)))
    return ((x >> 11) + 0.5) * 2.0**-53


class AcceptanceModel(Protocol):
    """Per-request acceptance probability alpha, as a function of a uniform draw."""

    @property
    def mean_alpha(self) -> float: ...

    def alpha_at(self, u: float) -> float:
        """The alpha at quantile u of the distribution."""
        ...


@dataclass(frozen=True, slots=True)
class FixedAcceptance:
    """Every request accepts each draft with probability `alpha`."""

    alpha: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha!r}")

    @property
    def mean_alpha(self) -> float:
        return self.alpha

    def alpha_at(self, u: float) -> float:
        return self.alpha


@dataclass(frozen=True, slots=True)
class UniformAcceptance:
    """alpha ~ uniform(low, high) per request: e.g. easy and hard prompts mixed."""

    low: float
    high: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.low <= self.high <= 1.0:
            raise ValueError(f"need 0 <= low <= high <= 1, got low={self.low!r}, "
                             f"high={self.high!r}")

    @property
    def mean_alpha(self) -> float:
        return (self.low + self.high) / 2

    def alpha_at(self, u: float) -> float:
        return self.low + (self.high - self.low) * u


@dataclass(frozen=True, slots=True)
class BetaAcceptance:
    """alpha ~ Beta with this mean and standard deviation per request."""

    mean: float
    std: float

    def __post_init__(self) -> None:
        if not 0.0 < self.mean < 1.0:
            raise ValueError(f"mean must be in (0, 1), got {self.mean!r}")
        limit = math.sqrt(self.mean * (1.0 - self.mean))
        if not 0.0 < self.std < limit:
            raise ValueError(f"std must be in (0, sqrt(mean (1 - mean)) = {limit:.4g}) for "
                             f"a Beta distribution, got {self.std!r}")

    @property
    def mean_alpha(self) -> float:
        return self.mean

    @property
    def shape_ab(self) -> tuple[float, float]:
        """Beta(a, b) from the moments: a + b = mean (1 - mean) / std^2 - 1."""
        total = self.mean * (1.0 - self.mean) / self.std**2 - 1.0
        return self.mean * total, (1.0 - self.mean) * total

    def alpha_at(self, u: float) -> float:
        a, b = self.shape_ab
        from scipy.special import betaincinv

        return float(betaincinv(a, b, u))


class AcceptanceSampler:
    """The simulator's verifier: a plan in, how many tokens each emitting sequence emitted.

    A request's alpha depends only on (seed, request id), so it is the same
    whatever runs beside it; the per-step draws come from one Mersenne Twister
    stream per replica seeded by the scenario seed, consumed in plan order, so
    a run is deterministic. Alphas are remembered only for the sequences of
    the last plan (recomputed, identically, for any other).
    """

    __slots__ = ("model", "seed", "_random", "_fixed", "_alphas")

    def __init__(self, model: AcceptanceModel, seed: int = 0) -> None:
        self.model = model
        self.seed = seed
        self._random = random.Random(f"servesim-acceptance:{seed}").random
        self._fixed = model.alpha if isinstance(model, FixedAcceptance) else None
        self._alphas: dict[int, float] = {}

    def alpha(self, request_id: int) -> float:
        """The request's per-token acceptance probability."""
        if self._fixed is not None:
            return self._fixed
        return self.model.alpha_at(request_uniform(self.seed, request_id))

    def __call__(self, plan: StepPlan) -> StepResult:
        spec = plan.num_spec_tokens
        if not spec:
            return ONE_EACH
        draw, fixed, known = self._random, self._fixed, self._alphas
        alphas: dict[int, float] = {}
        emitted: list[int] = []
        for rid, k, emits in zip(plan.request_ids, spec, plan.emits_token, strict=True):
            if not k:
                if emits:
                    emitted.append(1)
                continue
            alpha = fixed
            if alpha is None:
                alpha = known.get(rid)
                if alpha is None:
                    alpha = self.alpha(rid)
                alphas[rid] = alpha
            emitted.append(1 + accepted_drafts(draw(), alpha, k))
        self._alphas = alphas
        return StepResult(num_emitted=tuple(emitted))


def acceptance_model(cfg: Any) -> AcceptanceModel:
    """The model for a validated `speculative.acceptance` section."""
    if cfg.dist == "uniform":
        return UniformAcceptance(cfg.low, cfg.high)
    if cfg.dist == "beta":
        return BetaAcceptance(cfg.mean, cfg.std)
    return FixedAcceptance(cfg.alpha)


def build_speculation(scenario: Scenario) -> AcceptanceSampler | None:
    """The simulator's verifier for the scenario, or None without speculation."""
    if not scenario.speculative.num_tokens:
        return None
    return AcceptanceSampler(acceptance_model(scenario.speculative.acceptance), scenario.seed)
