"""Scenario files: a validated YAML schema, its loader and its error messages.

The schema's defaults are themselves a sensible scenario (Llama-3-8B on one
H100 under moderate Poisson load), so `servesim run` with no file runs it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sim.specs import (
    HardwareSpec,
    ModelSpec,
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
    "arrivals": {"process": "poisson", "rate": 4.0},
    "prompt_tokens": {"dist": "lognormal", "mean": 1155, "cv": 1.0, "min": 4, "max": 8000},
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
    policy: Literal["continuous"] = "continuous"
    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int = Field(8192, ge=1)
    chunked_prefill: bool = True
    max_model_len: int | None = Field(None, ge=2, description="default: the model's context")


class KVConfig(_Strict):
    block_size: int = Field(16, ge=1)
    dtype_bytes: float = Field(2.0, gt=0.0)
    watermark: float = Field(0.01, ge=0.0, lt=1.0)
    num_blocks: int | None = Field(None, ge=2, description="override the derived pool size")


class LatencyConfig(_Strict):
    model: Literal["roofline"] = "roofline"
    step_overhead_ms: float | None = Field(None, ge=0.0)
    compute_efficiency: float | None = Field(None, gt=0.0, le=1.0)
    bandwidth_efficiency: float | None = Field(None, gt=0.0, le=1.0)


class SLOConfig(_Strict):
    ttft_ms: float | None = Field(None, gt=0.0)
    tpot_ms: float | None = Field(None, gt=0.0)
    e2el_ms: float | None = Field(None, gt=0.0)


class OutputConfig(_Strict):
    dir: str | None = Field(None, description="default: results/<name>")
    plots: bool = True


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

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str | dict[str, Any]) -> str | dict[str, Any]:
        resolve_model(value)
        return value

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
        if not sep or not key:
            raise ScenarioError(f"--set {item!r}: expected key.path=value")
        node = raw
        *parents, leaf = key.split(".")
        for part in parents:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ScenarioError(f"--set {item!r}: {part!r} is not a section")
            node = child
        node[leaf] = yaml.safe_load(text)
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
        except yaml.YAMLError as err:
            raise ScenarioError(f"{path}: not valid YAML: {err}") from None
        if not isinstance(raw, dict):
            raise ScenarioError(f"{path}: a scenario must be a mapping of fields")
        base_dir = path.resolve().parent
    raw = apply_overrides(raw, overrides)
    try:
        return Scenario.model_validate(raw), base_dir
    except ValidationError as err:
        raise ScenarioError(format_errors(err, str(path or "default scenario"))) from None


def format_errors(err: ValidationError, source: str) -> str:
    """One line per problem: field path, what is wrong, the value given."""
    lines = [f"{source}: invalid scenario"]
    for problem in err.errors():
        loc = ".".join(str(p) for p in problem["loc"] if not _is_union_tag(p))
        msg = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            msg = f"unknown key{_allowed_keys(problem['loc'])}"
        value = problem.get("input")
        shown = "" if problem["type"] in ("missing", "extra_forbidden") else f" (got {value!r})"
        lines.append(f"  {loc}: {msg}{shown}")
    return "\n".join(lines)


def _is_union_tag(part: Any) -> bool:
    """Pydantic puts union member names (e.g. 'str', 'dict[str,any]') in locations."""
    return isinstance(part, str) and ("[" in part or part in ("str", "int", "float"))


def _allowed_keys(loc: tuple[Any, ...]) -> str:
    model: Any = Scenario
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return ""
        model = field.annotation
        args = getattr(model, "__args__", None)
        if args:  # Optional[X] and friends
            model = next((a for a in args if hasattr(a, "model_fields")), None)
        if model is None or not hasattr(model, "model_fields"):
            return ""
    return "; allowed: " + ", ".join(model.model_fields)
