"""The scenario schema's top level: one simulated deployment, and the checks across sections.

The schema's defaults are themselves a sensible scenario (Llama-3-8B on one
H100 under moderate Poisson load), so `servesim run` with no file runs it.
Every field carries a description: `servesim schema` prints them. Reading a
file, `--set` overrides and the error text are `sim.config.loader`,
`sim.config.yaml_input` and `sim.config.error_text`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from pydantic import Field, field_validator, model_validator

from sim.config.catalogue import link_from_fields
from sim.config.checks import MAX_SPAN_S
from sim.config.data_parallel import check_data_parallel, check_no_dp_pools
from sim.config.disaggregation import DisaggregationConfig
from sim.config.hardware import HardwareSpec
from sim.config.sections import (
    EngineConfig,
    FrontendConfig,
    HardwareConfig,
    KVConfig,
    LatencyConfig,
    OutputConfig,
    RouterConfig,
    SchedulerConfig,
    SLOConfig,
    StrictModel,
    resolve_hardware,
    resolve_model,
)
from sim.config.specs import ModelSpec, check_ep, check_tp
from sim.config.speculative import SpeculativeConfig
from sim.config.workload import WorkloadConfig
from sim.core.schedulers import POLICIES, resolve_async_scheduling

# Recorded in every summary.json; bumped when a field is renamed or removed or changes meaning.
SCHEMA_VERSION = 1
# The simulator runs a few thousand requests per second on a laptop core and keeps
# ~100 bytes per request (plus a requests.csv row): 10 million is about an hour and
# a gigabyte. Beyond that a run is a mistake (a 30-digit count ran 10 minutes and
# wrote nothing); a steady-state estimate needs far fewer.
MAX_REQUESTS = 10_000_000
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


class Scenario(StrictModel):
    """One simulated deployment: model, GPUs, scheduler, KV pool, latency model, workload."""

    name: str = Field("quickstart", description="names results/<name>/: letters, digits, "
                      ". _ -, not starting with '.' (default in a file: the file's name)")
    description: str = Field("", description="free text, for people")
    seed: int = Field(0, ge=0, description="same file + same seed = the same run, request for "
                      "request")
    model: str | dict[str, Any] = Field(
        "llama-3-8b", description="catalogue name (`servesim capacity --help`), or a mapping "
        "of ModelSpec fields, e.g. {base: llama-3-8b, num_layers: 40}, or a Hugging Face "
        "config.json with overrides, e.g. {config: builtin:gpt-oss-120b, kv_dtype: fp8} "
        "(a path is relative to the scenario); dtypes: weight_dtype, expert_dtype, kv_dtype")
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
    engine: EngineConfig = Field(EngineConfig(), description="the engine: `servesim engine "
                                 "replay` reads it; the simulator its cuda_graphs")
    speculative: SpeculativeConfig = Field(SpeculativeConfig(),
                                           description="speculative decoding")
    frontend: FrontendConfig = Field(FrontendConfig(), description="what a client waits for "
                                     "besides the engine: API server, tokenizer, stream")
    disaggregation: DisaggregationConfig | None = Field(
        None, description="prefill/decode disaggregation: a prefill pool, a decode pool and "
        "the link the prompt's KV crosses (sim.world.disaggregated); replaces `replicas`")

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
    def _expert_parallel_suits_model(self) -> Scenario:
        hw = self.hardware
        field = "data_parallel" if hw.data_parallel > 1 else "expert_parallel"
        try:
            check_ep(self.model_spec, hw.tensor_parallel, hw.expert_parallel, hw.data_parallel)
        except ValueError as err:
            raise ValueError(f"hardware.{field}: {err}") from None
        check_no_dp_pools(self)
        if hw.data_parallel > 1:
            check_data_parallel(self)
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
        if workload.duration_s is not None and workload.duration_s > MAX_SPAN_S:
            raise ValueError(f"workload.duration_s: {workload.duration_s:.3g} s is longer than "
                             f"servesim simulates (at most {MAX_SPAN_S:.0e} s, about 3 years)")
        if count is not None and rate is not None and count / rate > MAX_SPAN_S:
            raise ValueError(f"workload.arrivals.rate: {rate:.3g} req/s spreads {count} "
                             f"requests over about {count / rate:.3g} s, longer than servesim "
                             f"simulates (at most {MAX_SPAN_S:.0e} s, about 3 years); raise "
                             "the rate")
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
    def _async_scheduling_suits(self) -> Scenario:
        """Explicit async scheduling where it cannot run, and the overlap's share without it,
        are errors here, naming the field (resolve_async_scheduling says why)."""
        cfg = self.scheduler
        method = "ngram" if self.speculative.draft_spec is None else "draft_model"
        resolved = resolve_async_scheduling(cfg.async_scheduling, cfg.policy, cfg.preemption,
                                            self.speculative.num_tokens, method)
        if not resolved and self.latency.host_serial_share is not None:
            raise ValueError(f"latency.host_serial_share: applies under async scheduling, "
                             f"which this scenario runs without (got "
                             f"{self.latency.host_serial_share}); remove it, or set "
                             "scheduler.async_scheduling true where it is allowed")
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
    def model_notes(self) -> tuple[str, ...]:
        """What a `model: {config: ...}` config.json holds that servesim does not model."""
        if isinstance(self.model, dict) and "config" in self.model:
            from sim.config.hf_config import read_hf_config

            return read_hf_config(self.model["config"]).notes
        return ()

    @property
    def hardware_spec(self) -> HardwareSpec:
        spec = resolve_hardware(self.hardware.gpu)
        if self.hardware.link is None:
            return spec
        return dataclasses.replace(spec, link=link_from_fields(self.hardware.link))
