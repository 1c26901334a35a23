"""The engine's step times against floors measured on the same device.

Floors come from the device, not a datasheet: the copy bandwidth of a large
tensor (bytes read + written per second) and the rate of a large square
matmul on random data in the engine's dtype. A decode step must read every
weight and the batch's KV once, so (weights + KV bytes) / bandwidth is its
floor; a prefill's FLOPs (matmuls for every token, causal attention pairs,
the LM head for the last token) over the matmul rate is its floor. Steps run
through the engine's own runner (CUDA graphs for decode, read from the
persistent block tables) with random weights of the real shapes and random KV.

Where a batch's KV does not fit next to the weights (Llama-3-8B, 256 x 4k
tokens is 128 GiB), block tables wrap around the pool: sequence i's blocks
are distinct within the sequence and reused across sequences only after the
whole pool (tens of GiB, far beyond the 60 MB L2), so no read is served from
cache, and the row says how much of its KV was distinct.

`hf_generate_ratio`: the same greedy batch through Hugging Face transformers'
`generate` (when installed), as a ratio of output tokens per second.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gpu_engine.engine import Engine
from gpu_engine.kv_cache import PagedKVCache
from gpu_engine.runner import ModelRunner
from gpu_engine.weights import build_model
from sim.config.costs import (
    attention_flops_per_pair,
    kv_bytes_per_token,
    linear_flops_per_token,
    lm_head_flops_per_seq,
    weights_bytes,
)
from sim.config.specs import ModelSpec, stored_as
from sim.core.batching import padded_batch_size
from sim.core.kv import PagedBlockManager
from sim.core.request import Request
from sim.core.schedulers import SchedulerSettings, build_scheduler

BLOCK = 16


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed_s(device: torch.device, fn: Callable[[], Any], repeats: int, warmup: int = 2
            ) -> float:
    """Median seconds of `fn()` (synchronised around each call) after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth_bytes_per_s(device: torch.device, size_bytes: int) -> float:
    src = torch.empty(size_bytes // 4, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    return 2 * size_bytes / timed_s(device, lambda: dst.copy_(src), 10, 3)


def matmul_flops_per_s(device: torch.device, dtype: torch.dtype, n: int) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n**3 / timed_s(device, lambda: a @ b, 10, 3)


def prefill_flops(spec: ModelSpec, tokens: int) -> float:
    """One prefill of `tokens` from scratch: matmuls, causal attention pairs, the last LM head."""
    pairs = tokens * (tokens + 1) / 2
    return (tokens * linear_flops_per_token(spec) + pairs * attention_flops_per_pair(spec)
            + lm_head_flops_per_seq(spec))


@dataclass(frozen=True, slots=True)
class Floors:
    bandwidth_bytes_per_s: float
    matmul_flops_per_s: float


def measure_floors(device: torch.device, dtype: torch.dtype) -> Floors:
    big = device.type == "cuda"
    return Floors(copy_bandwidth_bytes_per_s(device, 2**31 if big else 2**27),
                  matmul_flops_per_s(device, dtype, 8192 if big else 768))


class Bench:
    """One model on one device with a KV pool for up to `max_tokens` tokens (random KV)."""

    def __init__(self, spec: ModelSpec, device: torch.device, dtype: torch.dtype,
                 max_tokens: int, max_seqs: int, max_model_len: int,
                 memory_share: float = 0.85) -> None:
        self.spec, self.device, self.dtype = spec, device, dtype
        self.model = build_model(spec, device, dtype, seed=0)
        stored = stored_as(spec, str(dtype).removeprefix("torch."))
        blocks = -(-max_tokens // BLOCK) + max_seqs + 1
        if device.type == "cuda":
            free = torch.cuda.mem_get_info(device)[0] * memory_share - 4 * 2**30
            blocks = min(blocks, int(free // (kv_bytes_per_token(stored) * BLOCK)))
        self.kv = PagedKVCache.for_spec(spec, blocks, BLOCK, dtype, device)
        for t in (*self.kv.k, *self.kv.v):
            t.normal_()
        self.runner = ModelRunner(self.model, self.kv, device, max_seqs,
                                  -(-max_model_len // BLOCK), cuda_graphs=True)
        self.runner.warmup()

    def tables(self, batch: int, tokens: int) -> tuple[tuple[tuple[int, ...], ...], float]:
        """Each sequence's blocks, wrapping round the pool; and the share of distinct blocks."""
        per_seq = -(-tokens // BLOCK)
        usable = self.kv.num_blocks - 1
        if per_seq > usable:
            raise ValueError(f"one sequence of {tokens} tokens needs {per_seq} blocks; the "
                             f"pool has {usable}")
        out = tuple(tuple(1 + (i * per_seq + j) % usable for j in range(per_seq))
                    for i in range(batch))
        return out, min(1.0, usable / (batch * per_seq))

    def step_ms(self, batch: int, new_tokens: int, context: int, repeats: int
                ) -> tuple[float, float, float]:
        """(whole step ms: inputs + kernels + the token transfer, device ms, distinct KV)."""
        tables, distinct = self.tables(batch, context + new_tokens)
        device_s: list[float] = []
        # padded as the scheduler pads a decode step for CUDA graphs (the plan's padded_batch)
        rows = padded_batch_size(batch, self.runner.graph_sizes) \
            if self.runner.use_graphs and new_tokens == 1 else batch

        def run() -> None:
            inputs = self.runner.prepare([[1] * new_tokens] * batch, (context,) * batch, tables,
                                         (True,) * batch, min_seqs=rows,
                                         seq_ids=list(range(batch)))
            device_s.append(self.runner.execute(inputs, lambda x: x.argmax(-1))[1])

        wall = timed_s(self.device, run, repeats)
        return wall * 1e3, statistics.median(device_s[2:]) * 1e3, distinct


def decode_rows(bench: Bench, floors: Floors, points: list[tuple[int, int]], repeats: int
                ) -> list[dict[str, Any]]:
    spec = bench.spec
    stored = stored_as(spec, str(bench.dtype).removeprefix("torch."))
    w_bytes = weights_bytes(stored)
    rows = []
    for batch, context in points:
        wall_ms, device_ms, distinct = bench.step_ms(batch, 1, context, repeats)
        kv = batch * (context + 1) * kv_bytes_per_token(stored)
        floor_ms = (w_bytes + kv) / floors.bandwidth_bytes_per_s * 1e3
        rows.append({"kind": "decode", "batch": batch, "context": context,
                     "step_ms": wall_ms, "device_ms": device_ms, "floor_ms": floor_ms,
                     "weights_floor_ms": w_bytes / floors.bandwidth_bytes_per_s * 1e3,
                     "over_floor": device_ms / floor_ms, "tokens_per_s": batch / wall_ms * 1e3,
                     "kv_distinct": distinct,
                     "bytes_bound_GB": device_ms / 1e3 * floors.bandwidth_bytes_per_s / 1e9,
                     "live_bytes_GB": (w_bytes + kv) / 1e9})
    return rows


def prefill_rows(bench: Bench, floors: Floors, sizes: list[int], repeats: int
                 ) -> list[dict[str, Any]]:
    rows = []
    for tokens in sizes:
        wall_ms, device_ms, _ = bench.step_ms(1, tokens, 0, repeats)
        flops = prefill_flops(bench.spec, tokens)
        rows.append({"kind": "prefill", "batch": 1, "tokens": tokens, "step_ms": wall_ms,
                     "device_ms": device_ms,
                     "floor_ms": flops / floors.matmul_flops_per_s * 1e3,
                     "achieved_TFLOPs": flops / (device_ms / 1e3) / 1e12,
                     "share_of_matmul_rate": flops / (device_ms / 1e3)
                     / floors.matmul_flops_per_s,
                     "tokens_per_s": tokens / wall_ms * 1e3})
    return rows


def engine_generate_s(spec: ModelSpec, device: torch.device, dtype: torch.dtype, batch: int,
                      prompt: int, output: int, model: Any = None) -> float:
    """Wall seconds for the engine to serve `batch` greedy requests arriving together."""
    model = model or build_model(spec, device, dtype, seed=0)
    blocks = batch * -(-(prompt + output) // BLOCK) + 8
    kv = PagedKVCache.for_spec(spec, blocks + 1, BLOCK, dtype, device)
    runner = ModelRunner(model, kv, device, batch, -(-(prompt + output) // BLOCK) + 1)
    runner.warmup()
    settings = SchedulerSettings(max_num_seqs=batch, max_num_batched_tokens=batch * prompt,
                                 max_model_len=prompt + output, cuda_graphs=runner.use_graphs)
    engine = Engine(model, kv, build_scheduler("continuous", PagedBlockManager(blocks + 1, BLOCK),
                                               settings), runner)
    for i in range(batch):
        engine.add_request(Request(i, 0.0, prompt, output), now=0.0)
    _sync(device)
    started = time.perf_counter()
    for _ in engine.stream():
        pass
    _sync(device)
    return time.perf_counter() - started


def hf_generate_s(spec: ModelSpec, device: torch.device, dtype: torch.dtype, batch: int,
                  prompt: int, output: int) -> float | None:
    """The same greedy batch through transformers' `generate` (None when not installed)."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return None
    config = LlamaConfig(vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
                         intermediate_size=spec.intermediate_size,
                         num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
                         num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                         rms_norm_eps=spec.rms_norm_eps,
                         max_position_embeddings=spec.max_context_tokens,
                         tie_word_embeddings=spec.tie_embeddings)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to(dtype=dtype).to_empty(device=device).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))
        ids = torch.randint(0, spec.vocab_size, (batch, prompt), device=device)
        kwargs = {"max_new_tokens": output, "min_new_tokens": output, "do_sample": False,
                  "pad_token_id": 0, "eos_token_id": None}
        model.generate(ids[:, :16], **{**kwargs, "max_new_tokens": 4, "min_new_tokens": 4})
        _sync(device)
        started = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        _sync(device)
    elapsed = time.perf_counter() - started
    del model
    return elapsed
