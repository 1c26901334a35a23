"""Model and GPU specs: the two values every cost formula and every world is built from.

Parameter counts are derived from the architecture, never typed in, so a
custom model gets the same arithmetic as a catalogued one (the catalogue of
known models and GPUs is `sim.config.catalogue`, the formulas over them
`sim.config.costs`). Under tensor parallelism (`tp`) each GPU holds a 1/tp
shard of the matmul weights and of the KV heads (KV heads replicate once tp
exceeds them, as in vLLM).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any


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
            check_positive_int(field, getattr(self, field))
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads={self.num_kv_heads} must divide "
                             f"num_heads={self.num_heads}")
        if self.experts_per_token > self.num_experts:
            raise ValueError(f"experts_per_token={self.experts_per_token} must be at most "
                             f"num_experts={self.num_experts}")
        for field in ("rope_theta", "rms_norm_eps"):
            check_positive(field, getattr(self, field))
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise ValueError(f"rope_scaling must be a RopeScaling or None, "
                             f"got {self.rope_scaling!r}")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def total_params(self) -> int:
        return int(self.num_layers * layer_params(self, 1, self.num_experts)
                   + vocab_params(self, 1) + self.hidden_size)

    @property
    def active_params(self) -> int:
        """Parameters one token touches: all but the experts it is not routed to."""
        return int(self.num_layers * layer_params(self, 1, self.experts_per_token)
                   + vocab_params(self, 1) + self.hidden_size)


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
            check_positive(f.name, getattr(self, f.name))

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity above which a kernel is compute-bound."""
        return self.bf16_flops_per_s / self.memory_bandwidth_bytes_per_s


def check_positive_int(field: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{field} must be a positive integer, got {value!r}")


def check_positive(field: str, value: Any) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{field} must be a positive number, got {value!r}")


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """KV heads each GPU stores: a 1/tp share, but at least one (replicated past that)."""
    return max(1, model.num_kv_heads // tp)


def layer_params(model: ModelSpec, tp: int, experts: float) -> float:
    """One layer's parameters on one GPU with `experts` expert MLPs resident or read."""
    h, q_dim = model.hidden_size, model.num_heads * model.head_dim
    kv_dim = kv_heads_per_gpu(model, tp) * model.head_dim
    attention = 2 * h * q_dim / tp + 2 * h * kv_dim
    if model.qkv_bias:
        attention += q_dim / tp + 2 * kv_dim
    mlp = experts * 3 * h * model.intermediate_size / tp
    router = h * model.num_experts if model.is_moe else 0
    return attention + mlp + router + 2 * h  # two RMSNorms, replicated


def vocab_params(model: ModelSpec, tp: int) -> float:
    """Embedding plus untied lm_head, vocab-parallel across the tp group."""
    tables = 1 if model.tie_embeddings else 2
    return tables * model.vocab_size * model.hidden_size / tp


def check_tp(model: ModelSpec, tp: int) -> None:
    """Raise unless `tp` shards this model the way vLLM allows."""
    check_positive_int("tp", tp)
    if model.num_heads % tp:
        raise ValueError(f"tp={tp} must divide num_heads={model.num_heads} of {model.name}")
    if model.num_kv_heads % tp and tp % model.num_kv_heads:
        raise ValueError(f"tp={tp} must divide or be a multiple of "
                         f"num_kv_heads={model.num_kv_heads} of {model.name}")


