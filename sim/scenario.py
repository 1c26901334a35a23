"""Scenario files: a validated YAML schema and its loader (error text: sim.scenario_input).

The schema's defaults are themselves a sensible scenario (Llama-3-8B on one
H100 under moderate Poisson load), so `servesim run` with no file runs it.
Every field carries a description: `servesim schema` prints them.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from sim.core.schedulers import POLICIES
from sim.scenario_input import ScenarioError, check_plain, format_errors, parse_yaml, read_yaml
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

__all__ = ["DEFAULT_WORKLOAD", "SCHEMA_VERSION", "Scenario", "ScenarioError", "apply_overrides",
           "load_scenario", "read_scenario_raw", "validate_scenario"]

# Recorded in every summary.json; bumped when a field is renamed or removed or changes meaning.
SCHEMA_VERSION = 1
# The simulator runs a few thousand requests per second on a laptop core and keeps
# ~100 bytes per request (plus a requests.csv row): 10 million is about an hour and
# a gigabyte. Beyond that a run is a mistake (a 30-digit count ran 10 minutes and
# wrote nothing); a steady-state estimate needs far fewer.
MAX_REQUESTS = 10_000_000
# The paged pool keeps a few Python lists of num_blocks entries (~60 bytes a block):
# 10 million blocks is ~600 MB of host memory, far above any GPU's pool (3 million
# 16-token blocks already hold 48M tokens: an "unbounded" pool).
MAX_BLOCKS = 10_000_000
# Each replica holds its own pool and scheduler; a fleet above this is a typo.
MAX_REPLICAS = 1024
NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}")

# Azure-2023-conversation-like lengths at a moderate rate: the quickstart.
DEFAULT_WORKLOAD: dict[str, Any] = {
    "arrivals": {"process": "poisson", "rate": 8.0},
    # max 6000 + output max 2000 stays within Llama-3-8B's 8192-token context
    "prompt_tokens": {"dist": "lognormal", "mean": 1155, "cv": 1.0, "min": 4, "max": 6000},
    "output_tokens": {"dist": "lognormal", "mean": 211, "cv": 1.0, "min": 1, "max": 2000},
    "num_requests": 1000,
}


class _Strict(BaseModel):
    # inf passes ge/le checks but means nothing in a scenario (and breaks int() later)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def resolve_model(value: str | Mapping[str, Any]) -> ModelSpec:
    return get_model(value) if isinstance(value, str) else model_from_fields(value)


def resolve_hardware(value: str | Mapping[str, Any]) -> HardwareSpec:
    return get_hardware(value) if isinstance(value, str) else hardware_from_fields(value)


class HardwareConfig(_Strict):
    """The GPUs of one replica."""

    gpu: str | dict[str, Any] = Field(
        "h100-sxm", description="catalogue name (`servesim capacity --help` lists them), or a "
        "mapping of HardwareSpec fields, e.g. {base: h100-sxm, memory_gib: 94}")
    count: int = Field(1, ge=1, description="GPUs per replica, used for tensor parallelism")
    memory_utilization: float = Field(
        0.9, gt=0.0, le=1.0, description="share of GPU memory the server may use "
        "(vLLM's gpu_memory_utilization)")

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, value: str | dict[str, Any]) -> str | dict[str, Any]:
        resolve_hardware(value)
        return value


class SchedulerConfig(_Strict):
    """continuous reads max_num_seqs..chunked_prefill; static and dynamic read batch_size
    and max_wait_ms; all read max_model_len and max_output_tokens."""

    policy: Literal["continuous", "static", "dynamic"] = Field(
        "continuous", description="continuous: iteration-level (Orca/vLLM); static: fixed "
        "batches of batch_size run to their longest member; dynamic: static that also "
        "launches after max_wait_ms")
    max_num_seqs: int = Field(256, ge=1, description="continuous: most sequences in one step")
    max_num_batched_tokens: int = Field(
        8192, ge=1, description="continuous: token budget of one step (prefill chunks + "
        "decodes)")
    chunked_prefill: bool = Field(
        True, description="continuous: split long prompts across steps to share them with "
        "decodes")
    max_model_len: int | None = Field(
        None, ge=2, description="longest prompt + output; longer requests are rejected "
        "(default: the model's context)")
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
    scheduler_reserve_full_isl: bool = Field(
        True, description="continuous: admit a request only when blocks for all its known "
        "tokens fit, not just its first chunk (vLLM's setting of that name; false = vLLM "
        "<= 0.18)")

    @model_validator(mode="after")
    def _decodes_fit_a_step(self) -> SchedulerConfig:
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be "
                             f">= max_num_seqs ({self.max_num_seqs}) so every decode fits a step")
        return self


class KVConfig(_Strict):
    """The KV cache pool of one replica."""

    mode: Literal["paged", "contiguous"] | None = Field(
        None, description="default: paged for continuous, contiguous for static and dynamic")
    block_size: int = Field(16, ge=1, description="tokens per KV block")
    dtype_bytes: float = Field(2.0, gt=0.0, description="bytes per KV value (2 = bf16/fp16, "
                               "1 = fp8); also the weights' bytes per parameter")
    watermark: float = Field(0.0, ge=0.0, lt=1.0, description="share of blocks (the null "
                             "block included) an admission leaves free while others run, "
                             "as vLLM's scheduler watermark (default 0, as vLLM's)")
    num_blocks: int | None = Field(
        None, ge=2, le=MAX_BLOCKS, description="override the pool size derived from the "
        "memory left after weights and activations (counts the null block)")
    prefix_caching: bool = Field(
        False, description="paged only: reuse the KV of cached prompt prefixes (by token ids "
        "or a trace's prefix ids)")
    host_swap_gib: float = Field(
        64.0, ge=0.0, description="host memory for swap preemption, GiB per replica")


class LatencyConfig(_Strict):
    """roofline: from the model and GPU specs (the knobs below tune it); table: a fitted
    calibration table directory (`servesim calibrate fit`), `path` relative to the scenario."""

    model: Literal["roofline", "table"] = Field(
        "roofline", description="roofline: step time from FLOPs and bytes, needs no "
        "calibration; table: a fitted calibration table")
    path: str | None = Field(None, min_length=1, description="table: the calibration table "
                             "directory, relative to the scenario file")
    step_overhead_ms: float | None = Field(
        None, ge=0.0, description="roofline: fixed cost per step (default 2 ms)")
    compute_efficiency: float | None = Field(
        None, gt=0.0, le=1.0, description="roofline: share of peak FLOP/s reached (default 0.6)")
    bandwidth_efficiency: float | None = Field(
        None, gt=0.0, le=1.0, description="roofline: share of memory bandwidth reached "
        "(default 0.8)")

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
    """Service-level objectives: a request meets them only if it meets every bound given."""

    ttft_ms: float | None = Field(None, gt=0.0, description="time to first token bound")
    tpot_ms: float | None = Field(None, gt=0.0, description="time per output token bound "
                                  "(after the first)")
    e2el_ms: float | None = Field(None, gt=0.0, description="end-to-end latency bound")


class OutputConfig(_Strict):
    """Where `servesim run` writes its files."""

    dir: str | None = Field(None, description="default: results/<name> (plus the --set "
                            "overrides, if any); `--out DIR` overrides")
    plots: bool = Field(True, description="write PNG plots; `--no-plots` skips them")


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
    seed: int | None = Field(None, ge=0, description="weights and synthetic prompts; "
                             "null = the scenario's seed")
    cuda_graphs: bool = Field(True, description="capture decode steps in CUDA graphs")
    cpu_threads: int | None = Field(
        None, ge=1, description="torch's intra-op threads on the CPU; null = torch's default. "
        "1 keeps a small model's steps steady when other work shares the cores")
    warmup: bool = Field(True, description="run a few steps before the first arrival")
    sampling: SamplingConfig = Field(SamplingConfig(), description="the engine's sampler")


class FixedAlphaConfig(_Strict):
    """Every request accepts each draft token with the same probability."""

    dist: Literal["fixed"] = Field("fixed", description="one alpha for every request")
    alpha: float = Field(0.7, ge=0.0, le=1.0, description="per-token acceptance probability")


class UniformAlphaConfig(_Strict):
    """Each request draws its acceptance probability uniformly from [low, high]."""

    dist: Literal["uniform"] = Field(description="alpha ~ Uniform(low, high) per request")
    low: float = Field(ge=0.0, le=1.0, description="lowest alpha")
    high: float = Field(ge=0.0, le=1.0, description="highest alpha")

    @model_validator(mode="after")
    def _ordered(self) -> UniformAlphaConfig:
        if self.low > self.high:
            raise ValueError(f"low {self.low} must be <= high {self.high}")
        return self


class BetaAlphaConfig(_Strict):
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


class SpeculativeConfig(_Strict):
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


class RouterConfig(_Strict):
    """How a fleet (replicas > 1) spreads arrivals; see sim.router for each policy."""

    policy: Literal["round_robin", "least_outstanding", "least_kv", "power_of_two",
                    "prefix_aware"] = Field(
        "round_robin", description="round_robin, least_outstanding (fewest requests in "
        "flight), least_kv (most free KV), power_of_two (the less loaded of two random), "
        "prefix_aware (where the prompt's prefix is cached, within load_limit)")
    load_limit: float = Field(
        1.5, ge=1.0, description="prefix_aware: only replicas with outstanding requests <= "
        "load_limit x the fleet mean + 1 are candidates (>= 1 keeps the least-loaded one "
        "eligible)")


class Scenario(_Strict):
    """One simulated deployment: model, GPUs, scheduler, KV pool, latency model, workload."""

    name: str = Field("quickstart", description="names results/<name>/: letters, digits, "
                      ". _ -, not starting with '.' (default in a file: the file's name)")
    description: str = Field("", description="free text, for people")
    seed: int = Field(0, ge=0, description="same file + same seed = the same run, request for "
                      "request")
    model: str | dict[str, Any] = Field(
        "llama-3-8b", description="catalogue name (`servesim capacity --help`), or a mapping "
        "of ModelSpec fields, e.g. {base: llama-3-8b, num_layers: 40}")
    hardware: HardwareConfig = Field(HardwareConfig(), description="the GPUs of one replica")
    scheduler: SchedulerConfig = Field(SchedulerConfig(), description="batching policy and "
                                       "its limits")
    kv: KVConfig = Field(KVConfig(), description="the KV cache pool")
    latency: LatencyConfig = Field(LatencyConfig(), description="how long a step takes")
    workload: WorkloadConfig = Field(
        default_factory=lambda: WorkloadConfig.model_validate(DEFAULT_WORKLOAD),
        description="the requests: synthetic arrivals and lengths, or a trace (default: "
        "Poisson 8 req/s, Azure-conversation-like lognormal lengths, 1000 requests)")
    slo: SLOConfig | None = Field(None, description="latency bounds; adds goodput and SLO "
                                  "attainment to the report")
    output: OutputConfig = Field(OutputConfig(), description="where results go")
    replicas: int = Field(1, ge=1, le=MAX_REPLICAS,
                          description="identical replicas, each of hardware.count GPUs")
    router: RouterConfig = Field(RouterConfig(), description="how a fleet spreads arrivals")
    engine: EngineConfig = Field(EngineConfig(), description="`servesim engine replay` only")
    speculative: SpeculativeConfig = Field(SpeculativeConfig(),
                                           description="speculative decoding")

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        if not NAME_PATTERN.fullmatch(value):
            raise ValueError("must be a plain directory name (it names results/<name>/): up "
                             "to 100 letters, digits, '.', '_' or '-', not starting with '.'")
        return value

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
        longest = limit or model.max_context_tokens
        if self.kv.block_size > longest:
            raise ValueError(f"kv.block_size: {self.kv.block_size} tokens per block exceeds the "
                             f"longest sequence, {longest} tokens (scheduler.max_model_len or "
                             f"{model.name}'s context); use at most that (16 is usual)")
        return self

    @model_validator(mode="after")
    def _work_is_bounded(self) -> Scenario:
        workload = self.workload
        count = workload.num_requests
        if count is not None and count > MAX_REQUESTS:
            raise ValueError(f"workload.num_requests: {count} is more than servesim simulates "
                             f"in one run (at most {MAX_REQUESTS:,}: about an hour and a GB)")
        rate = getattr(workload.arrivals, "rate", None)
        if count is None and workload.duration_s is not None and rate is not None \
                and workload.trace is None and rate * workload.duration_s > MAX_REQUESTS:
            raise ValueError(f"workload.duration_s: {workload.duration_s:g} s at {rate:g} req/s "
                             f"is about {rate * workload.duration_s:.3g} requests, more than "
                             f"servesim simulates in one run (at most {MAX_REQUESTS:,}); "
                             "shorten it or set num_requests")
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
        shown = item if len(item) <= 60 else item[:57] + "..."
        # checked with the whole scenario (validate_scenario), which names the field
        node[leaf] = parse_yaml(text, f"--set {shown!r}: value", check=False)
    return raw


def read_scenario_raw(path: Path) -> dict[str, Any]:
    """A scenario file's mapping, before validation; named after the file unless it says.

    An empty file is an error rather than the quickstart (which would overwrite
    results/quickstart/), and a compare spec is pointed at `servesim compare`.
    """
    raw = read_yaml(path, "scenario")
    if raw is None or raw == {}:
        raise ScenarioError(f"{path}: the scenario file is empty; give at least one field "
                            "(`servesim schema` lists them), or run `servesim run` with no "
                            "file for the built-in quickstart")
    if not isinstance(raw, dict):
        raise ScenarioError(f"{path}: a scenario must be a mapping of fields, "
                            f"got {type(raw).__name__}")
    if "variants" in raw:
        raise ScenarioError(f"{path}: this is a compare spec (it has variants), not a "
                            f"scenario; run it with `servesim compare {path}`")
    if "name" not in raw:
        raw["name"] = re.sub(r"[^A-Za-z0-9._-]", "_", path.stem).lstrip(".")[:100] or "scenario"
    return raw


def load_scenario(path: str | Path | None, overrides: Sequence[str] = ()) -> tuple[Scenario, Path]:
    """Read, override and validate a scenario; returns it and its base folder."""
    if path is None:
        raw: dict[str, Any] = {}
        base_dir = Path.cwd()
    else:
        path = Path(path)
        raw = read_scenario_raw(path)
        base_dir = path.resolve().parent
    if "workload" not in raw:
        # an omitted workload means the default one; `--set workload.x=...` edits it
        raw["workload"] = copy.deepcopy(DEFAULT_WORKLOAD)
    raw = apply_overrides(raw, overrides)
    return validate_scenario(raw, str(path or "default scenario")), base_dir


def validate_scenario(raw: dict[str, Any], source: str) -> Scenario:
    """Validate a raw mapping; every problem becomes one ScenarioError naming `source`."""
    check_plain(raw, source)
    try:
        scenario = Scenario.model_validate(raw)
    except ValidationError as err:
        raise ScenarioError(format_errors(err, source, Scenario)) from None
    try:
        check_tp(scenario.model_spec, scenario.hardware.count)
    except ValueError as err:
        raise ScenarioError(f"{source}: hardware.count: {err}") from None
    return scenario
