"""A Llama-architecture decoder built from a `ModelSpec`, running on the paged KV cache.

RMSNorm, rotary embeddings (HF's rotate-half layout, optional Llama-3.1
frequency scaling), grouped-query attention with optional q/k/v biases
(Qwen2) and per-head q/k RMSNorm (Qwen3), sliding-window layers (masked: their
blocks stay allocated), SwiGLU or a top-k mixture of experts (gpu_engine.moe),
tied or untied embeddings. MLA, linear/SSM layers, shared experts and leading
dense layers are refused with the field that needs them. q/k/v and gate/up are fused into
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
from gpu_engine.moe import MoE
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
    def __init__(self, spec: ModelSpec, window: int = 0) -> None:
        super().__init__()
        self.window = window  # 0: full attention
        self.num_heads, self.num_kv_heads = spec.num_heads, spec.num_kv_heads
        self.head_dim = spec.head_dim
        self.q_dim = spec.num_heads * spec.head_dim
        self.kv_dim = spec.num_kv_heads * spec.head_dim
        self.qkv_proj = nn.Linear(spec.hidden_size, self.q_dim + 2 * self.kv_dim,
                                  bias=spec.qkv_bias)
        self.o_proj = nn.Linear(self.q_dim, spec.hidden_size, bias=False)
        self.scale = 1.0 / math.sqrt(spec.head_dim)
        self.q_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps) if spec.qk_norm else None
        self.k_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps) if spec.qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, inputs: StepInputs,
                layout: PrefillLayout | None) -> torch.Tensor:
        tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split((self.q_dim, self.kv_dim, self.kv_dim), dim=-1)
        q = q.view(tokens, self.num_heads, self.head_dim)
        k = k.view(tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        out = paged_attention(q, k, v, k_cache, v_cache, inputs, self.scale, layout,
                              self.window)
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
    def __init__(self, spec: ModelSpec, kind: str = "full") -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = Attention(spec, spec.sliding_window if kind == "sliding" else 0)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp: nn.Module = MoE(spec) if spec.is_moe else SwiGLU(spec)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, inputs: StepInputs,
                layout: PrefillLayout | None) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, k_cache, v_cache, inputs,
                               layout)
        return h + self.mlp(self.post_attention_layernorm(h))


def refuse_unsupported(spec: ModelSpec) -> None:
    """A ValueError naming the first field the engine cannot run."""
    refused = [
        (spec.attention != "gqa", f"attention={spec.attention!r} (multi-head latent "
         "attention)", "gqa"),
        ("linear" in spec.layer_kinds, "layer_types with linear/SSM layers",
         "full and sliding layers"),
        (spec.num_shared_experts > 0, f"num_shared_experts={spec.num_shared_experts}", "0"),
        (spec.first_dense_layers > 0, f"first_dense_layers={spec.first_dense_layers}", "0"),
    ]
    for bad, what, allowed in refused:
        if bad:
            raise ValueError(f"model {spec.name!r}: {what} is not supported by the engine; "
                             f"allowed: {allowed}")


class LlamaModel(nn.Module):
    """The decoder; `forward(inputs, kv)` -> (E, vocab) fp32 logits at inputs.logits_indices."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        refuse_unsupported(spec)
        rope_inv_freq(2, spec.rope_theta, spec.rope_scaling)  # reject unknown scaling early
        self.spec = spec
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(spec, kind) for kind in spec.layer_kinds)
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
                               for n in (layer.input_layernorm, layer.post_attention_layernorm,
                                         layer.self_attn.q_norm, layer.self_attn.k_norm)
                               if n is not None]
        for norm in norms:
            norm.weight.normal_(1.0, _NOISE_STD, generator=gen)
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            attn.qkv_proj.weight.normal_(0.0, spec.hidden_size ** -0.5, generator=gen)
            attn.o_proj.weight.normal_(0.0, attn.q_dim ** -0.5 * residual_scale, generator=gen)
            if isinstance(mlp, MoE):
                mlp.init_random(gen, spec.hidden_size, residual_scale)
            else:
                mlp.gate_up_proj.weight.normal_(0.0, spec.hidden_size ** -0.5, generator=gen)
                mlp.down_proj.weight.normal_(0.0, spec.intermediate_size ** -0.5
                                             * residual_scale, generator=gen)
            if attn.qkv_proj.bias is not None:
                attn.qkv_proj.bias.normal_(0.0, _NOISE_STD, generator=gen)
        if self.lm_head is not None:
            self.lm_head.weight.normal_(0.0, spec.hidden_size ** -0.5, generator=gen)
