"""The `speculative:` section: k draft tokens per step, the drafter, the acceptance model.

Kept apart from the other sections because its acceptance models form a
discriminated union of their own (`dist: fixed | uniform | beta`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from sim.config.sections import StrictModel, resolve_model
from sim.config.specs import ModelSpec


class FixedAlphaConfig(StrictModel):
    """Every request accepts each draft token with the same probability."""

    dist: Literal["fixed"] = Field("fixed", description="one alpha for every request")
    alpha: float = Field(0.7, ge=0.0, le=1.0, description="per-token acceptance probability")


class UniformAlphaConfig(StrictModel):
    """Each request draws its acceptance probability uniformly from [low, high]."""

    dist: Literal["uniform"] = Field(description="alpha ~ Uniform(low, high) per request")
    low: float = Field(ge=0.0, le=1.0, description="lowest alpha")
    high: float = Field(ge=0.0, le=1.0, description="highest alpha")

    @model_validator(mode="after")
    def _ordered(self) -> UniformAlphaConfig:
        if self.low > self.high:
            raise ValueError(f"low {self.low} must be <= high {self.high}")
        return self


class BetaAlphaConfig(StrictModel):
    """Each request draws its acceptance probability from a Beta of this mean and std."""

    dist: Literal["beta"] = Field(description="alpha ~ Beta per request")
    mean: float = Field(gt=0.0, lt=1.0, description="mean alpha")
    std: float = Field(gt=0.0, description="standard deviation of alpha "
                       "(< sqrt(mean (1 - mean)))")

    @model_validator(mode="after")
    def _feasible(self) -> BetaAlphaConfig:
        limit = (self.mean * (1 - self.mean)) ** 0.5
        if self.std >= limit:
            raise ValueError(f"std must be < sqrt(mean (1 - mean)) = {limit:.4g} for a Beta "
                             f"with mean {self.mean} (got {self.std})")
        return self


class SpeculativeConfig(StrictModel):
    """Speculative decoding (continuous batching): k drafts per decoding sequence per step.

    `draft`: "ngram" (prompt lookup, near-zero cost) or a draft model, a catalogue
    name or a mapping of model fields (`base:` plus overrides), priced by its own
    roofline with `draft_overhead_ms` per pass; it must share the target's vocabulary.
    `acceptance`: per-token acceptance probability alpha, fixed or drawn per request.
    """

    num_tokens: int = Field(0, ge=0, le=64, description="k draft tokens per step; 0 = off")
    draft: str | dict[str, Any] = Field(
        "ngram", description="ngram (prompt lookup), or a draft model: a catalogue name or a "
        "mapping of model fields; it must share the target's vocabulary")
    draft_overhead_ms: float | None = Field(
        None, ge=0.0, description="model draft: fixed cost of each draft pass (default 0.1); "
        "ngram: CPU cost per step (default 0)")
    acceptance: Annotated[FixedAlphaConfig | UniformAlphaConfig | BetaAlphaConfig,
                          Field(discriminator="dist")] = Field(
        FixedAlphaConfig(), description="per-token acceptance probability alpha: fixed, "
        "or drawn per request (uniform, beta)")

    @field_validator("acceptance", mode="before")
    @classmethod
    def _fixed_by_default(cls, value: Any) -> Any:
        """`acceptance: {alpha: 0.8}` (or `--set speculative.acceptance.alpha=0.8`) is fixed."""
        if isinstance(value, Mapping) and "dist" not in value:
            return {"dist": "fixed", **value}
        return value

    @field_validator("draft")
    @classmethod
    def _known_draft(cls, value: str | dict[str, Any]) -> str | dict[str, Any]:
        if value != "ngram":
            resolve_model(value)
        return value

    @property
    def draft_spec(self) -> ModelSpec | None:
        """The draft model, or None for n-gram drafting."""
        return None if self.draft == "ngram" else resolve_model(self.draft)

