"""What a synthetic workload draws from: arrival processes, length and time distributions.

Each is a small section of the `workload:` schema, chosen by its `process:` or
`dist:` tag (a discriminated union, so an unknown tag names the allowed ones);
sim.workload turns them into seeded draws.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# text: JSONL with a prompt; the CSV formats are `sim.workload.csv_traces.CSV_FORMATS`
TraceFormat = Literal["azure", "burstgpt", "vidur", "csv", "mooncake", "text"]
Rate = Annotated[float, Field(gt=0, allow_inf_nan=False, description="requests per second")]
Burstiness = Annotated[float, Field(gt=0, allow_inf_nan=False, description="the gamma "
                                    "gaps' shape (vLLM's --burstiness): 1 = Poisson, < 1 "
                                    "burstier, > 1 more regular")]
Tokens = Annotated[int, Field(ge=1)]
ColumnName = Annotated[str, Field(min_length=1)]


class WorkloadModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PoissonArrivals(WorkloadModel):
    """Independent arrivals at a constant rate: exponential gaps."""

    process: Literal["poisson"] = Field(description="exponential gaps at `rate`")
    rate: Rate
    burstiness: Burstiness = 1.0

    @field_validator("burstiness")
    @classmethod
    def _exactly_one(cls, value: float) -> float:
        if value != 1.0:
            raise ValueError("poisson has burstiness 1 by definition; use process: gamma")
        return value


class GammaArrivals(WorkloadModel):
    """Gamma-distributed gaps with mean 1 / rate: bursty (or regular) traffic."""

    process: Literal["gamma"] = Field(description="gamma gaps of mean 1 / rate")
    rate: Rate
    burstiness: Burstiness = 1.0


class ConstantArrivals(WorkloadModel):
    """One request every 1 / rate seconds."""

    process: Literal["constant"] = Field(description="evenly spaced arrivals")
    rate: Rate


ArrivalsConfig = Annotated[
    PoissonArrivals | GammaArrivals | ConstantArrivals, Field(discriminator="process")
]


class _Clipped(WorkloadModel):
    min: Tokens | None = Field(None, description="draws below this are raised to it (tokens)")
    max: Tokens | None = Field(None, description="draws above this are cut to it (tokens)")

    @model_validator(mode="after")
    def _min_below_max(self) -> _Clipped:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self


class FixedConfig(_Clipped):
    """Every request the same length."""

    dist: Literal["fixed"] = Field(description="one length for every request")
    value: Tokens = Field(description="the length, tokens")


class UniformConfig(_Clipped):
    """Lengths drawn uniformly from the integers low..high."""

    dist: Literal["uniform"] = Field(description="uniform over low..high")
    low: Tokens = Field(description="shortest length, tokens")
    high: Tokens = Field(description="longest length, tokens (>= low)")

    @model_validator(mode="after")
    def _low_below_high(self) -> UniformConfig:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must be <= high ({self.high})")
        return self


class NormalConfig(_Clipped):
    """Normal lengths, rounded, at least 1."""

    dist: Literal["normal"] = Field(description="normal of this mean and std")
    mean: Annotated[float, Field(ge=1, allow_inf_nan=False)] = Field(
        description="mean length, tokens")
    std: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(
        description="standard deviation, tokens")


class LognormalConfig(_Clipped):
    """Lognormal lengths with this mean and coefficient of variation: the heavy tail of chats."""

    dist: Literal["lognormal"] = Field(description="lognormal of this mean and cv")
    mean: Annotated[float, Field(ge=1, allow_inf_nan=False)] = Field(
        description="mean length, tokens")
    cv: Annotated[float, Field(ge=0, allow_inf_nan=False, description="std / mean")]


class EmpiricalConfig(_Clipped):
    """Either literal `values` or a `trace` column (defaults to the field it sits under).

    `column: prompt` / `output` are the trace's prompt / output lengths in its format's
    columns; any other name is a column of the CSV (or a key of the JSONL rows) itself.
    """

    dist: Literal["empirical"] = Field(description="sampled with replacement from values or "
                                       "a trace's column")
    values: Annotated[list[Tokens], Field(min_length=1)] | None = Field(
        None, description="the lengths to sample from (tokens)")
    trace: str | None = Field(None, description="a trace file (or builtin:NAME) whose column "
                              "to sample from, relative to the scenario file")
    format: TraceFormat | None = Field(None, description="the trace's format; guessed from "
                                       "the file if omitted")
    column: ColumnName | None = Field(
        None, description="prompt, output, or a column of the file (e.g. 'Response tokens')"
    )

    @model_validator(mode="after")
    def _one_source(self) -> EmpiricalConfig:
        if (self.values is None) == (self.trace is None):
            raise ValueError("empirical needs exactly one of 'values' or 'trace'")
        if self.trace is None and (self.format is not None or self.column is not None):
            raise ValueError("'format' and 'column' only apply with 'trace'")
        return self


LengthConfig = Annotated[
    FixedConfig | UniformConfig | NormalConfig | LognormalConfig | EmpiricalConfig,
    Field(discriminator="dist"),
]


Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class FixedTime(WorkloadModel):
    """The same time every turn."""

    dist: Literal["fixed"] = Field(description="one time for every turn")
    value_s: Seconds = Field(description="seconds")


class ExponentialTime(WorkloadModel):
    """Exponential times of this mean."""

    dist: Literal["exponential"] = Field(description="exponential of mean mean_s")
    mean_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = Field(
        description="mean, seconds")


class LognormalTime(WorkloadModel):
    """Lognormal times of this mean and coefficient of variation."""

    dist: Literal["lognormal"] = Field(description="lognormal of mean mean_s and cv")
    mean_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = Field(
        description="mean, seconds")
    cv: Annotated[float, Field(ge=0, allow_inf_nan=False, description="std / mean")]


TimeConfig = Annotated[FixedTime | ExponentialTime | LognormalTime, Field(discriminator="dist")]
