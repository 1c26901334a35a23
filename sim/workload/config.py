"""The `workload:` section of a scenario, validated, and the request factory.

Two shapes, exactly one per workload: synthetic (`arrivals` + `prompt_tokens`
+ `output_tokens`, bounded by `num_requests` and/or `duration_s`) or a trace
replay (`trace`, optionally cut by the same two limits). Unknown keys are
errors. Arrivals and each length draw from their own child generator of one
`SeedSequence`, so editing one distribution never shifts the others' draws.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sim.core.request import Request
from sim.workload.arrivals import DEFAULT_CHUNK_SIZE, ArrivalProcess, arrival_chunks_s
from sim.workload.lengths import (
    Empirical,
    Fixed,
    LengthDist,
    LengthSpec,
    Lognormal,
    Normal,
    Uniform,
    sample_lengths,
)
from sim.workload.traces import Trace, TraceFormat, read_trace

BUILTIN_PREFIX = "builtin:"
BUILTIN_TRACES = {"synthetic_conv": "data/synthetic_conv.csv"}

Rate = Annotated[float, Field(gt=0, allow_inf_nan=False, description="requests per second")]
Burstiness = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Tokens = Annotated[int, Field(ge=1)]


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
    """Either literal `values` or a `trace` column (defaults to the field it sits under)."""

    dist: Literal["empirical"]
    values: Annotated[list[Tokens], Field(min_length=1)] | None = None
    trace: str | None = None
    format: TraceFormat | None = None
    column: Literal["prompt", "output"] | None = None

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


class TraceConfig(_Strict):
    path: str = Field(description="file path, or builtin:synthetic_conv")
    format: TraceFormat | None = Field(None, description="guessed from the file if omitted")
    time_scale: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 1.0


class WorkloadConfig(_Strict):
    arrivals: ArrivalsConfig | None = None
    prompt_tokens: LengthConfig | None = None
    output_tokens: LengthConfig | None = None
    trace: TraceConfig | None = None
    num_requests: Annotated[int, Field(ge=1)] | None = None
    duration_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None

    @model_validator(mode="after")
    def _one_shape(self) -> WorkloadConfig:
        synthetic = {
            "arrivals": self.arrivals,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
        }
        given = [name for name, value in synthetic.items() if value is not None]
        if self.trace is not None:
            if given:
                raise ValueError(f"give either 'trace' or synthetic fields, not both: {given}")
            return self
        if len(given) != len(synthetic):
            missing = [name for name in synthetic if name not in given]
            raise ValueError(f"a synthetic workload needs {missing} (or give 'trace')")
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("a synthetic workload needs num_requests and/or duration_s")
        return self


def resolve_trace_path(path: str, base_dir: Path | None = None) -> Path:
    """Find a trace: relative to `base_dir` (the scenario's folder) first, then the cwd."""
    given = Path(path).expanduser()
    if given.is_absolute():
        candidates = [given]
    else:
        candidates = [base_dir / given] if base_dir is not None else []
        candidates.append(Path.cwd() / given)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    tried = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(f"trace file {path!r} not found (tried: {tried})")


def load_trace(
    path: str, fmt: TraceFormat | None, time_scale: float = 1.0, base_dir: Path | None = None
) -> Trace:
    """Read a trace by config path, including the shipped `builtin:` ones."""
    if not path.startswith(BUILTIN_PREFIX):
        return read_trace(resolve_trace_path(path, base_dir), fmt, time_scale)
    name = path.removeprefix(BUILTIN_PREFIX)
    if name not in BUILTIN_TRACES:
        raise FileNotFoundError(f"unknown builtin trace {name!r}; have {sorted(BUILTIN_TRACES)}")
    resource = resources.files("sim.workload").joinpath(BUILTIN_TRACES[name])
    with resources.as_file(resource) as real_path:
        return read_trace(real_path, fmt or "csv", time_scale)


def length_spec(cfg: LengthConfig, column: str, base_dir: Path | None = None) -> LengthSpec:
    """The pure sampling spec for a length config; `column` is the default trace column."""
    dist: LengthDist
    match cfg:
        case FixedConfig():
            dist = Fixed(cfg.value)
        case UniformConfig():
            dist = Uniform(cfg.low, cfg.high)
        case NormalConfig():
            dist = Normal(cfg.mean, cfg.std)
        case LognormalConfig():
            dist = Lognormal(cfg.mean, cfg.cv)
        case EmpiricalConfig(values=list() as values):
            dist = Empirical(tuple(values))
        case EmpiricalConfig(trace=str() as trace_path):
            trace = load_trace(trace_path, cfg.format, base_dir=base_dir)
            which = cfg.column or column
            lengths = trace.prompt_tokens if which == "prompt" else trace.output_tokens
            dist = Empirical(tuple(lengths.tolist()))
        case _:
            raise TypeError(f"not a length config: {cfg!r}")
    return LengthSpec(dist, min_tokens=cfg.min or 1, max_tokens=cfg.max)


def arrival_process(cfg: PoissonArrivals | GammaArrivals | ConstantArrivals) -> ArrivalProcess:
    burstiness = cfg.burstiness if isinstance(cfg, GammaArrivals) else 1.0
    return ArrivalProcess(cfg.process, cfg.rate, burstiness)


def _synthetic(
    process: ArrivalProcess,
    prompt_spec: LengthSpec,
    output_spec: LengthSpec,
    seed: int,
    limit: float,
    end_s: float,
    chunk_size: int,
) -> Iterator[Request]:
    arrivals_rng, prompt_rng, output_rng = (
        np.random.default_rng(child) for child in np.random.SeedSequence(seed).spawn(3)
    )
    request_id = 0
    for times_s in arrival_chunks_s(process, arrivals_rng, chunk_size):
        prompts = sample_lengths(prompt_spec, prompt_rng, chunk_size).tolist()
        outputs = sample_lengths(output_spec, output_rng, chunk_size).tolist()
        for arrival_s, prompt, output in zip(times_s.tolist(), prompts, outputs, strict=True):
            if request_id >= limit or arrival_s >= end_s:
                return
            yield Request(request_id, arrival_s, prompt, output)
            request_id += 1


def _replay(trace: Trace, limit: float, end_s: float) -> Iterator[Request]:
    hashes = trace.prefix_block_ids
    rows = zip(
        trace.arrival_s.tolist(),
        trace.prompt_tokens.tolist(),
        trace.output_tokens.tolist(),
        strict=True,
    )
    for request_id, (arrival_s, prompt, output) in enumerate(rows):
        if request_id >= limit or arrival_s >= end_s:
            return
        prefix = hashes[request_id] if hashes is not None else None
        yield Request(request_id, arrival_s, prompt, output, prefix_block_ids=prefix)


def make_requests(
    cfg: WorkloadConfig,
    seed: int,
    base_dir: Path | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Iterator[Request]:
    """Requests in arrival order, ids 0, 1, 2, ...; lazy, so memory stays flat.

    Files are read eagerly (a missing trace fails here, not mid-run); requests lazily.
    Arrivals stop before `duration_s` (an arrival at exactly `duration_s` is excluded).
    """
    limit = cfg.num_requests if cfg.num_requests is not None else math.inf
    end_s = cfg.duration_s if cfg.duration_s is not None else math.inf
    if cfg.trace is not None:
        trace = load_trace(cfg.trace.path, cfg.trace.format, cfg.trace.time_scale, base_dir)
        return _replay(trace, limit, end_s)
    if cfg.arrivals is None or cfg.prompt_tokens is None or cfg.output_tokens is None:
        raise ValueError("a synthetic workload needs arrivals, prompt_tokens and output_tokens")
    return _synthetic(
        arrival_process(cfg.arrivals),
        length_spec(cfg.prompt_tokens, "prompt", base_dir),
        length_spec(cfg.output_tokens, "output", base_dir),
        seed,
        limit,
        end_s,
        chunk_size,
    )
