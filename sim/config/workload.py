"""The validated `workload:` section of a scenario (pydantic, unknown keys are errors).

It sits with the rest of the schema in sim.config, below sim.workload, which
turns it into requests: the schema is what a user may write, the workload
package what it means.

Two shapes, exactly one per workload: synthetic (`arrivals` + `prompt_tokens`
+ `output_tokens`, bounded by `num_requests` and/or `duration_s`) or a trace
replay (`trace`, optionally cut by the same two limits; `arrivals` beside it
time a trace that has no arrival column). A synthetic workload
may add `shared_prefix` (a fraction of prompts start with a common system
prompt) and/or `conversations` (then `arrivals` are conversation starts,
`prompt_tokens` is each conversation's first prompt and `output_tokens` every
answer).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# text: JSONL with a prompt; the CSV formats are `sim.workload.csv_traces.CSV_FORMATS`
TraceFormat = Literal["azure", "burstgpt", "vidur", "csv", "mooncake", "text"]
Rate = Annotated[float, Field(gt=0, allow_inf_nan=False, description="requests per second")]
Burstiness = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Tokens = Annotated[int, Field(ge=1)]
ColumnName = Annotated[str, Field(min_length=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PoissonArrivals(_Strict):
    process: Literal["poisson"]
    rate: Rate
    burstiness: Burstiness = 1.0

    @field_validator("burstiness")
    @classmethod
    def _exactly_one(cls, value: float) -> float:
        if value != 1.0:
            raise ValueError("poisson has burstiness 1 by definition; use process: gamma")
        return value


class GammaArrivals(_Strict):
    process: Literal["gamma"]
    rate: Rate
    burstiness: Burstiness = 1.0


class ConstantArrivals(_Strict):
    process: Literal["constant"]
    rate: Rate


ArrivalsConfig = Annotated[
    PoissonArrivals | GammaArrivals | ConstantArrivals, Field(discriminator="process")
]


class _Clipped(_Strict):
    min: Tokens | None = None
    max: Tokens | None = None

    @model_validator(mode="after")
    def _min_below_max(self) -> _Clipped:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self


class FixedConfig(_Clipped):
    dist: Literal["fixed"]
    value: Tokens


class UniformConfig(_Clipped):
    dist: Literal["uniform"]
    low: Tokens
    high: Tokens

    @model_validator(mode="after")
    def _low_below_high(self) -> UniformConfig:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must be <= high ({self.high})")
        return self


class NormalConfig(_Clipped):
    dist: Literal["normal"]
    mean: Annotated[float, Field(ge=1, allow_inf_nan=False)]
    std: Annotated[float, Field(ge=0, allow_inf_nan=False)]


class LognormalConfig(_Clipped):
    dist: Literal["lognormal"]
    mean: Annotated[float, Field(ge=1, allow_inf_nan=False)]
    cv: Annotated[float, Field(ge=0, allow_inf_nan=False, description="std / mean")]


class EmpiricalConfig(_Clipped):
    """Either literal `values` or a `trace` column (defaults to the field it sits under).

    `column: prompt` / `output` are the trace's prompt / output lengths in its format's
    columns; any other name is a column of the CSV (or a key of the JSONL rows) itself.
    """

    dist: Literal["empirical"]
    values: Annotated[list[Tokens], Field(min_length=1)] | None = None
    trace: str | None = None
    format: TraceFormat | None = None
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


class TraceColumnsConfig(_Strict):
    """A CSV's own header names for the three trace columns (unset: the format's)."""

    arrival_s: ColumnName | None = Field(
        None, description="seconds or date-times; null: ignore the file's arrivals"
    )
    prompt_tokens: ColumnName | None = None
    output_tokens: ColumnName | None = None

    @model_validator(mode="after")
    def _lengths_not_null(self) -> TraceColumnsConfig:
        for name in ("prompt_tokens", "output_tokens"):
            if name in self.model_fields_set and getattr(self, name) is None:
                raise ValueError(f"{name}: a replay needs a column of {name}; name one")
        return self

    def mapping(self) -> dict[str, str | None]:
        """Only the keys the user set, so the rest keep the format's names."""
        return self.model_dump(exclude_unset=True)


class TraceConfig(_Strict):
    """`trace: FILE` is short for `trace: {path: FILE}`."""

    path: str = Field(
        description="file path, or builtin:azure_conv, azure_code, mooncake_conv, synthetic_conv"
    )
    format: TraceFormat | None = Field(None, description="guessed from the file if omitted")
    columns: TraceColumnsConfig | None = Field(
        None, description="a CSV's own column names: {arrival_s, prompt_tokens, output_tokens}"
    )
    time_scale: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 1.0

    @model_validator(mode="before")
    @classmethod
    def _bare_path(cls, data: object) -> object:
        return {"path": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _columns_for_csv(self) -> TraceConfig:
        if self.columns is not None and self.format in ("mooncake", "text"):
            raise ValueError(f"columns: maps the columns of a CSV trace, not of a {self.format} "
                             "one (remove columns or format)")
        return self


DEFAULT_UNIT_TOKENS = 16
UnitTokens = Annotated[int, Field(ge=1, description="tokens per prefix content id")]
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class SharedPrefixConfig(_Strict):
    """A `fraction` of requests open with one of `num_prompts` system prompts of `tokens`."""

    fraction: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
    tokens: Tokens
    num_prompts: Annotated[int, Field(ge=1)] = 1
    unit_tokens: UnitTokens | None = None


class FixedTime(_Strict):
    dist: Literal["fixed"]
    value_s: Seconds


class ExponentialTime(_Strict):
    dist: Literal["exponential"]
    mean_s: Annotated[float, Field(gt=0, allow_inf_nan=False)]


class LognormalTime(_Strict):
    dist: Literal["lognormal"]
    mean_s: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    cv: Annotated[float, Field(ge=0, allow_inf_nan=False, description="std / mean")]


TimeConfig = Annotated[FixedTime | ExponentialTime | LognormalTime, Field(discriminator="dist")]


class ConversationsConfig(_Strict):
    """Multi-turn chats: each turn's prompt is the previous prompt + answer + `user_tokens`."""

    turns: Tokens | LengthConfig = Field(description="turns per conversation (>= 1)")
    user_tokens: LengthConfig
    think_time_s: Seconds | TimeConfig = 0.0
    assumed_tpot_s: Seconds = Field(
        0.0, description="next turn waits output_tokens * this before thinking"
    )
    num_conversations: Annotated[int, Field(ge=1)] | None = None
    max_prompt_tokens: Tokens | None = Field(
        None, description="a conversation ends before a turn whose prompt would exceed this"
    )
    unit_tokens: UnitTokens | None = None


class WorkloadConfig(_Strict):
    arrivals: ArrivalsConfig | None = None
    prompt_tokens: LengthConfig | None = None
    output_tokens: LengthConfig | None = None
    trace: TraceConfig | None = None
    shared_prefix: SharedPrefixConfig | None = None
    conversations: ConversationsConfig | None = None
    num_requests: Annotated[int, Field(ge=1)] | None = None
    duration_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    tokenizer: Annotated[str, Field(min_length=1)] | None = Field(
        None,
        description="tokenizer for text prompts (a JSONL trace with 'prompt'): byte (default), "
        "mistral-v1, mistral-tekken, or a tokenizer.json path",
    )

    @model_validator(mode="after")
    def _one_shape(self) -> WorkloadConfig:
        synthetic = {
            "arrivals": self.arrivals,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
        }
        given = [name for name, value in synthetic.items() if value is not None]
        if self.trace is not None:
            # a trace without arrival times takes them from here, a text trace's rows
            # without output_tokens their lengths
            extras = [
                name
                for name in ("prompt_tokens", "shared_prefix", "conversations")
                if getattr(self, name) is not None
            ]
            if extras:
                raise ValueError(
                    f"give either 'trace' or synthetic fields, not both: {extras} "
                    "(only 'arrivals' and 'output_tokens' may fill in what a trace lacks)"
                )
            return self
        if len(given) != len(synthetic):
            missing = [name for name in synthetic if name not in given]
            raise ValueError(f"a synthetic workload needs {missing} (or give 'trace')")
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("a synthetic workload needs num_requests and/or duration_s")
        units = {
            section.unit_tokens
            for section in (self.shared_prefix, self.conversations)
            if section is not None and section.unit_tokens is not None
        }
        if len(units) > 1:
            raise ValueError(
                "shared_prefix.unit_tokens and conversations.unit_tokens differ "
                f"({sorted(units)}); set one, or the same value in both"
            )
        return self

    @property
    def unit_tokens(self) -> int:
        """Tokens per prefix content id of the synthetic prefix workloads."""
        for section in (self.shared_prefix, self.conversations):
            if section is not None and section.unit_tokens is not None:
                return section.unit_tokens
        return DEFAULT_UNIT_TOKENS
