"""Seeded scheduler configurations that both parity sides replay (pure Python, no vLLM, no simpy).

A configuration is the scheduler's knobs plus a request stream; arrivals are
the index of the step at which a request is added, so neither side needs a
clock. Prompts carry real token ids, with shared prefixes where a family asks
for them, so that vLLM's block hashes and servesim's block names match on the
same content. Output tokens are fabricated by `output_token_id`, distinct per
request, so only a request's own generated blocks can ever be hit.

The families cover what issue 14 lists: chunked prefill on and off, prefix
caching with and without shared prefixes, tight memory with heavy
preemption, simultaneous and staggered arrivals, watermark, max_num_seqs
from 1 to 256, token budgets, and long prompts that need many chunks; and
beyond it: blocks of the same content computed twice and named twice
(prefix_duplicates: identical block-aligned prompts, whose last block every
request recomputes, under evictions), running sets in the hundreds
(large_batch), and speculative decoding with k drafts per sequence (spec_ngram,
spec_draft_model: vLLM's n-gram and draft-model methods), whose acceptance
counts both sides take from `accepted_drafts`.
Changing anything here changes every digest: re-record the vLLM traces.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass

GENERATOR_VERSION = 2
BLOCK_SIZE = 16
VOCAB_SIZE = 32_000
BASE_SEED = 14

# family -> how many configurations it contributes (370 in all)
FAMILIES: dict[str, int] = {
    "mixed": 40, "chunked_off": 25, "prefix_shared": 35, "prefix_unique": 15, "tight": 35,
    "simultaneous": 20, "watermark": 20, "seqs_extremes": 20, "long_prompts": 20,
    "small_budget": 20, "watermark_edge": 20, "prefix_duplicates": 30, "large_batch": 15,
    "spec_ngram": 30, "spec_draft_model": 25,
}
SPEC_METHODS = {"spec_ngram": "ngram", "spec_draft_model": "draft_model"}
# the speculative methods vLLM 0.32's VllmConfig accepts with async scheduling (it refuses
# "ngram", the CPU prompt lookup): the other configurations run synchronously only
ASYNC_SPEC_METHODS = ("draft_model",)

_SEQS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_BUDGETS = (16, 32, 64, 128, 256, 512, 1024, 2048)


@dataclass(frozen=True, slots=True)
class RequestSpec:
    request_id: int
    arrival_step: int
    prompt_token_ids: tuple[int, ...]
    output_tokens: int


@dataclass(frozen=True, slots=True)
class ParityConfig:
    """One scheduler run; `num_blocks` counts vLLM's null block, as servesim's pool does."""

    name: str
    family: str
    num_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    prefix_caching: bool
    watermark: float
    max_model_len: int
    requests: tuple[RequestSpec, ...]
    speculative_tokens: int = 0  # k drafts per decoding sequence (0 = no speculative config)
    speculative_method: str = "ngram"  # vLLM's SpeculativeConfig.method: ngram or draft_model

    def to_json(self) -> dict:
        return asdict(self)

    @property
    def digest(self) -> str:
        """Content hash: a recorded trace is valid only for the configuration that made it."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def runs_async(config: ParityConfig) -> bool:
    """Whether vLLM runs `config` with async scheduling too (its speculative method allows)."""
    return not config.speculative_tokens or config.speculative_method in ASYNC_SPEC_METHODS


def output_token_id(request_id: int, index: int) -> int:
    """The `index`-th fabricated output token of a request (a 32-bit integer mix)."""
    x = (request_id * 0x9E3779B1 + index * 0x85EBCA77 + 0x165667B1) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x2C1B3C6D) & 0xFFFFFFFF
    x ^= x >> 12
    return 1 + x % (VOCAB_SIZE - 1)


def accepted_drafts(request_id: int, num_output: int, num_drafts: int) -> int:
    """How many of a step's `num_drafts` drafts the fabricated verifier accepts.

    A function of the request and how many tokens it had emitted before the
    step, so both sides draw the same count while their decisions agree; a
    third of the steps accept every draft, the rest are uniform.
    """
    if num_drafts <= 0:
        return 0
    x = output_token_id(request_id ^ 0x5BD1E995, num_output)
    return num_drafts if x % 3 == 0 else (x // 3) % (num_drafts + 1)


def generate_configs(families: dict[str, int] | None = None) -> list[ParityConfig]:
    """Every configuration, in a fixed order; the same list on every machine."""
    configs = []
    for family, count in (families or FAMILIES).items():
        for i in range(count):
            seed = int.from_bytes(hashlib.sha256(f"{BASE_SEED}:{family}:{i}".encode())
                                  .digest()[:8], "little")
            configs.append(_make(family, f"{family}-{i:03d}", random.Random(seed)))
    return configs


def _make(family: str, name: str, rng: random.Random) -> ParityConfig:
    if family == "prefix_duplicates":
        return _duplicates(name, rng)
    if family == "large_batch":
        return _large_batch(name, rng)
    k = 0
    if family in SPEC_METHODS:
        k = rng.randint(1, 6)
    chunked = family != "chunked_off" and rng.random() < 0.75
    if family in ("prefix_shared", "prefix_unique"):
        prefix_caching = True
    else:
        prefix_caching = family != "chunked_off" and rng.random() < 0.4
    shared = family == "prefix_shared" or (prefix_caching and family != "prefix_unique"
                                          and rng.random() < 0.5)
    n = rng.randint(4, 40)
    max_prompt = {"long_prompts": 4000, "small_budget": 300}.get(
        family, rng.choice((24, 100, 400, 1000)))
    max_output = rng.choice((4, 16, 64, 160))
    prompts = _prompts(rng, n, max_prompt, shared, family == "long_prompts")
    outputs = [rng.randint(1, max_output) for _ in range(n)]
    arrivals = _arrivals(rng, n, simultaneous=family == "simultaneous")

    seqs = rng.choice(_SEQS)
    if family == "seqs_extremes":
        seqs = rng.choice((1, 2, 3, 128, 256))
    budget = rng.choice(_BUDGETS)
    if family == "small_budget":
        budget = rng.choice((16, 24, 32, 48, 64))
        seqs = min(seqs, budget)
    if family == "long_prompts":
        budget = rng.choice((64, 128, 256, 512))
    budget = max(budget, seqs)
    max_model_len = max(len(p) + o for p, o in zip(prompts, outputs, strict=True))
    if not chunked:
        budget = max(budget, max_model_len)  # vLLM refuses a smaller budget without chunking

    # the largest request must fit alone; "tight" gives little more than that
    lookahead = k if family == "spec_draft_model" else 0
    peak_blocks = max(-(-min(len(p) + o - 1 + k + lookahead, max_model_len) // BLOCK_SIZE)
                      for p, o in zip(prompts, outputs, strict=True))
    load_blocks = sum(-(-(len(p) + o) // BLOCK_SIZE) for p, o in zip(prompts, outputs,
                                                                      strict=True))
    least = peak_blocks + 1  # + the null block
    if family == "tight":
        num_blocks = least + rng.randint(0, max(1, least // 3))
    else:
        num_blocks = rng.randint(least, max(least, load_blocks + 1))
    watermark = 0.0
    if family == "watermark" or rng.random() < 0.1:
        watermark = rng.choice((0.01, 0.02, 0.05, 0.1, 0.2))
    if family == "watermark_edge":
        # a pool where wm * num_blocks is a whole number: int(wm * (num_blocks - 1)) is one less
        watermark = rng.choice((0.05, 0.1, 0.2, 0.25))
        whole = -(-least * watermark // 1) + rng.randint(0, 1)
        num_blocks = max(least, round(whole / watermark))

    if family in SPEC_METHODS and family == "spec_draft_model":
        budget = max(budget, 2)  # vLLM: the budget must exceed the draft slots
    requests = tuple(RequestSpec(i, arrivals[i], tuple(prompts[i]), outputs[i])
                     for i in range(n))
    return ParityConfig(name, family, num_blocks, BLOCK_SIZE, seqs, budget, chunked,
                        prefix_caching, watermark, max_model_len, requests, k,
                        SPEC_METHODS.get(family, "ngram"))


def _duplicates(name: str, rng: random.Random) -> ParityConfig:
    """Identical block-aligned prompts under evictions: vLLM names every recomputed copy.

    A request whose whole prompt is cached still computes its last block (the
    last token's logits are needed), so each repeat of a block-aligned prompt
    fills a second block with the same content; vLLM keeps both named, so the
    copy goes to the back of the free queue and serves hits once the first is
    evicted. A tight pool makes the evictions happen.
    """
    chunked = rng.random() < 0.7
    prompts_pool = [[rng.randint(1, VOCAB_SIZE - 1) for _ in range(BLOCK_SIZE * rng.randint(1, 12))]
                    for _ in range(rng.randint(1, 4))]
    n = rng.randint(8, 40)
    prompts = []
    for _ in range(n):
        prompt = list(rng.choice(prompts_pool))
        if rng.random() < 0.25:  # a short suffix: a partial last block, hits up to the prefix
            prompt += [rng.randint(1, VOCAB_SIZE - 1) for _ in range(rng.randint(1, 20))]
        prompts.append(prompt)
    outputs = [rng.randint(1, rng.choice((4, 16, 48))) for _ in range(n)]
    arrivals = _arrivals(rng, n, simultaneous=False)
    seqs = rng.choice((2, 4, 8, 16, 32))
    max_model_len = max(len(p) + o for p, o in zip(prompts, outputs, strict=True))
    budget = max(rng.choice((32, 64, 128, 256, 512)), seqs)
    if not chunked:
        budget = max(budget, max_model_len)
    least = 1 + max(-(-(len(p) + o - 1) // BLOCK_SIZE) for p, o in zip(prompts, outputs,
                                                                         strict=True))
    num_blocks = least + rng.randint(0, least)
    watermark = rng.choice((0.0, 0.0, 0.05))
    requests = tuple(RequestSpec(i, arrivals[i], tuple(prompts[i]), outputs[i])
                     for i in range(n))
    return ParityConfig(name, "prefix_duplicates", num_blocks, BLOCK_SIZE, seqs, budget,
                        chunked, True, watermark, max_model_len, requests)


def _large_batch(name: str, rng: random.Random) -> ParityConfig:
    """Running sets in the hundreds, where servesim's array path does the work."""
    prefix_caching = rng.random() < 0.5
    n = rng.randint(100, 260)
    prompts = _prompts(rng, n, rng.choice((64, 200, 600)), prefix_caching and rng.random() < 0.6,
                       False)
    outputs = [rng.randint(1, rng.choice((16, 64, 128))) for _ in range(n)]
    arrivals = _arrivals(rng, n, simultaneous=rng.random() < 0.3)
    seqs = rng.choice((128, 192, 256))
    budget = rng.choice((512, 1024, 2048, 8192))
    max_model_len = max(len(p) + o for p, o in zip(prompts, outputs, strict=True))
    load = sum(-(-(len(p) + o) // BLOCK_SIZE) for p, o in zip(prompts, outputs, strict=True))
    least = 1 + max(-(-(len(p) + o - 1) // BLOCK_SIZE) for p, o in zip(prompts, outputs,
                                                                         strict=True))
    num_blocks = max(least, int(load * rng.uniform(0.3, 1.1)))
    requests = tuple(RequestSpec(i, arrivals[i], tuple(prompts[i]), outputs[i])
                     for i in range(n))
    return ParityConfig(name, "large_batch", num_blocks, BLOCK_SIZE, seqs, budget, True,
                        prefix_caching, 0.0, max_model_len, requests)


def _prompts(rng: random.Random, n: int, max_len: int, shared: bool, long: bool
             ) -> list[list[int]]:
    def tokens(k: int) -> list[int]:
        return [rng.randint(1, VOCAB_SIZE - 1) for _ in range(k)]

    lo = max_len // 4 if long else 1
    if not shared:
        return [tokens(rng.randint(lo, max_len)) for _ in range(n)]
    # a few common prefixes (some block-aligned, some not); suffixes may be empty
    prefixes = []
    for _ in range(rng.randint(1, 4)):
        k = rng.randint(1, max(1, max_len * 3 // 4))
        if rng.random() < 0.5:
            k = max(BLOCK_SIZE, k - k % BLOCK_SIZE)
        prefixes.append(tokens(min(k, max_len)))
    out = []
    for _ in range(n):
        if rng.random() < 0.15:
            out.append(tokens(rng.randint(lo, max_len)))
            continue
        prefix = rng.choice(prefixes)
        room = max(0, max_len - len(prefix))
        out.append(prefix + tokens(rng.randint(0 if rng.random() < 0.2 else 1, max(1, room))))
    return out


def _arrivals(rng: random.Random, n: int, simultaneous: bool) -> list[int]:
    if simultaneous:
        return [0] * n
    kind = rng.choice(("together", "staggered", "bursts"))
    if kind == "together":
        return [0] * n
    if kind == "staggered":
        gap = rng.choice((1, 3, 10, 30))
        steps, t = [], 0
        for _ in range(n):
            steps.append(t)
            t += rng.randint(0, gap)
        return steps
    starts = sorted(rng.randint(0, 200) for _ in range(rng.randint(2, 5)))
    return sorted(rng.choice(starts) for _ in range(n))
