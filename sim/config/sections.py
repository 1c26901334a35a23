"""The scenario's sections (pydantic): hardware, scheduler, KV pool, latency, SLOs, output,
engine, router. Each field carries the description `servesim schema` prints.

Why apart from `sim.config.scenario`: these are the leaves a user edits one at a
time; the top-level `Scenario` adds the checks that span several sections.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sim.config.catalogue import (
    get_hardware,
    get_model,
    hardware_from_fields,
    link_from_fields,
    model_from_fields,
)
from sim.config.frontend import Frontend
from sim.config.hardware import HardwareSpec
from sim.config.specs import ModelSpec

# The paged pool keeps a few Python lists of num_blocks entries (~60 bytes a block):
# 10 million blocks is ~600 MB of host memory, far above any GPU's pool (3 million
# 16-token blocks already hold 48M tokens: an "unbounded" pool).
MAX_BLOCKS = 10_000_000


class StrictModel(BaseModel):
    # inf passes ge/le checks but means nothing in a scenario (and breaks int() later)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def resolve_model(value: str | Mapping[str, Any]) -> ModelSpec:
    return get_model(value) if isinstance(value, str) else model_from_fields(value)


def resolve_hardware(value: str | Mapping[str, Any]) -> HardwareSpec:
    return get_hardware(value) if isinstance(value, str) else hardware_from_fields(value)


class HardwareConfig(StrictModel):
    """The GPUs of one replica."""

    gpu: str | dict[str, Any] = Field(
        "h100-sxm", description="catalogue name (`servesim capacity --help` lists them), or a "
        "mapping of HardwareSpec fields, e.g. {base: h100-sxm, memory_gib: 94}")
    count: int = Field(1, ge=1, description="GPUs per replica, used for tensor parallelism "
                       "(split over data_parallel ranks when that is > 1)")
    expert_parallel: int = Field(
        1, ge=1, description="MoE only: GPUs of the replica that share out whole experts "
        "(num_experts / expert_parallel each) instead of a 1/count slice of every expert; "
        "must divide count and num_experts; adds an all-to-all per MoE layer")
    data_parallel: int = Field(
        1, ge=1, description="MoE only: data-parallel attention ranks the count GPUs form "
        "(count / data_parallel GPUs of tensor parallelism each), each with its own "
        "scheduler and KV pool, stepping in lockstep; needs expert_parallel = count "
        "(experts over all GPUs; vLLM's --data-parallel-size with --enable-expert-parallel; "
        "docs/moe_dp_ep.md)")
    memory_utilization: float = Field(
        0.9, gt=0.0, le=1.0, description="share of GPU memory the server may use "
        "(vLLM's gpu_memory_utilization)")
    link: str | dict[str, Any] | None = Field(
        None, description="the GPUs' link to each other, replacing the GPU's own: a link name "
        "(nvlink3/4/5, pcie4, pcie5, infinity-fabric, rdma-400, ...) or a mapping of Link "
        "fields, e.g. {base: nvlink4, latency_s: 2.0e-5} or {kind: pcie, generation: 5, "
        "bandwidth_bytes_per_s: 4.0e10, latency_s: 2.4e-5}; prices the TP all-reduce and "
        "the EP all-to-all (docs/roofline.md, Links)")

    @property
    def tensor_parallel(self) -> int:
        """GPUs of one attention rank: all `count` without data parallelism."""
        return self.count // self.data_parallel

    @model_validator(mode="after")
    def _ranks_split_gpus(self) -> HardwareConfig:
        dp = self.data_parallel
        if dp > 1 and self.count % dp:
            raise ValueError(f"hardware.data_parallel: {dp} ranks must divide hardware.count "
                             f"({self.count} GPUs) into equal tensor-parallel groups")
        if dp > 1 and self.expert_parallel != self.count:
            raise ValueError(f"hardware.expert_parallel: data-parallel ranks spread the experts "
                             f"over all the replica's GPUs, so it must equal hardware.count "
                             f"({self.count}) when data_parallel is {dp}; got "
                             f"{self.expert_parallel}")
        return self

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, value: str | dict[str, Any]) -> str | dict[str, Any]:
        resolve_hardware(value)
        return value

    @field_validator("link")
    @classmethod
    def _known_link(cls, value: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if value is not None:
            link_from_fields(value)
        return value


class SchedulerConfig(StrictModel):
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
    async_scheduling: bool | None = Field(
        None, description="continuous: schedule the next step while the last one runs, from "
        "its outputs as placeholders (vLLM's async scheduling, its default). Default: on for "
        "continuous, except with n-gram speculative decoding or swap preemption (vLLM runs "
        "those synchronously); static and dynamic batching have no async mode")

    @model_validator(mode="after")
    def _async_suits_policy(self) -> SchedulerConfig:
        if self.async_scheduling and self.policy != "continuous":
            raise ValueError(f"scheduler.async_scheduling: true needs policy continuous "
                             f"(request-level batching has no async mode), got policy "
                             f"{self.policy!r}; set it false or omit it")
        return self

    @model_validator(mode="after")
    def _decodes_fit_a_step(self) -> SchedulerConfig:
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be "
                             f">= max_num_seqs ({self.max_num_seqs}) so every decode fits a step")
        return self


class KVConfig(StrictModel):
    """The KV cache pool of one replica."""

    mode: Literal["paged", "contiguous"] | None = Field(
        None, description="default: paged for continuous, contiguous for static and dynamic")
    block_size: int = Field(16, ge=1, description="tokens per KV block")
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
    offload_host_gib: float = Field(
        0.0, ge=0.0, description="prefix_caching only: host memory the prefix cache spills "
        "evicted blocks to (LRU), GiB per replica; a later hit loads them back over the "
        "GPU's host_link (vLLM's CPU offloading; 0 = none)")
    offload_disk_gib: float = Field(
        0.0, ge=0.0, description="a disk tier below the host tier, GiB per replica: the host "
        "tier's LRU drops go down here and load back over offload_disk_link (LMCache's local "
        "disk; 0 = none; needs offload_host_gib)")
    offload_disk_link: str | dict[str, Any] = Field(
        default_factory=lambda: {"kind": "pcie", "generation": 4,
                                 "bandwidth_bytes_per_s": 7.0e9, "latency_s": 1.0e-4},
        description="the disk tier's path to "
        "the GPU: a link name or a mapping of Link fields (default: a PCIe 4 NVMe drive, "
        "7 GB/s, 100 us)")
    offload_load: Literal["sync", "async"] = Field(
        "sync", description="offload-tier loads: sync adds each load to its admitting step; "
        "async delays that request's admission until its blocks land while others run "
        "(vLLM's async KV load)")

    @field_validator("offload_disk_link")
    @classmethod
    def _known_disk_link(cls, value: str | dict[str, Any]) -> str | dict[str, Any]:
        link_from_fields(value)
        return value

    @model_validator(mode="before")
    @classmethod
    def _renamed_dtype_bytes(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "dtype_bytes" in data:
            raise ValueError("dtype_bytes was replaced by the model's weight_dtype and kv_dtype "
                             "(e.g. model: {base: llama-3-8b, weight_dtype: fp8, kv_dtype: fp8}; "
                             "dtypes: bf16, fp16, fp8, fp8-block, int8, int4, mxfp4, nvfp4)")
        return data


class FrontendConfig(StrictModel):
    """What a client waits for besides the engine (sim.config.frontend): the API server, the
    prompt's tokenization, each token's detokenization and stream write. Unset: servesim's
    measured and fitted defaults; all 0: the engine's own latencies."""

    api_server_ms: float | None = Field(
        None, ge=0.0, allow_inf_nan=False, description="HTTP/API server time per request, ms "
        "(default: fitted on real vLLM runs)")
    tokenize_us_per_token: float | None = Field(
        None, ge=0.0, allow_inf_nan=False, description="prompt tokenization, us per prompt "
        "token (default: measured with the shipped tokenizers)")
    detokenize_us_per_token: float | None = Field(
        None, ge=0.0, allow_inf_nan=False, description="incremental detokenization, us per "
        "output token (default: measured)")
    stream_us_per_token: float | None = Field(
        None, ge=0.0, allow_inf_nan=False, description="writing one streamed chunk, us per "
        "output token (default: measured)")

    def value(self) -> Frontend:
        """The Frontend these settings give (unset fields: the defaults)."""
        base = Frontend()
        return Frontend(
            base.api_server_s if self.api_server_ms is None else self.api_server_ms / 1e3,
            base.tokenize_s_per_token if self.tokenize_us_per_token is None
            else self.tokenize_us_per_token / 1e6,
            base.detokenize_s_per_token if self.detokenize_us_per_token is None
            else self.detokenize_us_per_token / 1e6,
            base.stream_s_per_token if self.stream_us_per_token is None
            else self.stream_us_per_token / 1e6)


class LatencyConfig(StrictModel):
    """roofline: from the model and GPU specs (the knobs below tune it); table: a fitted
    calibration table directory (`servesim calibrate fit`), `path` relative to the scenario;
    fixed: every step takes step_ms (queueing-theory checks, what-ifs)."""

    model: Literal["roofline", "table", "fixed"] = Field(
        "roofline", description="roofline: step time from FLOPs and bytes, needs no "
        "calibration; table: a fitted calibration table; fixed: every step takes step_ms")
    step_ms: float | None = Field(None, gt=0.0, description="fixed: the time of every step")
    path: str | None = Field(None, min_length=1, description="table: the calibration table "
                             "directory, relative to the scenario file")
    step_overhead_ms: float | None = Field(
        None, ge=0.0, description="host (CPU) time per step, ms: "
        "roofline default the GPU family's fit; table default the table's own CPU term "
        "(an imported table's metadata), else 0")
    seq_overhead_ms: float | None = Field(
        None, ge=0.0, description="host (CPU) time per sequence in a "
        "step, ms; defaults as step_overhead_ms")
    compute_efficiency: float | None = Field(
        None, gt=0.0, le=1.0, description="roofline: share of dense peak FLOP/s a large GEMM "
        "reaches (default: the GPU family's fit, ~0.7)")
    bandwidth_efficiency: float | None = Field(
        None, gt=0.0, le=1.0, description="roofline: share of memory bandwidth a GEMM's "
        "weight read reaches (default: the GPU family's fit, 0.91-0.95)")
    host_serial_share: float | None = Field(
        None, ge=0.0, le=1.0, description="roofline under async scheduling: the share of the "
        "host's time per step still serial with the GPU; the rest overlaps the GPU (default: "
        "the fit on real vLLM runs, calibrate.fit_serving; synchronous scheduling: 1)")

    def problem(self) -> str | None:
        """A 'latency.<field>: why' message when the options do not suit `model`."""
        if self.model == "fixed":
            if self.step_ms is None:
                return "latency.step_ms: model fixed needs the time of every step, in ms (> 0)"
            tuning = [k for k in ("step_overhead_ms", "seq_overhead_ms", "compute_efficiency",
                                  "bandwidth_efficiency", "host_serial_share")
                      if getattr(self, k) is not None]
            if tuning or self.path is not None:
                field = tuning[0] if tuning else "path"
                return (f"latency.{field}: does not apply to model fixed (every step takes "
                        f"step_ms)")
            return None
        if self.step_ms is not None:
            return (f"latency.step_ms: only model fixed reads it, got model {self.model!r}")
        if self.model == "table":
            if self.path is None:
                return ("latency.path: model table needs the calibration table directory "
                        "(relative to the scenario file)")
            knobs = [k for k in ("compute_efficiency", "bandwidth_efficiency", "host_serial_share")
                     if getattr(self, k) is not None]
            if knobs:
                return (f"latency.{knobs[0]}: tunes the roofline model only; a table brings "
                        f"its own fitted coefficients (got model table)")
        elif self.path is not None:
            return (f"latency.path: only model table reads a table directory, got model "
                    f"{self.model!r} with path {self.path!r}")
        return None


class SLOConfig(StrictModel):
    """Service-level objectives: a request meets them only if it meets every bound given."""

    ttft_ms: float | None = Field(None, gt=0.0, description="time to first token bound")
    tpot_ms: float | None = Field(None, gt=0.0, description="time per output token bound "
                                  "(after the first)")
    e2el_ms: float | None = Field(None, gt=0.0, description="end-to-end latency bound")


class OutputConfig(StrictModel):
    """Where `servesim run` writes its files."""

    dir: str | None = Field(None, description="default: results/<name> (plus the --set "
                            "overrides, if any); `--out DIR` overrides")
    plots: bool = Field(True, description="write PNG plots; `--no-plots` skips them")


class SamplingConfig(StrictModel):
    """The engine's sampler; the simulator's outputs are scripted, so it ignores this."""

    temperature: float = Field(0.0, ge=0.0, description="0 = greedy")
    top_k: int = Field(0, ge=0, description="0 = off")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="1 = off")


class EngineConfig(StrictModel):
    """How the deployment's engine runs: `servesim engine replay` reads every field; the
    simulator reads `cuda_graphs` (decode steps padded to graph sizes) with `device`."""

    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda if present")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto = bfloat16 on cuda, float32 on cpu")
    weights: str | None = Field(
        None, description="a local Hugging Face directory (config.json + safetensors); "
        "null = random weights of the model's real shapes")
    seed: int | None = Field(None, ge=0, description="weights and synthetic prompts; "
                             "null = the scenario's seed")
    cuda_graphs: bool | None = Field(
        None, description="replay decode-only steps from CUDA graphs, each batch padded up to "
        "a captured size (sim.core.batching): the engine runs the padding and the simulator's "
        "plans and latency models count it; null = on for a GPU (vLLM's default), off where "
        "the engine runs on a CPU (engine.device cpu, or auto without CUDA)")
    cpu_threads: int | None = Field(
        None, ge=1, description="torch's intra-op threads on the CPU; null = torch's default. "
        "1 keeps a small model's steps steady when other work shares the cores")
    warmup: bool = Field(True, description="run a few steps before the first arrival")
    sampling: SamplingConfig = Field(SamplingConfig(), description="the engine's sampler")

    def uses_cuda_graphs(self, device: str | None = None) -> bool:
        """Whether decode steps replay CUDA graphs on `device` ("cpu" or "cuda"; None = this
        section's `device`, where "auto" is a GPU: a simulated deployment's default)."""
        if self.cuda_graphs is not None:
            return self.cuda_graphs
        return (device or self.device) != "cpu"


class RouterConfig(StrictModel):
    """How a fleet (replicas > 1) spreads arrivals; see sim.world.router for each policy."""

    policy: Literal["round_robin", "least_outstanding", "least_kv", "power_of_two",
                    "prefix_aware"] = Field(
        "round_robin", description="round_robin, least_outstanding (fewest requests in "
        "flight), least_kv (most free KV), power_of_two (the less loaded of two random), "
        "prefix_aware (where the prompt's prefix is cached, within load_limit)")
    load_limit: float = Field(
        1.5, ge=1.0, description="prefix_aware: only replicas with outstanding requests <= "
        "load_limit x the fleet mean + 1 are candidates (>= 1 keeps the least-loaded one "
        "eligible)")

