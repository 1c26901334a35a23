"""ModelSpec: the model every cost formula and every world is built from, and its counts.

The GPU it runs on is `sim.config.hardware.HardwareSpec`. Parameter counts are derived
from the architecture, never typed in, so a custom model gets the same arithmetic as a
catalogued one (the catalogue of known models and GPUs is `sim.config.catalogue`, the
formulas over them `sim.config.costs`, a Hugging Face config.json read into one
`sim.config.hf_config`). Under tensor parallelism (`tp`) each GPU holds a 1/tp shard of
the matmul weights and of the KV heads (KV heads replicate once tp exceeds them, as in
vLLM); MLA's latent is replicated whole.

A model carries how it is stored: `weight_dtype` for its matmul weights,
`expert_dtype` for its routed experts (gpt-oss keeps attention in bf16 and
experts in MXFP4) and `kv_dtype` for its KV cache (vLLM's kv_cache_dtype);
embeddings, norms and routers stay in bf16 when the weights are quantised.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sim.config.checks import (
    MAX_DIMENSION,
    MAX_LAYERS,
    check_non_negative_int,
    check_positive,
    check_positive_int,
)
from sim.config.dtypes import DType, carrier_dtype, get_dtype

ATTENTION_KINDS = ("gqa", "mla")
# full: KV grows with the context; sliding: KV stops at sliding_window tokens;
# linear: a linear-attention or state-space layer holding a constant state per sequence
LAYER_KINDS = ("full", "sliding", "linear")

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
    weight_dtype: str = "bf16"
    expert_dtype: str = ""  # "" = weight_dtype
    kv_dtype: str = "bf16"
    moe_intermediate_size: int = 0  # one expert's MLP width; 0 = intermediate_size
    num_shared_experts: int = 0  # experts every token runs (DeepSeek-V3: 1)
    first_dense_layers: int = 0  # leading layers with a dense MLP (DeepSeek-V3: 3)
    attention: str = "gqa"  # gqa (MHA/GQA/MQA) or mla (multi-head latent attention)
    q_lora_rank: int = 0  # mla: 0 = q projected directly
    kv_lora_rank: int = 0  # mla: the cached latent's width
    qk_rope_head_dim: int = 0  # mla: the cached rope key's width
    qk_nope_head_dim: int = 0  # mla
    v_head_dim: int = 0  # mla
    sliding_window: int = 0  # tokens a sliding layer attends to (0: none)
    layer_types: tuple[str, ...] = ()  # one of LAYER_KINDS per layer; () = all full
    linear_state_elements: int = 0  # per linear layer and sequence, whole model
    qk_norm: bool = False  # Qwen3 / Gemma-3: RMSNorm on q and k per head
    routing_skew: float = 0.0  # Zipf exponent of expert popularity (0 = uniform routing)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty string, got {self.name!r}")
        for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                      "intermediate_size", "vocab_size", "max_context_tokens", "num_experts",
                      "experts_per_token"):
            check_positive_int(field, getattr(self, field),
                               MAX_LAYERS if field == "num_layers" else MAX_DIMENSION)
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
        for field in ("weight_dtype", "kv_dtype") + (("expert_dtype",) if self.expert_dtype
                                                      else ()):
            try:
                get_dtype(getattr(self, field))
            except ValueError as err:
                raise ValueError(f"{field}: {err}") from None
        for field in ("moe_intermediate_size", "num_shared_experts", "first_dense_layers",
                      "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                      "v_head_dim", "sliding_window", "linear_state_elements"):
            check_non_negative_int(field, getattr(self, field))
        if not (isinstance(self.routing_skew, int | float) and 0 <= self.routing_skew < 100):
            raise ValueError(f"routing_skew must be in [0, 100), got {self.routing_skew!r}")
        if self.first_dense_layers > self.num_layers:
            raise ValueError(f"first_dense_layers={self.first_dense_layers} must be at most "
                             f"num_layers={self.num_layers}")
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION_KINDS)}, "
                             f"got {self.attention!r}")
        if self.attention == "mla" and not (self.kv_lora_rank and self.qk_rope_head_dim
                                            and self.qk_nope_head_dim and self.v_head_dim):
            raise ValueError("attention mla needs kv_lora_rank, qk_rope_head_dim, "
                             "qk_nope_head_dim and v_head_dim (positive)")
        self._check_layer_types()

    def _check_layer_types(self) -> None:
        kinds = self.layer_types
        if not isinstance(kinds, tuple) or (kinds and len(kinds) != self.num_layers):
            raise ValueError(f"layer_types must list one kind per layer ({self.num_layers}), "
                             f"got {kinds!r}")
        unknown = sorted({k for k in kinds if k not in LAYER_KINDS})
        if unknown:
            raise ValueError(f"layer_types: unknown kind(s) {', '.join(map(repr, unknown))}; "
                             f"allowed: {', '.join(LAYER_KINDS)}")
        if kinds and "full" not in kinds and "sliding" not in kinds:
            raise ValueError("layer_types needs at least one full or sliding attention layer")
        if "sliding" in kinds and not self.sliding_window:
            raise ValueError("layer_types has sliding layers but sliding_window is 0")
        if "linear" in kinds and not self.linear_state_elements:
            raise ValueError("layer_types has linear layers but linear_state_elements is 0")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def weights(self) -> DType:
        return get_dtype(self.weight_dtype)

    @property
    def experts(self) -> DType:
        return get_dtype(self.expert_dtype or self.weight_dtype)

    @property
    def kv(self) -> DType:
        return get_dtype(self.kv_dtype)

    @property
    def carrier(self) -> DType:
        """Embeddings, norms, routers and activations: bf16 unless the weights are 32-bit."""
        return carrier_dtype(self.weights)

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        return self.layer_types or ("full",) * self.num_layers

    @property
    def expert_intermediate_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is routed experts (all but the leading dense ones)."""
        return self.num_layers - self.first_dense_layers if self.is_moe else 0

    @property
    def total_params(self) -> int:
        return int(sum(params_by_part(self, 1, self.num_experts).values()))

    @property
    def active_params(self) -> int:
        """Parameters one token touches: all but the experts it is not routed to."""
        return int(sum(params_by_part(self, 1, self.experts_per_token).values()))


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """KV heads each GPU stores: a 1/tp share, but at least one (replicated past that)."""
    return max(1, model.num_kv_heads // tp)


def attention_params(model: ModelSpec, tp: int) -> float:
    """One layer's attention projections on one GPU.

    MLA (DeepSeek-V2/V3): q through an optional low-rank q_a/q_b pair, one shared
    kv_a projection to the latent plus the rope key (replicated, as in vLLM), kv_b up to
    every head's nope key and value, and o_proj; the two latent norms are counted here.
    """
    h = model.hidden_size
    if model.attention == "mla":
        heads = model.num_heads / tp
        qk_head = model.qk_nope_head_dim + model.qk_rope_head_dim
        rank = model.q_lora_rank
        q = (h * rank + rank + rank * heads * qk_head) if rank else h * heads * qk_head
        kv_a = h * (model.kv_lora_rank + model.qk_rope_head_dim) + model.kv_lora_rank
        kv_b = model.kv_lora_rank * heads * (model.qk_nope_head_dim + model.v_head_dim)
        return q + kv_a + kv_b + heads * model.v_head_dim * h
    q_dim = model.num_heads * model.head_dim
    kv_dim = kv_heads_per_gpu(model, tp) * model.head_dim
    params = 2 * h * q_dim / tp + 2 * h * kv_dim
    if model.qkv_bias:
        params += q_dim / tp + 2 * kv_dim
    if model.qk_norm:
        params += 2 * model.head_dim
    return params


def expert_params(model: ModelSpec, tp: int) -> float:
    """One expert's gate, up and down matrices in one layer on one GPU."""
    return 3 * model.hidden_size * model.expert_intermediate_size / tp


def params_by_part(model: ModelSpec, tp: int, experts: float, ep: int = 1) -> dict[str, float]:
    """Parameters on one GPU by how they are stored, with `experts` routed experts per MoE
    layer resident or read: "weights" (attention, dense MLPs, shared experts) in
    weight_dtype, "experts" in expert_dtype, "carrier" (norms, routers, the final norm) in
    bf16, "vocab" (embedding and untied lm_head) in bf16 too. Under expert parallelism
    (ep > 1) a GPU's `experts` are whole; under tp each is a 1/tp slice."""
    h, moe = model.hidden_size, model.moe_layers
    dense = model.num_layers - moe
    weights = (model.num_layers * attention_params(model, tp)
               + dense * 3 * h * model.intermediate_size / tp
               + moe * model.num_shared_experts * expert_params(model, tp))
    return {
        "weights": weights,
        "experts": moe * experts * expert_params(model, 1 if ep > 1 else tp),
        "carrier": model.num_layers * 2 * h + moe * h * model.num_experts + h,
        "vocab": vocab_params(model, tp),
    }


def part_bytes(model: ModelSpec) -> dict[str, float]:
    """Bytes per parameter of each part of params_by_part."""
    carrier = model.carrier.bytes_per_element
    return {"weights": model.weights.bytes_per_element,
            "experts": model.experts.bytes_per_element, "carrier": carrier, "vocab": carrier}


def vocab_params(model: ModelSpec, tp: int) -> float:
    """Embedding plus untied lm_head, vocab-parallel across the tp group."""
    tables = 1 if model.tie_embeddings else 2
    return tables * model.vocab_size * model.hidden_size / tp


def check_tp(model: ModelSpec, tp: int) -> None:
    """Raise unless `tp` shards this model the way vLLM allows."""
    check_positive_int("tp", tp)
    if model.num_heads % tp:
        raise ValueError(f"tp={tp} must divide num_heads={model.num_heads} of {model.name}")
    if model.attention == "gqa" and model.num_kv_heads % tp and tp % model.num_kv_heads:
        raise ValueError(f"tp={tp} must divide or be a multiple of "
                         f"num_kv_heads={model.num_kv_heads} of {model.name}")


def check_ep(model: ModelSpec, tp: int, ep: int, dp: int = 1) -> None:
    """Raise unless `ep` GPUs can each hold num_experts / ep whole experts: GPUs of the tp
    group, or with `dp` > 1 data-parallel attention ranks of tp GPUs each, all dp x tp of
    them (vLLM's --data-parallel-size with --enable-expert-parallel)."""
    check_positive_int("ep", ep)
    check_positive_int("dp", dp)
    if dp > 1:
        if not model.is_moe:
            raise ValueError(f"dp={dp}: data-parallel attention ranks share out the experts "
                             f"of a mixture-of-experts model, and {model.name} is dense "
                             "(serve a dense model on replicas instead)")
        if ep != dp * tp:
            raise ValueError(f"ep={ep} must be dp x tp = {dp * tp}: data-parallel ranks "
                             "spread the experts over all their GPUs")
    if ep == 1:
        return
    if not model.is_moe:
        raise ValueError(f"ep={ep}: expert parallelism needs a mixture-of-experts model, and "
                         f"{model.name} is dense")
    if model.num_experts % ep or (dp * tp) % ep:
        raise ValueError(f"ep={ep} must divide num_experts={model.num_experts} of "
                         f"{model.name} and the {dp * tp} GPUs")


def stored_as(model: ModelSpec, dtype: str) -> ModelSpec:
    """The model with weights, experts and KV all in `dtype` (a dtype name, or a torch
    name such as float32): what the engine holds when it runs in one torch dtype."""
    name = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype)
    return dataclasses.replace(model, weight_dtype=name, expert_dtype="", kv_dtype=name)
