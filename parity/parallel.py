"""Parallel sampling (n > 1) configurations for the parity suite (pure Python, no vLLM, no sim).

vLLM V1 never shows `n` to its scheduler: the frontend (`ParentRequest` in
vllm/v1/engine/parallel_sampling.py) splits a request into n child requests,
named `"{index}_{parent id}"`, with the parent's prompt and max_tokens, and adds
them to the engine core one after another at the same instant. The children
then share the prompt's full blocks through the prefix cache, since vLLM names
a block when it is allocated.

A `ParentSpec` is one such request before the split. Each parity side splits it
its own way: the vLLM recorder with vLLM's own `ParentRequest`, the servesim side
with `sim.serve.parallel.split_children` (what `servesim serve` runs). The
records name child `index` of parent `p` by the integer `child_label(p, index)`,
so the trace format stays the one of parity.trace.

These configurations live apart from parity.configs so that the 370 recorded
there (and their digests) do not change; they are recorded into
traces/vllm-VERSION-parallel-sampling[-async].jsonl.gz.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from parity.configs import BLOCK_SIZE, VOCAB_SIZE, ParityConfig, RequestSpec

FAMILY = "parallel_sampling"
COUNT = 40
MAX_N = 16  # child labels: parent * MAX_N + index
_SEED = 47


@dataclass(frozen=True, slots=True)
class ParentSpec(RequestSpec):
    """A request with `n` choices, as a client sends it (split by each side)."""

    n: int = 1


def child_label(parent_id: int, index: int) -> int:
    """The integer that parity records name child `index` of `parent_id` by."""
    if not 0 <= index < MAX_N:
        raise ValueError(f"child index {index} is outside [0, {MAX_N})")
    return parent_id * MAX_N + index


def generate_parallel_configs(count: int = COUNT) -> list[ParityConfig]:
    """The parallel-sampling configurations, in a fixed order; the same on every machine."""
    configs = []
    for i in range(count):
        seed = int.from_bytes(hashlib.sha256(f"{_SEED}:{FAMILY}:{i}".encode()).digest()[:8],
                              "little")
        configs.append(_make(f"{FAMILY}-{i:03d}", random.Random(seed)))
    return configs


def _make(name: str, rng: random.Random) -> ParityConfig:
    """Parents with n in 1..8 over shared and unique prompts; chunked prefill on and off,
    roomy and tight pools (preemption of some children), small and large max_num_seqs
    (children of one parent admitted over several steps)."""
    chunked = rng.random() < 0.7
    prefix_caching = rng.random() < 0.85
    n_parents = rng.randint(2, 14)
    max_prompt = rng.choice((20, 60, 200, 500))
    shared = [[rng.randint(1, VOCAB_SIZE - 1) for _ in range(rng.randint(1, max_prompt))]
              for _ in range(rng.randint(1, 3))]
    parents = []
    step = 0
    for p in range(n_parents):
        prompt = list(rng.choice(shared)) if rng.random() < 0.4 else []
        prompt += [rng.randint(1, VOCAB_SIZE - 1)
                   for _ in range(rng.randint(0 if prompt else 1, max_prompt))]
        if rng.random() < 0.3:  # block-aligned: the last full block is recomputed by each child
            prompt = prompt[:max(BLOCK_SIZE, len(prompt) - len(prompt) % BLOCK_SIZE)] or prompt
            prompt += [1] * (BLOCK_SIZE - len(prompt)) if len(prompt) < BLOCK_SIZE else []
        n = rng.choice((1, 2, 2, 3, 4, 4, 5, 8))
        parents.append(ParentSpec(p, step, tuple(prompt), rng.randint(1, rng.choice((4, 16, 64))),
                                  n))
        step += rng.choice((0, 0, 1, 3, 10))
    children = sum(s.n for s in parents)
    seqs = rng.choice((2, 3, 4, 8, 16, 64, 256))
    budget = max(rng.choice((32, 64, 128, 256, 1024)), seqs)
    max_model_len = max(len(s.prompt_token_ids) + s.output_tokens for s in parents)
    if not chunked:
        budget = max(budget, max_model_len)
    least = 1 + max(-(-(len(s.prompt_token_ids) + s.output_tokens - 1) // BLOCK_SIZE)
                    for s in parents)
    load = sum(s.n * -(-(len(s.prompt_token_ids) + s.output_tokens) // BLOCK_SIZE)
               for s in parents)
    if rng.random() < 0.4:  # tight: preemptions, children of one parent among them
        num_blocks = least + rng.randint(0, max(1, least // 2))
    else:
        num_blocks = rng.randint(least, max(least, load + 1))
    assert children <= MAX_N * n_parents
    return ParityConfig(name, FAMILY, num_blocks, BLOCK_SIZE, seqs, budget, chunked,
                        prefix_caching, 0.0, max_model_len, tuple(parents))
