"""KV cache bytes per attention kind: pure functions, per GPU.

Why per kind: the GQA formula (2 x layers x kv_heads x head_dim x bytes per token) is
wrong for the models served today.
- MLA (DeepSeek-V2/V3, Kimi-K2) caches one compressed latent plus one rope key per layer
  and token: (kv_lora_rank + qk_rope_head_dim) x bytes. Every GPU of a tensor-parallel
  group holds the whole latent (as in vLLM), so it is not divided by tp.
- A sliding-window layer (gpt-oss, Gemma-2/3, Mistral-7B-v0.1) keeps only the last
  `sliding_window` tokens: min(context, window).
- A linear-attention or state-space layer (Qwen3-Next, Jamba, Nemotron-H) holds a
  constant state per sequence, whatever the context.
A model mixes them layer by layer (`ModelSpec.layer_types`).

The simulator's paged pool prices every token at `kv_bytes_per_token` (full and sliding
layers alike): it does not yet free the blocks that leave a sliding window, as vLLM's
hybrid KV-cache manager does, so for sliding-window models it holds fewer sequences than
vLLM would. The capacity sheet's `max_concurrency` uses the exact per-sequence bytes.
"""

from __future__ import annotations

from sim.config.specs import ModelSpec, check_tp, kv_heads_per_gpu


def gqa_layer_bytes_per_token(kv_heads: int, head_dim: int, dtype_bytes: float) -> float:
    """One layer's K and V of one token (MHA, GQA and MQA alike)."""
    return 2 * kv_heads * head_dim * dtype_bytes


def mla_layer_bytes_per_token(kv_lora_rank: int, qk_rope_head_dim: int,
                              dtype_bytes: float) -> float:
    """One layer's latent plus rope key of one token; the same on every GPU."""
    return (kv_lora_rank + qk_rope_head_dim) * dtype_bytes


def window_tokens(context_tokens: int, window_tokens: int) -> int:
    """Tokens a sliding-window layer keeps: min(context, window)."""
    return min(context_tokens, window_tokens)


def layer_bytes_per_token(model: ModelSpec, tp: int = 1) -> float:
    """One attention layer's KV for one token on one GPU."""
    check_tp(model, tp)
    dtype = model.kv.bytes_per_element
    if model.attention == "mla":
        return mla_layer_bytes_per_token(model.kv_lora_rank, model.qk_rope_head_dim, dtype)
    return gqa_layer_bytes_per_token(kv_heads_per_gpu(model, tp), model.head_dim, dtype)


def layer_counts(model: ModelSpec) -> dict[str, int]:
    """How many layers of each kind (full, sliding, linear)."""
    kinds = model.layer_kinds
    return {kind: kinds.count(kind) for kind in ("full", "sliding", "linear")}


def kv_bytes_per_token(model: ModelSpec, tp: int = 1) -> float:
    """KV one token adds on one GPU while it is inside every window: full and sliding
    layers (linear layers add nothing per token)."""
    counts = layer_counts(model)
    return (counts["full"] + counts["sliding"]) * layer_bytes_per_token(model, tp)


def linear_state_bytes(model: ModelSpec, tp: int = 1) -> float:
    """The constant state of one sequence's linear/SSM layers on one GPU (heads split by tp)."""
    check_tp(model, tp)
    return (layer_counts(model)["linear"] * model.linear_state_elements / tp
            * model.kv.bytes_per_element)


def _blocks_tokens(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size) * block_size


def kv_bytes_per_sequence(model: ModelSpec, context_tokens: int, tp: int = 1,
                          block_size: int = 1) -> float:
    """One sequence's cache at `context_tokens` on one GPU, each layer group in whole blocks:
    full layers hold every token, sliding layers min(context, window), linear layers their
    constant state."""
    counts, per_layer = layer_counts(model), layer_bytes_per_token(model, tp)
    full = counts["full"] * _blocks_tokens(context_tokens, block_size)
    window = window_tokens(context_tokens, model.sliding_window or context_tokens)
    sliding = counts["sliding"] * _blocks_tokens(window, block_size)
    return (full + sliding) * per_layer + linear_state_bytes(model, tp)


def attended_tokens(model: ModelSpec, context_tokens: float, sequences: int) -> float:
    """Context tokens the average layer attends to over `sequences` sequences whose contexts
    sum to `context_tokens`: sliding layers see at most `sliding_window` each."""
    counts = layer_counts(model)
    attending = counts["full"] + counts["sliding"]
    if not counts["sliding"] or not attending:
        return context_tokens
    capped = min(context_tokens, sequences * model.sliding_window)
    return (counts["full"] * context_tokens + counts["sliding"] * capped) / attending
