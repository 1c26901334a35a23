"""Model and GPU specs, their catalogues, and the capacity math built on them.

Parameter counts are derived from the architecture, never typed in, so a
custom model gets the same arithmetic as a catalogued one. Capacity functions
are pure and per GPU: under tensor parallelism (`tp`) each GPU holds a 1/tp
shard of the matmul weights and of the KV heads (KV heads replicate once tp
exceeds them, as in vLLM).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from sim.core.kv import num_kv_blocks

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192  # vLLM's chunked-prefill token budget on big GPUs
DEFAULT_MAX_NUM_SEQS = 256  # vLLM's default cap on running sequences


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """Llama-3.1 frequency-dependent RoPE scaling; the engine applies it, capacity ignores it."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_context_tokens: int
    rope_type: str = "llama3"


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer (Llama/Qwen/Mistral family, optionally MoE)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_context_tokens: int
    tie_embeddings: bool
    num_experts: int = 1
    experts_per_token: int = 1
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    rms_norm_eps: float = 1e-5
    qkv_bias: bool = False  # Qwen2 carries biases on q/k/v

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty string, got {self.name!r}")
        for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                      "intermediate_size", "vocab_size", "max_context_tokens", "num_experts",
                      "experts_per_token"):
            _check_positive_int(field, getattr(self, field))
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads={self.num_kv_heads} must divide "
                             f"num_heads={self.num_heads}")
        if self.experts_per_token > self.num_experts:
            raise ValueError(f"experts_per_token={self.experts_per_token} must be at most "
                             f"num_experts={self.num_experts}")
        for field in ("rope_theta", "rms_norm_eps"):
            _check_positive(field, getattr(self, field))
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise ValueError(f"rope_scaling must be a RopeScaling or None, "
                             f"got {self.rope_scaling!r}")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def total_params(self) -> int:
        return int(self.num_layers * _layer_params(self, 1, self.num_experts)
                   + _vocab_params(self, 1) + self.hidden_size)

    @property
    def active_params(self) -> int:
        """Parameters one token touches: all but the experts it is not routed to."""
        return int(self.num_layers * _layer_params(self, 1, self.experts_per_token)
                   + _vocab_params(self, 1) + self.hidden_size)


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """One accelerator; bandwidths are per direction, FLOPs are dense (no sparsity)."""

    name: str
    bf16_flops_per_s: float
    memory_bytes: float
    memory_bandwidth_bytes_per_s: float
    interconnect_bandwidth_bytes_per_s: float  # GPU-to-GPU, per GPU, one direction
    host_link_bandwidth_bytes_per_s: float  # PCIe to host, one direction

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty string, got {self.name!r}")
        for f in dataclasses.fields(self)[1:]:
            _check_positive(f.name, getattr(self, f.name))

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity above which a kernel is compute-bound."""
        return self.bf16_flops_per_s / self.memory_bandwidth_bytes_per_s


def _check_positive_int(field: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{field} must be a positive integer, got {value!r}")


def _check_positive(field: str, value: Any) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{field} must be a positive number, got {value!r}")


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """KV heads each GPU stores: a 1/tp share, but at least one (replicated past that)."""
    return max(1, model.num_kv_heads // tp)


def _layer_params(model: ModelSpec, tp: int, experts: float) -> float:
    """One layer's parameters on one GPU with `experts` expert MLPs resident or read."""
    h, q_dim = model.hidden_size, model.num_heads * model.head_dim
    kv_dim = kv_heads_per_gpu(model, tp) * model.head_dim
    attention = 2 * h * q_dim / tp + 2 * h * kv_dim
    if model.qkv_bias:
        attention += q_dim / tp + 2 * kv_dim
    mlp = experts * 3 * h * model.intermediate_size / tp
    router = h * model.num_experts if model.is_moe else 0
    return attention + mlp + router + 2 * h  # two RMSNorms, replicated


def _vocab_params(model: ModelSpec, tp: int) -> float:
    """Embedding plus untied lm_head, vocab-parallel across the tp group."""
    tables = 1 if model.tie_embeddings else 2
    return tables * model.vocab_size * model.hidden_size / tp


def check_tp(model: ModelSpec, tp: int) -> None:
    """Raise unless `tp` shards this model the way vLLM allows."""
    _check_positive_int("tp", tp)
    if model.num_heads % tp:
        raise ValueError(f"tp={tp} must divide num_heads={model.num_heads} of {model.name}")
    if model.num_kv_heads % tp and tp % model.num_kv_heads:
        raise ValueError(f"tp={tp} must divide or be a multiple of "
                         f"num_kv_heads={model.num_kv_heads} of {model.name}")


def weights_bytes(model: ModelSpec, dtype_bytes: float = 2, tp: int = 1) -> float:
    """Resident weights on one GPU (all experts, shards plus replicated norms)."""
    check_tp(model, tp)
    params = (model.num_layers * _layer_params(model, tp, model.num_experts)
              + _vocab_params(model, tp) + model.hidden_size)
    return params * dtype_bytes


def experts_touched(model: ModelSpec, num_tokens: int) -> float:
    """Experts a step reads: min(E, tokens x k), i.e. assumes routing spreads tokens out."""
    return min(model.num_experts, max(num_tokens, 0) * model.experts_per_token)


def weights_read_bytes(model: ModelSpec, num_tokens: int, dtype_bytes: float = 2,
                       tp: int = 1) -> float:
    """Weight bytes one forward step streams from HBM on one GPU.

    Only the experts the step's tokens touch are read, and the embedding table
    is only gathered row by row, so it counts once (as lm_head) when tied and
    not at all otherwise.
    """
    check_tp(model, tp)
    touched = experts_touched(model, max(num_tokens, 1))
    params = (model.num_layers * _layer_params(model, tp, touched)
              + model.vocab_size * model.hidden_size / tp + model.hidden_size)
    return params * dtype_bytes


def expert_weight_bytes(model: ModelSpec, dtype_bytes: float = 2, tp: int = 1) -> float:
    """One expert's MLP across all layers on one GPU (the dense MLP when not MoE)."""
    return model.num_layers * 3 * model.hidden_size * model.intermediate_size / tp * dtype_bytes


def kv_bytes_per_token(model: ModelSpec, dtype_bytes: float = 2, tp: int = 1) -> float:
    """K and V for every layer of one token on one GPU."""
    check_tp(model, tp)
    return 2 * model.num_layers * kv_heads_per_gpu(model, tp) * model.head_dim * dtype_bytes


def linear_flops_per_token(model: ModelSpec, tp: int = 1) -> float:
    """2 x active matmul params per layer stack (lm_head excluded), per GPU."""
    return 2 * model.num_layers * _layer_params(model, tp, model.experts_per_token)


def lm_head_flops_per_seq(model: ModelSpec, tp: int = 1) -> float:
    return 2 * model.vocab_size * model.hidden_size / tp


def attention_flops_per_pair(model: ModelSpec, tp: int = 1) -> float:
    """QK^T plus AV flops for one query attending to one key, all layers, per GPU."""
    return 4 * model.num_layers * model.num_heads * model.head_dim / tp


def flops_per_token(model: ModelSpec, context_tokens: int, tp: int = 1) -> float:
    """One decode token at `context_tokens` of context: matmuls plus attention."""
    check_tp(model, tp)
    return (linear_flops_per_token(model, tp) + lm_head_flops_per_seq(model, tp)
            + attention_flops_per_pair(model, tp) * context_tokens)


def activation_reserve_bytes(model: ModelSpec,
                             max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
                             max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
                             dtype_bytes: float = 2, tp: int = 1) -> float:
    """Peak forward activations that KV must leave room for.

    vLLM sizes this by profiling one forward pass at the full token budget;
    layers run one after another, so only one layer's buffers are live: the
    residual and normed hidden states, q/k/v, attention output, and the MLP's
    gate/up/act buffers, plus fp32 logits and the sampler's probabilities for
    every sequence (gathered to the full vocab on each GPU).
    """
    check_tp(model, tp)
    h = model.hidden_size
    qkv = (model.num_heads // tp + 2 * kv_heads_per_gpu(model, tp)) * model.head_dim
    mlp = 3 * model.intermediate_size * model.experts_per_token / tp
    per_token = (4 * h + qkv + mlp) * dtype_bytes
    logits = 2 * max_num_seqs * model.vocab_size * 4
    return max_num_batched_tokens * per_token + logits


def kv_budget_bytes(model: ModelSpec, hw: HardwareSpec, tp: int = 1,
                    memory_utilization: float = 0.9, activation_reserve: float | None = None,
                    dtype_bytes: float = 2) -> float:
    """GPU memory x utilisation - weights - activation reserve (never negative)."""
    if not 0 < memory_utilization <= 1:
        raise ValueError(f"memory_utilization must be in (0, 1], got {memory_utilization!r}")
    if activation_reserve is None:
        activation_reserve = activation_reserve_bytes(model, dtype_bytes=dtype_bytes, tp=tp)
    free = (hw.memory_bytes * memory_utilization - weights_bytes(model, dtype_bytes, tp)
            - activation_reserve)
    return max(0.0, free)


def _num_blocks(model: ModelSpec, hw: HardwareSpec, tp: int, memory_utilization: float,
                activation_reserve: float | None, dtype_bytes: float, block_size: int) -> int:
    _check_positive_int("block_size", block_size)
    if activation_reserve is None:
        activation_reserve = activation_reserve_bytes(model, dtype_bytes=dtype_bytes, tp=tp)
    kv_budget_bytes(model, hw, tp, memory_utilization, activation_reserve, dtype_bytes)  # checks
    return num_kv_blocks(hw.memory_bytes, memory_utilization, weights_bytes(model, dtype_bytes, tp),
                         activation_reserve, kv_bytes_per_token(model, dtype_bytes, tp), block_size)


def max_kv_tokens(model: ModelSpec, hw: HardwareSpec, tp: int = 1,
                  memory_utilization: float = 0.9, activation_reserve: float | None = None,
                  dtype_bytes: float = 2, block_size: int = 16) -> int:
    """Tokens of KV the budget holds, rounded down to whole blocks."""
    blocks = _num_blocks(model, hw, tp, memory_utilization, activation_reserve, dtype_bytes,
                         block_size)
    return blocks * block_size


def max_concurrency(model: ModelSpec, hw: HardwareSpec, context_tokens: int, tp: int = 1,
                    memory_utilization: float = 0.9, block_size: int = 16,
                    dtype_bytes: float = 2, activation_reserve: float | None = None) -> int:
    """Sequences of `context_tokens` each that fit at once, each owning whole blocks."""
    _check_positive_int("context_tokens", context_tokens)
    blocks = _num_blocks(model, hw, tp, memory_utilization, activation_reserve, dtype_bytes,
                         block_size)
    return blocks // -(-context_tokens // block_size)


def allreduce_time_s(num_bytes: float, tp: int, hw: HardwareSpec) -> float:
    """Ring all-reduce: each GPU sends and receives 2(tp-1)/tp of the buffer."""
    if tp <= 1:
        return 0.0
    return 2 * (tp - 1) / tp * num_bytes / hw.interconnect_bandwidth_bytes_per_s


def decode_step_floor_s(model: ModelSpec, hw: HardwareSpec, batch_size: int,
                        context_tokens: int, tp: int = 1, dtype_bytes: float = 2) -> float:
    """HBM floor of one decode step: weights once plus every sequence's KV."""
    read = (weights_read_bytes(model, batch_size, dtype_bytes, tp)
            + batch_size * context_tokens * kv_bytes_per_token(model, dtype_bytes, tp))
    return read / hw.memory_bandwidth_bytes_per_s


def memory_bound_crossover_batch(model: ModelSpec, hw: HardwareSpec, context_tokens: int,
                                 tp: int = 1, dtype_bytes: float = 2) -> float:
    """Decode batch at which compute time equals HBM time (same formulas as the floor).

    Per sequence, a decode adds flops_per_token of compute and its KV of
    traffic; weights are shared. If each added sequence costs more HBM time
    than compute time (GQA attention at long context), the batch never turns
    compute-bound and this returns inf. Memory capacity is not applied here:
    compare with max_concurrency to see whether the crossover is reachable.
    """
    per_seq_compute_s = flops_per_token(model, context_tokens, tp) / hw.bf16_flops_per_s
    per_seq_kv_s = (context_tokens * kv_bytes_per_token(model, dtype_bytes, tp)
                    / hw.memory_bandwidth_bytes_per_s)
    slope_s = per_seq_compute_s - per_seq_kv_s
    if slope_s <= 0:
        return math.inf
    bw = hw.memory_bandwidth_bytes_per_s
    if model.is_moe:  # while batch x k < E, each sequence also pulls in k more experts
        expert_s = expert_weight_bytes(model, dtype_bytes, tp) / bw
        one_token_s = weights_read_bytes(model, 1, dtype_bytes, tp) / bw
        shared_s = one_token_s - model.experts_per_token * expert_s
        growing_slope_s = slope_s - model.experts_per_token * expert_s
        if growing_slope_s > 0:
            batch = shared_s / growing_slope_s
            if batch * model.experts_per_token < model.num_experts:
                return batch
    return weights_read_bytes(model, 10**9, dtype_bytes, tp) / bw / slope_s


def _llama3(name: str, layers: int, hidden: int, heads: int, intermediate: int,
            context: int, scaling: RopeScaling | None = None) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, 8, hidden // heads, intermediate, 128256,
                     context, False, rope_theta=500000.0, rope_scaling=scaling,
                     rms_norm_eps=1e-5)


def _qwen25(name: str, layers: int, hidden: int, heads: int, kv_heads: int,
            intermediate: int, vocab: int, tie: bool, eps: float) -> ModelSpec:
    # Instruct config.json values (what gets served); base configs advertise 131072 positions.
    return ModelSpec(name, layers, hidden, heads, kv_heads, hidden // heads, intermediate, vocab,
                     32768, tie, rope_theta=1000000.0, rms_norm_eps=eps, qkv_bias=True)


_LLAMA31_SCALING = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                               original_max_context_tokens=8192)

MODELS: Mapping[str, ModelSpec] = MappingProxyType({
    "llama-3-8b": _llama3("llama-3-8b", 32, 4096, 32, 14336, 8192),
    "llama-3-70b": _llama3("llama-3-70b", 80, 8192, 64, 28672, 8192),
    "llama-3.1-8b": _llama3("llama-3.1-8b", 32, 4096, 32, 14336, 131072, _LLAMA31_SCALING),
    "llama-3.1-70b": _llama3("llama-3.1-70b", 80, 8192, 64, 28672, 131072, _LLAMA31_SCALING),
    "llama-3.1-405b": _llama3("llama-3.1-405b", 126, 16384, 128, 53248, 131072,
                              _LLAMA31_SCALING),
    "qwen2.5-1.5b": _qwen25("qwen2.5-1.5b", 28, 1536, 12, 2, 8960, 151936, True, 1e-6),
    "qwen2.5-7b": _qwen25("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, False, 1e-6),
    "qwen2.5-72b": _qwen25("qwen2.5-72b", 80, 8192, 64, 8, 29568, 152064, False, 1e-6),
    # Mistral-7B-v0.3: v0.1's 4096-token sliding window is gone, vocab grew to 32768.
    "mistral-7b": ModelSpec("mistral-7b", 32, 4096, 32, 8, 128, 14336, 32768, 32768, False,
                            rope_theta=1000000.0),
    "mixtral-8x7b": ModelSpec("mixtral-8x7b", 32, 4096, 32, 8, 128, 14336, 32000, 32768, False,
                              num_experts=8, experts_per_token=2, rope_theta=1000000.0),
    # Real shapes are far too slow for CPU engine tests; this one runs in milliseconds.
    "tiny": ModelSpec("tiny", 2, 64, 4, 2, 16, 128, 256, 2048, False),
    # A ~100M-parameter Llama shape: big enough that CPU engine timings mean something.
    "llama-100m": ModelSpec("llama-100m", 12, 768, 12, 4, 64, 2048, 32000, 4096, True,
                            rope_theta=500000.0),
})

_GIB = 1024**3
# Datasheet numbers, dense BF16. HBM capacities are binary (80 GB parts expose ~80 GiB).
# Vendors quote NVLink/Infinity Fabric/PCIe as both directions summed; we store one direction,
# which is what a ring all-reduce or a host copy can use.
HARDWARE: Mapping[str, HardwareSpec] = MappingProxyType({
    "h100-sxm": HardwareSpec("h100-sxm", 989.4e12, 80 * _GIB, 3.35e12, 450e9, 64e9),
    "h100-pcie": HardwareSpec("h100-pcie", 756.0e12, 80 * _GIB, 2.0e12, 300e9, 64e9),
    "h200": HardwareSpec("h200", 989.4e12, 141 * _GIB, 4.8e12, 450e9, 64e9),
    "a100-80gb": HardwareSpec("a100-80gb", 312e12, 80 * _GIB, 2.039e12, 300e9, 32e9),
    # No NVLink: peers talk over PCIe Gen4 x16. GDDR6 with ECC exposes ~48e9 bytes.
    "l40s": HardwareSpec("l40s", 362.05e12, 48e9, 864e9, 32e9, 32e9),
    "b200": HardwareSpec("b200", 2.25e15, 180 * _GIB, 8.0e12, 900e9, 64e9),
    # 7 Infinity Fabric links x 64 GB/s per direction.
    "mi300x": HardwareSpec("mi300x", 1307.4e12, 192 * _GIB, 5.3e12, 448e9, 64e9),
})


def _lookup(kind: str, catalogue: Mapping[str, Any], name: str) -> Any:
    key = str(name).strip().lower()
    if key not in catalogue:
        raise ValueError(f"unknown {kind} {name!r}; known: {', '.join(catalogue)}")
    return catalogue[key]


def get_model(name: str) -> ModelSpec:
    return _lookup("model", MODELS, name)


def get_hardware(name: str) -> HardwareSpec:
    return _lookup("hardware", HARDWARE, name)


_TRUE, _FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


def _coerce(cls_name: str, field: str, kind: str, value: Any) -> Any:
    """Turn a YAML or command-line value into the field's type, or say why not."""
    try:
        if kind == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in _TRUE or text in _FALSE:
                return text in _TRUE
        elif kind == "int":
            number = float(value) if isinstance(value, str) else value
            if not isinstance(number, bool) and float(number).is_integer():
                return int(number)
        elif kind == "float":
            if not isinstance(value, bool):
                return float(value)
        elif kind == "str":
            return str(value)
        elif value is None or isinstance(value, RopeScaling):
            return value
        elif isinstance(value, Mapping):
            return RopeScaling(**value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{cls_name} field {field}={value!r}: {exc}") from None
    raise ValueError(f"{cls_name} field {field}={value!r}: expected {kind}")


def _from_fields(cls: type, catalogue: Mapping[str, Any], fields: Mapping[str, Any]) -> Any:
    fields = dict(fields)
    kinds = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    if "base" in fields:
        base = _lookup(cls.__name__.removesuffix("Spec").lower(), catalogue, fields.pop("base"))
        values = {name: getattr(base, name) for name in kinds}
        if fields and "name" not in fields:
            values["name"] = f"{base.name} (custom)"
    for field, value in fields.items():
        if field not in kinds:
            raise ValueError(f"unknown {cls.__name__} field {field!r}; allowed: "
                             f"{', '.join(kinds)} (and base)")
        values[field] = _coerce(cls.__name__, field, kinds[field], value)
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in values
               and f.default is dataclasses.MISSING]
    if missing:
        raise ValueError(f"{cls.__name__} is missing field(s): {', '.join(missing)}")
    return cls(**values)


def model_from_fields(fields: Mapping[str, Any]) -> ModelSpec:
    """A custom model: every required field, or `base: <catalogue name>` plus overrides."""
    return _from_fields(ModelSpec, MODELS, fields)


def hardware_from_fields(fields: Mapping[str, Any]) -> HardwareSpec:
    """A custom GPU: every field, or `base: <catalogue name>` plus overrides."""
    return _from_fields(HardwareSpec, HARDWARE, fields)
