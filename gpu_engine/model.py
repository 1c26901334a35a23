"""A Llama-architecture decoder built from a `ModelSpec`, running on the paged KV cache.

RMSNorm, rotary embeddings (HF's rotate-half layout, optional Llama-3.1
frequency scaling), grouped-query attention with optional q/k/v biases
(Qwen2), SwiGLU, tied or untied embeddings. q/k/v and gate/up are fused into
one matmul each (fewer, larger kernels); `weights.py` maps them to and from
Hugging Face's separate tensors. The forward takes the packed `StepInputs`
of a step and returns fp32 logits only for the rows that emit a token.

Random weights are scaled so activations stay O(1) through every layer:
projections into a sublayer use std 1/sqrt(fan_in) and the projections back
into the residual stream a further 1/sqrt(2 x layers), so each residual add
is small and the sum over layers stays bounded.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from gpu_engine.attention import PrefillLayout, paged_attention, prefill_layout
from gpu_engine.inputs import StepInputs
from gpu_engine.kv_cache import PagedKVCache
from sim.config.specs import ModelSpec, RopeScaling

_NOISE_STD = 0.02  # random biases, and norm weights' spread around 1


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """Rotary inverse frequencies (head_dim / 2,) float32, with Llama-3.1 scaling if given."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta ** exponents)
    if scaling is None:
        return inv_freq
    if scaling.rope_type != "llama3":
        raise ValueError(f"rope_scaling.rope_type={scaling.rope_type!r} is not supported; "
                         "allowed: llama3")
    old_len = scaling.original_max_context_tokens
    low_freq_wavelen = old_len / scaling.low_freq_factor
    high_freq_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # long wavelengths are slowed by `factor`, short ones kept, the band between blended
    slowed = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = ((old_len / wavelen - scaling.low_freq_factor)
              / (scaling.high_freq_factor - scaling.low_freq_factor))
    blended = (1 - smooth) * slowed / scaling.factor + smooth * slowed
    in_band = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(in_band, blended, slowed)


class Rotary(nn.Module):
    """cos/sin per step from the positions: one small table, no max-context buffers."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.register_buffer("inv_freq", rope_inv_freq(spec.head_dim, spec.rope_theta,
                                                       spec.rope_scaling), persistent=False)

    def reset_buffers(self) -> None:
        """Recompute inv_freq in float32 (after materialising from the meta device)."""
        spec = self.spec
        inv_freq = rope_inv_freq(spec.head_dim, spec.rope_theta, spec.rope_scaling)
        self.inv_freq = inv_freq.to(self.inv_freq.device)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float().unsqueeze(1) * self.inv_freq.float().unsqueeze(0)
        angles = torch.cat((freqs, freqs), dim=-1).unsqueeze(1)  # (T, 1, D)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half convention: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class RMSNorm(nn.Module):
    """Normalised in fp32, cast back before the weight (as HF does, so bf16 matches)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = spec.num_heads, spec.num_kv_heads
        self.head_dim = spec.head_dim
        self.q_dim = spec.num_heads * spec.head_dim
        self.kv_dim = spec.num_kv_heads * spec.head_dim
        self.qkv_proj = nn.Linear(spec.hidden_size, self.q_dim + 2 * self.kv_dim,
                                  bias=spec.qkv_bias)
        self.o_proj = nn.Linear(self.q_dim, spec.hidden_size, bias=False)
        self.scale = 1.0 / math.sqrt(spec.head_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, inputs: StepInputs,
                layout: PrefillLayout | None) -> torch.Tensor:
        tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split((self.q_dim, self.kv_dim, self.kv_dim), dim=-1)
        q = apply_rotary(q.view(tokens, self.num_heads, self.head_dim), cos, sin)
        k = apply_rotary(k.view(tokens, self.num_kv_heads, self.head_dim), cos, sin)
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        out = paged_attention(q, k, v, k_cache, v_cache, inputs, self.scale, layout)
        return self.o_proj(out.reshape(tokens, self.q_dim))


class SwiGLU(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(spec.hidden_size, 2 * spec.intermediate_size, bias=False)
        self.down_proj = nn.Linear(spec.intermediate_size, spec.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = Attention(spec)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = SwiGLU(spec)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, inputs: StepInputs,
                layout: PrefillLayout | None) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, k_cache, v_cache, inputs,
                               layout)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    """The decoder; `forward(inputs, kv)` -> (E, vocab) fp32 logits at inputs.logits_indices."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        if spec.is_moe:
            raise ValueError(f"model {spec.name!r}: mixture-of-experts (num_experts="
                             f"{spec.num_experts}) is not supported by the engine; "
                             "allowed: dense models (num_experts=1)")
        rope_inv_freq(2, spec.rope_theta, spec.rope_scaling)  # reject unknown scaling early
        self.spec = spec
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(spec) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.lm_head = (None if spec.tie_embeddings
                        else nn.Linear(spec.hidden_size, spec.vocab_size, bias=False))
        self.rotary = Rotary(spec)

    @property
    def output_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def weights_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parameters())

    def forward(self, inputs: StepInputs, kv: PagedKVCache) -> torch.Tensor:
        layout = None if inputs.is_decode_only else prefill_layout(inputs)
        h = self.embed_tokens(inputs.token_ids)
        cos, sin = self.rotary(inputs.positions, h.dtype)
        for layer, k_cache, v_cache in zip(self.layers, kv.k, kv.v, strict=True):
            h = layer(h, cos, sin, k_cache, v_cache, inputs, layout)
        h = self.norm(h.index_select(0, inputs.logits_indices))
        return F.linear(h, self.output_weight).float()

    @torch.no_grad()
    def init_random(self, seed: int) -> None:
        """Seeded random weights, drawn on the parameters' own device (fast on CUDA)."""
        spec = self.spec
        device = self.embed_tokens.weight.device
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        residual_scale = 1.0 / math.sqrt(2 * spec.num_layers)
        embed_std = 1.0 / math.sqrt(spec.hidden_size) if self.lm_head is None else 1.0
        self.embed_tokens.weight.normal_(0.0, embed_std, generator=gen)
        norms = [self.norm] + [n for layer in self.layers
                               for n in (layer.input_layernorm, layer.post_attention_layernorm)]
        for norm in norms:
            norm.weight.normal_(1.0, _NOISE_STD, generator=gen)
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            for linear, std in ((attn.qkv_proj, spec.hidden_size ** -0.5),
                                (attn.o_proj, attn.q_dim ** -0.5 * residual_scale),
                                (mlp.gate_up_proj, spec.hidden_size ** -0.5),
                                (mlp.down_proj, spec.intermediate_size ** -0.5
                                 * residual_scale)):
                linear.weight.normal_(0.0, std, generator=gen)
            if attn.qkv_proj.bias is not None:
                attn.qkv_proj.bias.normal_(0.0, _NOISE_STD, generator=gen)
        if self.lm_head is not None:
            self.lm_head.weight.normal_(0.0, spec.hidden_size ** -0.5, generator=gen)
