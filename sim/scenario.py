"""Scenario files: a validated YAML schema, its loader and its error messages.

The schema's defaults are themselves a sensible scenario (Llama-3-8B on one
H100 under moderate Poisson load), so `servesim run` with no file runs it.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from sim.core.schedulers import POLICIES
from sim.specs import (
    HardwareSpec,
    ModelSpec,
    check_tp,
    get_hardware,
    get_model,
    hardware_from_fields,
    model_from_fields,
)
from sim.workload import WorkloadConfig


class ScenarioError(Exception):
    """A user mistake in a scenario: printed as is, never as a traceback."""


# Azure-2023-conversation-like lengths at a moderate rate: the quickstart.
DEFAULT_WORKLOAD: dict[str, Any] = {
    "arrivals": {"process": "poisson", "rate": 8.0},
    # max 6000 + output max 2000 stays within Llama-3-8B's 8192-token context
    "prompt_tokens": {"dist": "lognormal", "mean": 1155, "cv": 1.0, "min": 4, "max": 6000},
    "output_tokens": {"dist": "lognormal", "mean": 211, "cv": 1.0, "min": 1, "max": 2000},
    "num_requests": 1000,
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def resolve_model(value: str | Mapping[str, Any]) -> ModelSpec:
    return get_model(value) if isinstance(value, str) else model_from_fields(value)


def resolve_hardware(value: str | Mapping[str, Any]) -> HardwareSpec:
    return get_hardware(value) if isinstance(value, str) else hardware_from_fields(value)


class HardwareConfig(_Strict):
    gpu: str | dict[str, Any] = "h100-sxm"
    count: int = Field(1, ge=1, description="GPUs per replica, used for tensor parallelism")
    memory_utilization: float = Field(0.9, gt=0.0, le=1.0)

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, value: str | dict[str, Any]) -> str | dict[str, Any]:
        resolve_hardware(value)
        return value


class SchedulerConfig(_Strict):
    """continuous reads max_num_seqs..chunked_prefill; static and dynamic read batch_size
    and max_wait_ms; all read max_model_len and max_output_tokens."""

    policy: Literal["continuous", "static", "dynamic"] = "continuous"
    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int = Field(8192, ge=1)
    chunked_prefill: bool = True
    max_model_len: int | None = Field(None, ge=2, description="default: the model's context")
    batch_size: int = Field(16, ge=1, description="static/dynamic: requests per batch (B)")
    max_wait_ms: float | None = Field(
        None, gt=0.0, description="dynamic: launch a short batch when the oldest waited this "
        "long (default 50); static: optional, default wait for B or the end of arrivals")
    preemption: Literal["recompute", "swap"] = Field(
        "recompute", description="continuous: when blocks run out the newest request drops "
        "its KV and re-prefills later (recompute) or moves it to host memory (swap, "
        "kv.host_swap_gib; recompute when that is full)")
    max_output_tokens: int | None = Field(
        None, ge=1, description="output cap; contiguous KV reserves prompt + this (default: "
        "up to max_model_len, as servers without paging did); longer outputs are rejected")

    @model_validator(mode="after")
    def _decodes_fit_a_step(self) -> SchedulerConfig:
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be "
                             f">= max_num_seqs ({self.max_num_seqs}) so every decode fits a step")
        return self


class KVConfig(_Strict):
    mode: Literal["paged", "contiguous"] | None = Field(
        None, description="default: paged for continuous, contiguous for static and dynamic")
    block_size: int = Field(16, ge=1)
    dtype_bytes: float = Field(2.0, gt=0.0)
    watermark: float = Field(0.01, ge=0.0, lt=1.0)
    num_blocks: int | None = Field(None, ge=2, description="override the derived pool size")
    prefix_caching: bool = Field(
        False, description="paged only: reuse the KV of cached prompt prefixes (by token ids "
        "or a trace's prefix ids)")
    host_swap_gib: float = Field(
        64.0, ge=0.0, description="host memory for swap preemption, GiB per replica")


class LatencyConfig(_Strict):
    """roofline: from the model and GPU specs (the knobs below tune it); table: a fitted
    calibration table directory (`servesim calibrate fit`), `path` relative to the scenario."""

    model: Literal["roofline", "table"] = "roofline"
    path: str | None = Field(None, min_length=1, description="table: the calibration table "
                             "directory, relative to the scenario file")
    step_overhead_ms: float | None = Field(None, ge=0.0)
    compute_efficiency: float | None = Field(None, gt=0.0, le=1.0)
    bandwidth_efficiency: float | None = Field(None, gt=0.0, le=1.0)

    def problem(self) -> str | None:
        """A 'latency.<field>: why' message when the options do not suit `model`."""
        if self.model == "table":
            if self.path is None:
                return ("latency.path: model table needs the calibration table directory "
                        "(relative to the scenario file)")
            knobs = [k for k in ("step_overhead_ms", "compute_efficiency",
                                 "bandwidth_efficiency") if getattr(self, k) is not None]
            if knobs:
                return (f"latency.{knobs[0]}: tunes the roofline model only; a table brings "
                        f"its own fitted coefficients (got model table)")
        elif self.path is not None:
            return (f"latency.path: only model table reads a table directory, got model "
                    f"{self.model!r} with path {self.path!r}")
        return None


class SLOConfig(_Strict):
    ttft_ms: float | None = Field(None, gt=0.0)
    tpot_ms: float | None = Field(None, gt=0.0)
    e2el_ms: float | None = Field(None, gt=0.0)


class OutputConfig(_Strict):
    dir: str | None = Field(None, description="default: results/<name>")
    plots: bool = True


class SamplingConfig(_Strict):
    """The engine's sampler; the simulator's outputs are scripted, so it ignores this."""

    temperature: float = Field(0.0, ge=0.0, description="0 = greedy")
    top_k: int = Field(0, ge=0, description="0 = off")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="1 = off")


class EngineConfig(_Strict):
    """How `servesim engine replay` runs the scenario on the real PyTorch engine."""

    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda if present")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto = bfloat16 on cuda, float32 on cpu")
    weights: str | None = Field(
        None, description="a local Hugging Face directory (config.json + safetensors); "
        "null = random weights of the model's real shapes")
    seed: int | None = Field(None, description="weights and synthetic prompts; null = seed")
    cuda_graphs: bool = Field(True, description="capture decode steps in CUDA graphs")
    cpu_threads: int | None = Field(
        None, ge=1, description="torch's intra-op threads on the CPU; null = torch's default. "
        "1 keeps a small model's steps steady when other work shares the cores")
    warmup: bool = True
    sampling: SamplingConfig = SamplingConfig()


class FixedAlphaConfig(_Strict):
    dist: Literal["fixed"] = "fixed"
    alpha: float = Field(0.7, ge=0.0, le=1.0, description="per-token acceptance probability")


class UniformAlphaConfig(_Strict):
    dist: Literal["uniform"]
    low: float = Field(ge=0.0, le=1.0)
    high: float = Field(ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _ordered(self) -> UniformAlphaConfig:
        if self.low > self.high:
            raise ValueError(f"low {self.low} must be <= high {self.high}")
        return self


class BetaAlphaConfig(_Strict):
    dist: Literal["beta"]
    mean: float = Field(gt=0.0, lt=1.0)
    std: float = Field(gt=0.0)

    @model_validator(mode="after")
    def _feasible(self) -> BetaAlphaConfig:
        limit = (self.mean * (1 - self.mean)) ** 0.5
        if self.std >= limit:
            raise ValueError(f"std must be < sqrt(mean (1 - mean)) = {limit:.4g} for a Beta "
                             f"with mean {self.mean} (got {self.std})")
        return self


class SpeculativeConfig(_Strict):
    """Speculative decoding (continuous batching): k drafts per decoding sequence per step.

    `draft`: "ngram" (prompt lookup, near-zero cost) or a draft model, a catalogue
    name or a mapping of model fields (`base:` plus overrides), priced by its own
    roofline with `draft_overhead_ms` per pass; it must share the target's vocabulary.
    `acceptance`: per-token acceptance probability alpha, fixed or drawn per request.
    """

    num_tokens: int = Field(0, ge=0, le=64, description="k draft tokens per step; 0 = off")
    draft: str | dict[str, Any] = "ngram"
    draft_overhead_ms: float | None = Field(
        None, ge=0.0, description="model draft: fixed cost of each draft pass (default 0.1); "
        "ngram: CPU cost per step (default 0)")
    acceptance: Annotated[FixedAlphaConfig | UniformAlphaConfig | BetaAlphaConfig,
                          Field(discriminator="dist")] = FixedAlphaConfig()

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


class RouterConfig(_Strict):
    """How a fleet (replicas > 1) spreads arrivals; see sim.router for each policy."""

    policy: Literal["round_robin", "least_outstanding", "least_kv", "power_of_two",
                    "prefix_aware"] = "round_robin"
    load_limit: float = Field(
        1.5, ge=1.0, allow_inf_nan=False,
        description="prefix_aware: only replicas with outstanding requests <= load_limit x "
        "the fleet mean + 1 are candidates (>= 1 keeps the least-loaded one eligible)")


class Scenario(_Strict):
    name: str = "quickstart"
    description: str = ""
    seed: int = 0
    model: str | dict[str, Any] = "llama-3-8b"
    hardware: HardwareConfig = HardwareConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    kv: KVConfig = KVConfig()
    latency: LatencyConfig = LatencyConfig()
    workload: WorkloadConfig = Field(
        default_factory=lambda: WorkloadConfig.model_validate(DEFAULT_WORKLOAD))
    slo: SLOConfig | None = None
    output: OutputConfig = OutputConfig()
    replicas: int = Field(1, ge=1, description="identical replicas, each of hardware.count GPUs")
    router: RouterConfig = RouterConfig()
    engine: EngineConfig = EngineConfig()
    speculative: SpeculativeConfig = SpeculativeConfig()

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str | dict[str, Any]) -> str | dict[str, Any]:
        resolve_model(value)
        return value

    @model_validator(mode="after")
    def _kv_mode_suits_policy(self) -> Scenario:
        policy, mode = self.scheduler.policy, self.kv.mode
        modes = POLICIES[policy].kv_modes
        if mode is not None and mode not in modes:
            raise ValueError(f"kv.mode: {policy} batching reserves each request's KV up front "
                             f"and runs only on {' or '.join(modes)} (or omit kv.mode), "
                             f"got {mode!r}")
        if self.kv_mode != "paged":
            if self.kv.prefix_caching:
                raise ValueError(f"kv.prefix_caching: needs a paged KV pool, and {policy} "
                                 f"batching runs on {self.kv_mode}")
            if self.scheduler.preemption == "swap":
                raise ValueError(f"scheduler.preemption: swap needs a paged KV pool, and "
                                 f"{policy} batching runs on {self.kv_mode}")
        return self

    @model_validator(mode="after")
    def _max_model_len_fits_model(self) -> Scenario:
        limit, model = self.scheduler.max_model_len, self.model_spec
        if limit is not None and limit > model.max_context_tokens:
            raise ValueError(f"scheduler.max_model_len: {limit} exceeds {model.name}'s maximum "
                             f"context of {model.max_context_tokens} tokens (set at most that, "
                             "or a model with a longer context, e.g. llama-3.1-8b)")
        return self

    @model_validator(mode="after")
    def _speculation_suits(self) -> Scenario:
        spec = self.speculative
        if not spec.num_tokens:
            return self
        if self.scheduler.policy != "continuous":
            raise ValueError(f"speculative.num_tokens: speculative decoding needs continuous "
                             f"batching, got scheduler.policy {self.scheduler.policy!r} (set "
                             "num_tokens 0 or policy continuous)")
        draft = spec.draft_spec
        if draft is not None and draft.vocab_size != self.model_spec.vocab_size:
            raise ValueError(f"speculative.draft: the draft's vocabulary ({draft.vocab_size}) "
                             f"must be the target's ({self.model_spec.vocab_size}) to verify "
                             "its tokens")
        if draft is not None:
            try:
                check_tp(draft, self.hardware.count)
            except ValueError as err:
                raise ValueError(f"speculative.draft: {err}") from None
        return self

    @model_validator(mode="after")
    def _latency_options_suit_model(self) -> Scenario:
        problem = self.latency.problem()
        if problem is not None:  # raised here so the report names latency.<field>
            raise ValueError(problem)
        return self

    @property
    def kv_mode(self) -> str:
        """kv.mode, or the policy's default when it is omitted."""
        return self.kv.mode or POLICIES[self.scheduler.policy].kv_modes[0]

    @property
    def model_spec(self) -> ModelSpec:
        return resolve_model(self.model)

    @property
    def hardware_spec(self) -> HardwareSpec:
        return resolve_hardware(self.hardware.gpu)


def apply_overrides(raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply `key.path=value` strings (values parsed as YAML) to a raw scenario dict."""
    for item in overrides:
        key, sep, text = item.partition("=")
        *parents, leaf = key.strip().split(".")
        if not sep or not all((*parents, leaf)):
            raise ScenarioError(f"--set {item!r}: expected key.path=value")
        node = raw
        for part in parents:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ScenarioError(f"--set {item!r}: {part!r} is {child!r}, not a section")
            node = child
        try:
            node[leaf] = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ScenarioError(f"--set {item!r}: value is not valid YAML: "
                                f"{_yaml_problem(err)}") from None
    return raw


def load_scenario(path: str | Path | None, overrides: Sequence[str] = ()) -> tuple[Scenario, Path]:
    """Read, override and validate a scenario; returns it and its base folder."""
    if path is None:
        raw: Any = {}
        base_dir = Path.cwd()
    else:
        path = Path(path)
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except FileNotFoundError:
            raise ScenarioError(f"{path}: no such scenario file") from None
        except (OSError, UnicodeDecodeError) as err:
            raise ScenarioError(f"{path}: cannot read: {getattr(err, 'strerror', err)}") from None
        except yaml.YAMLError as err:
            raise ScenarioError(f"{path}: not valid YAML: {_yaml_problem(err)}") from None
        if not isinstance(raw, dict):
            raise ScenarioError(f"{path}: a scenario must be a mapping of fields, "
                                f"got {type(raw).__name__}")
        base_dir = path.resolve().parent
    if "workload" not in raw:
        # an omitted workload means the default one; `--set workload.x=...` edits it
        raw["workload"] = copy.deepcopy(DEFAULT_WORKLOAD)
    raw = apply_overrides(raw, overrides)
    return validate_scenario(raw, str(path or "default scenario")), base_dir


def validate_scenario(raw: dict[str, Any], source: str) -> Scenario:
    """Validate a raw mapping; every problem becomes one ScenarioError naming `source`."""
    try:
        scenario = Scenario.model_validate(raw)
    except ValidationError as err:
        raise ScenarioError(format_errors(err, source)) from None
    try:
        check_tp(scenario.model_spec, scenario.hardware.count)
    except ValueError as err:
        raise ScenarioError(f"{source}: hardware.count: {err}") from None
    return scenario


def _yaml_problem(err: yaml.YAMLError) -> str:
    """PyYAML's multi-line report squeezed to 'what, at line L, column C'."""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    mark = getattr(err, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{where}"


def format_errors(err: ValidationError, source: str) -> str:
    """One line per problem: field path, what is wrong, the value given.

    Pydantic's raw report names union members in locations, adds URLs and
    prefixes; a user wants the YAML path they typed and the allowed values.
    """
    problems: dict[str, tuple[list[str], str]] = {}  # path -> messages, value shown
    for problem in err.errors(include_url=False):
        path, message, shown = _describe(problem)
        messages, _ = problems.setdefault(path, ([], shown))
        if message not in messages:
            messages.append(message)
    lines = [f"{path}: {_join(messages)}{shown}" for path, (messages, shown) in problems.items()]
    if len(lines) == 1:
        return f"{source}: {lines[0]}"
    return "\n".join([f"{source}: {len(lines)} problems", *(f"  {line}" for line in lines)])


def _describe(problem: Mapping[str, Any]) -> tuple[str, str, str]:
    """(field path, message, ' (got VALUE)' or '') for one pydantic error."""
    kind, loc, value = problem["type"], tuple(problem["loc"]), problem.get("input")
    parts, models = _clean_loc(loc)
    message = _NOISE.sub("", problem["msg"])
    lead = _FIELD_LEAD.match(message) if not parts else None
    if lead:  # a cross-section check names the field it is about: report it there
        parts, message = lead["path"].split("."), lead["rest"]
    show_value = kind not in ("missing", "extra_forbidden")
    if kind == "extra_forbidden":
        _, owners = _clean_loc(loc[:-1])
        allowed = list(dict.fromkeys(name for m in owners for name in m.model_fields))
        message = "unknown key" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        key = str(problem.get("ctx", {}).get("discriminator", "")).strip("'")
        tags = [t for m in models for t in _literal_values(m, key)]
        parts.append(key)
        if kind == "union_tag_invalid":
            value = problem["ctx"]["tag"]
            message = f"unknown value {value!r}"
        else:
            message, show_value = "missing", False
        message += f"; allowed: {', '.join(tags)}" if tags else ""
    elif isinstance(value, Mapping) and kind.endswith("_error"):
        show_value = False  # a section-level check: its message names the values
    shown = ""
    if show_value and repr(value) not in message:
        text = repr(value)
        shown = f" (got {text if len(text) <= 60 else text[:57] + '...'})"
    return ".".join(parts) or "(top level)", message, shown


_NOISE = re.compile(r"^(Value error|Assertion failed), | or (instance of \w+|object to extract "
                    r"fields from)")


_FIELD_LEAD = re.compile(r"^(?P<path>[a-z_]+(?:\.[a-z_]+)+): (?P<rest>.*)$", re.DOTALL)


def _join(messages: list[str]) -> str:
    """'should be a valid string' + 'should be a valid dictionary' -> one 'or' sentence."""
    lead = "Input should be "
    if len(messages) > 1 and all(m.startswith(lead) for m in messages):
        return lead + " or ".join(m.removeprefix(lead) for m in messages)
    return "; ".join(messages)


def _clean_loc(loc: tuple[Any, ...]) -> tuple[list[str], list[type[BaseModel]]]:
    """The user's field path for a pydantic location, and the model(s) it ends in.

    Walks the schema so union member names ('poisson', 'str', 'function-after[...]')
    are dropped while real keys, even unknown ones, are kept.
    """
    models: list[type[BaseModel]] = [Scenario]
    parts: list[str] = []
    for part in loc:
        if isinstance(part, int):
            parts.append(str(part))
            continue
        owners = [m for m in models if part in m.model_fields]
        if owners:
            parts.append(part)
            models = list(dict.fromkeys(
                sub for m in owners for sub in _models_in(m.model_fields[part].annotation)))
        elif any(part in _literal_values(m) for m in models):
            models = [m for m in models if part in _literal_values(m)]
        elif not models and _is_union_tag(part):
            continue
        else:
            parts.append(part)
            models = []
    return parts, models


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models a field can hold, through Optional, unions and Annotated."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def _literal_values(model: type[BaseModel], key: str | None = None) -> list[str]:
    """Values of single-choice Literal fields: the tags of a discriminated union."""
    values = []
    for name, field in model.model_fields.items():
        if (key is None or name == key) and get_origin(field.annotation) is Literal:
            values.extend(str(v) for v in get_args(field.annotation))
    return values


def _is_union_tag(part: Any) -> bool:
    """Member names pydantic gives plain-type unions, e.g. 'str', 'dict[str,any]'."""
    return isinstance(part, str) and (
        "[" in part or part in ("str", "int", "float", "bool", "none", "list", "dict"))
