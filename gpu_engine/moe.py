"""A top-k mixture-of-experts MLP (Mixtral / Qwen3-MoE routing) for the engine.

The router's softmax over all experts picks the top k per token and renormalises
their weights to sum to one (Mixtral; Qwen3-MoE's norm_topk_prob); each expert is a
SwiGLU. Experts are stacked tensors, gate and up fused as in the dense MLP, and a
step runs each expert once on the tokens routed to it: the distinct experts a batch
touches are exactly what the simulator's roofline reads (sim.config.moe).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sim.config.specs import ModelSpec


class MoE(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, inter, experts = spec.hidden_size, spec.expert_intermediate_size, spec.num_experts
        self.top_k, self.inter = spec.experts_per_token, inter
        self.gate = nn.Linear(h, experts, bias=False)
        self.gate_up_proj = nn.Parameter(torch.empty(experts, 2 * inter, h))
        self.down_proj = nn.Parameter(torch.empty(experts, h, inter))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = F.softmax(self.gate(x).float(), dim=-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        for expert in chosen.unique().tolist():
            rows, slot = (chosen == expert).nonzero(as_tuple=True)
            gate, up = F.linear(x[rows], self.gate_up_proj[expert]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.down_proj[expert])
            out.index_add_(0, rows, y * weights[rows, slot].unsqueeze(-1))
        return out

    @torch.no_grad()
    def init_random(self, gen: torch.Generator, hidden: int, residual_scale: float) -> None:
        self.gate.weight.normal_(0.0, hidden ** -0.5, generator=gen)
        self.gate_up_proj.normal_(0.0, hidden ** -0.5, generator=gen)
        self.down_proj.normal_(0.0, self.inter ** -0.5 * residual_scale, generator=gen)
