"""The validated `workload:` section of a scenario (pydantic, unknown keys are errors).

It sits with the rest of the schema in sim.config, below sim.workload, which
turns it into requests: the schema is what a user may write, the workload
package what it means. The draws it is made of (arrival processes, length and
time distributions) are sim.config.draws.

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

from typing import Annotated

from pydantic import Field, model_validator

from sim.config.draws import (
    ArrivalsConfig,
    ColumnName,
    LengthConfig,
    Seconds,
    TimeConfig,
    Tokens,
    TraceFormat,
    WorkloadModel,
)


class TraceColumnsConfig(WorkloadModel):
    """A CSV's own header names for the three trace columns (unset: the format's)."""

    arrival_s: ColumnName | None = Field(
        None, description="seconds or date-times; null: ignore the file's arrivals"
    )
    prompt_tokens: ColumnName | None = Field(None, description="the column of prompt lengths")
    output_tokens: ColumnName | None = Field(None, description="the column of output lengths")

    @model_validator(mode="after")
    def _lengths_not_null(self) -> TraceColumnsConfig:
        for name in ("prompt_tokens", "output_tokens"):
            if name in self.model_fields_set and getattr(self, name) is None:
                raise ValueError(f"{name}: a replay needs a column of {name}; name one")
        return self

    def mapping(self) -> dict[str, str | None]:
        """Only the keys the user set, so the rest keep the format's names."""
        return self.model_dump(exclude_unset=True)


class TraceConfig(WorkloadModel):
    """`trace: FILE` is short for `trace: {path: FILE}`."""

    path: str = Field(
        description="file path, or builtin:azure_conv, azure_code, mooncake_conv, synthetic_conv"
    )
    format: TraceFormat | None = Field(None, description="guessed from the file if omitted")
    columns: TraceColumnsConfig | None = Field(
        None, description="a CSV's own column names: {arrival_s, prompt_tokens, output_tokens}"
    )
    time_scale: Annotated[float, Field(gt=0, allow_inf_nan=False)] = Field(
        1.0, description="divides the trace's arrival times: 2 replays it twice as fast")

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


class SharedPrefixConfig(WorkloadModel):
    """A `fraction` of requests open with one of `num_prompts` system prompts of `tokens`."""

    fraction: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] = Field(
        description="share of requests that open with a system prompt")
    tokens: Tokens = Field(description="length of each system prompt, tokens")
    num_prompts: Annotated[int, Field(ge=1)] = Field(
        1, description="distinct system prompts, chosen uniformly")
    unit_tokens: UnitTokens | None = Field(
        None, description="tokens per prefix content id (default 16, one KV block)")


class PromptGroupsConfig(WorkloadModel):
    """`groups` x `prompts_per_group` distinct prompts sent in a cycle, each a group's system
    prompt of `system_tokens` followed by its own question (inference-perf's shared-prefix
    workload); `prompt_tokens` is each prompt's whole length, drawn once per prompt."""

    groups: Annotated[int, Field(ge=1)] = Field(description="system prompts (groups)")
    prompts_per_group: Annotated[int, Field(ge=1)] = Field(
        description="distinct prompts opening with each system prompt")
    system_tokens: Tokens = Field(description="length of each group's system prompt, tokens")
    unit_tokens: UnitTokens | None = Field(
        None, description="tokens per prefix content id (default 16, one KV block)")


class ConversationsConfig(WorkloadModel):
    """Multi-turn chats: each turn's prompt is the previous prompt + answer + `user_tokens`."""

    turns: Tokens | LengthConfig = Field(description="turns per conversation (>= 1)")
    user_tokens: LengthConfig = Field(description="tokens the user adds each turn after the "
                                      "first")
    think_time_s: Seconds | TimeConfig = Field(
        0.0, description="seconds between an answer and the next turn: a number or a "
        "distribution")
    assumed_tpot_s: Seconds = Field(
        0.0, description="next turn waits output_tokens * this before thinking"
    )
    num_conversations: Annotated[int, Field(ge=1)] | None = Field(
        None, description="most conversations started (default: no cap; num_requests and "
        "duration_s still end the workload)")
    max_prompt_tokens: Tokens | None = Field(
        None, description="a conversation ends before a turn whose prompt would exceed this"
    )
    unit_tokens: UnitTokens | None = Field(
        None, description="tokens per prefix content id (default 16, one KV block)")


class WorkloadConfig(WorkloadModel):
    """The requests: synthetic arrivals and lengths, or a trace replay."""

    arrivals: ArrivalsConfig | None = Field(
        None, description="when requests arrive (with a trace: times a trace without them)")
    prompt_tokens: LengthConfig | None = Field(None, description="prompt lengths")
    output_tokens: LengthConfig | None = Field(
        None, description="output lengths (with a text trace: rows that give none)")
    trace: TraceConfig | None = Field(None, description="replay a trace file instead of "
                                      "drawing arrivals and lengths")
    shared_prefix: SharedPrefixConfig | None = Field(
        None, description="synthetic: some prompts open with a shared system prompt")
    conversations: ConversationsConfig | None = Field(
        None, description="synthetic: multi-turn chats, each turn extending the last")
    prompt_groups: PromptGroupsConfig | None = Field(
        None, description="synthetic: groups x prompts per group distinct prompts, sent in a "
        "cycle, each opening with its group's system prompt")
    num_requests: Annotated[int, Field(ge=1)] | None = Field(
        None, description="stop after this many requests")
    duration_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = Field(
        None, description="only requests arriving before this many seconds")
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
                for name in ("prompt_tokens", "shared_prefix", "conversations", "prompt_groups")
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
        if self.prompt_groups is not None:
            others = [name for name in ("shared_prefix", "conversations")
                      if getattr(self, name) is not None]
            if others:
                raise ValueError(f"prompt_groups already names every prompt's content; remove "
                                 f"{others}")
        units = {
            section.unit_tokens
            for section in (self.shared_prefix, self.conversations, self.prompt_groups)
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
        for section in (self.shared_prefix, self.conversations, self.prompt_groups):
            if section is not None and section.unit_tokens is not None:
                return section.unit_tokens
        return DEFAULT_UNIT_TOKENS
