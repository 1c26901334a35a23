"""Mixture-of-experts arithmetic: how many distinct experts a step touches, and what
expert parallelism moves between GPUs. Pure functions.

Why a closed form: a step's weight reads depend on the distinct experts its tokens
route to, not on tokens x k. Under uniform routing each of B tokens picks k of E
experts, so an expert is missed by one token with probability 1 - k/E and by all of
them with (1 - k/E)^B: E (1 - (1 - k/E)^B) experts are touched in expectation. Real
routers are skewed; `skew` is a Zipf exponent over the experts' popularity (0 =
uniform): expert i is picked per token with probability p_i proportional to
(i + 1)^-skew, scaled to sum to k and capped at 1, and sum_i 1 - (1 - p_i)^B are touched.
Skew touches fewer experts for the same batch, so memory-bound decode reads less.

Expert parallelism (ep GPUs each holding E/ep whole experts instead of a 1/tp slice of
every expert) reads the same bytes on the average GPU but sends each token's hidden
state to its experts' GPUs and back: two all-to-alls per MoE layer, priced over the GPU's
link by sim.config.link.all_to_all_s.
"""

from __future__ import annotations


def routing_probabilities(num_experts: int, top_k: int, skew: float = 0.0) -> list[float]:
    """Per-token pick probability of each expert: Zipf(skew) popularity summing to k,
    each capped at 1 (an expert is picked at most once per token)."""
    if skew < 0:
        raise ValueError(f"routing skew must be >= 0, got {skew!r}")
    weights = [(i + 1) ** -skew for i in range(num_experts)]
    probs = [0.0] * num_experts
    free, budget = list(range(num_experts)), float(top_k)
    while free:  # water-filling: cap at 1 and hand the excess to the rest
        total = sum(weights[i] for i in free)
        capped = [i for i in free if budget * weights[i] / total >= 1]
        if not capped:
            for i in free:
                probs[i] = budget * weights[i] / total
            break
        for i in capped:
            probs[i] = 1.0
        budget -= len(capped)
        free = [i for i in free if i not in capped]
    return probs


def expected_distinct_experts(num_experts: int, top_k: int, num_tokens: float,
                              skew: float = 0.0) -> float:
    """Experts touched by `num_tokens` tokens each routed to `top_k` (see the module)."""
    if num_tokens <= 0 or num_experts <= 1:
        return float(min(num_experts, top_k)) if num_tokens > 0 else 0.0
    if skew == 0:
        return num_experts * (1 - (1 - top_k / num_experts) ** num_tokens)
    return sum(1 - (1 - p) ** num_tokens
               for p in routing_probabilities(num_experts, top_k, skew))


def experts_touched_per_gpu(num_experts: int, top_k: int, num_tokens: float, ep: int,
                            skew: float = 0.0) -> float:
    """Distinct experts the busiest GPU of an ep group reads (experts dealt round robin):
    1/ep of them under uniform routing, more on the GPU holding the hot ones."""
    if ep <= 1:
        return expected_distinct_experts(num_experts, top_k, num_tokens, skew)
    if skew == 0:
        return expected_distinct_experts(num_experts, top_k, num_tokens) / ep
    probs = routing_probabilities(num_experts, top_k, skew)
    return max(sum(1 - (1 - p) ** num_tokens for p in probs[gpu::ep]) for gpu in range(ep))


def dispatch_bytes_per_gpu(num_tokens: float, top_k: int, hidden_size: int,
                           act_bytes: float, ep: int) -> float:
    """One GPU's buffer for one all-to-all of a MoE layer: its 1/ep of the tokens' hidden
    states, once per routed expert (k copies), spread evenly over the ep GPUs' experts.

    What nccl-tests' alltoall calls the size: each GPU keeps 1/ep of it and sends the
    rest, so sim.config.link.all_to_all_s prices (ep-1)/ep of it over the link. A layer
    runs two: dispatch to the experts, combine back."""
    if ep <= 1:
        return 0.0
    return num_tokens / ep * top_k * hidden_size * act_bytes


def all_to_all_bytes_per_gpu(num_tokens: int, top_k: int, hidden_size: int,
                             act_bytes: float, ep: int) -> float:
    """Bytes one GPU sends per MoE layer: its 1/ep of the tokens' hidden states to the
    (ep-1)/ep of their k experts that live elsewhere, then the results back."""
    if ep <= 1:
        return 0.0
    return 2 * dispatch_bytes_per_gpu(num_tokens, top_k, hidden_size, act_bytes,
                                      ep) * (ep - 1) / ep
