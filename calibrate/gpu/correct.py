"""The GPU check's correctness part: what must hold before any timing means something.

- `attention_errors`: the engine's attention (the Triton kernel on CUDA) on bf16
  paged caches against a dense fp32 reference, for decode (split-KV), a chunk on
  a cached prefix among decodes, and a fresh prefill: relative error
  ||out - ref|| / ||ref||, which bf16 operands put between 1e-3 and 1e-2.
- `graph_vs_eager`: every decode step of a served workload run both as its
  CUDA graph and eagerly on the same inputs (one row that emits nothing sits
  in the middle of a batch): the greedy tokens must be identical.
- `step_syncs`: engine steps of every kind with the host's waits counted, by
  `torch.cuda.set_sync_debug_mode("warn")` on CUDA or patched tensor reads on
  a CPU (calibrate/gpu/sync_count.py): exactly one per step, the token transfer.
- `decode_allocation`: the bytes a decode step allocates beyond what was
  allocated before it, against the batch's live KV: activations only, no copy.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter
from typing import Any

import torch

from calibrate.gpu.sync_count import count_syncs
from gpu_engine.attention import paged_attention
from gpu_engine.drafters import NgramDrafter
from gpu_engine.engine import Engine
from gpu_engine.inputs import build_inputs
from gpu_engine.kv_cache import PagedKVCache
from gpu_engine.runner import ModelRunner
from gpu_engine.sampling import SamplingParams
from gpu_engine.weights import build_model
from sim.config.costs import kv_bytes_per_token
from sim.config.specs import ModelSpec
from sim.core.batching import padded_batch_size
from sim.core.kv import PagedBlockManager
from sim.core.request import Request
from sim.core.schedulers import SchedulerSettings, build_scheduler

BLOCK = 16


def _dense_reference(q: torch.Tensor, k_hist: list[torch.Tensor], v_hist: list[torch.Tensor],
                     seqs: list[tuple[int, int]], scale: float) -> torch.Tensor:
    rows = []
    group = q.shape[1] // k_hist[0].shape[1]
    start = 0
    for (ctx, new), keys, values in zip(seqs, k_hist, v_hist, strict=True):
        query = q[start:start + new].float()
        keys = keys.float().repeat_interleave(group, dim=1)
        values = values.float().repeat_interleave(group, dim=1)
        scores = torch.einsum("nhd,shd->hns", query, keys) * scale
        causal = (torch.arange(ctx + new, device=q.device)[None, :]
                  <= (ctx + torch.arange(new, device=q.device))[:, None])
        probs = scores.masked_fill(~causal, -math.inf).softmax(-1)
        rows.append(torch.einsum("hns,shd->nhd", probs, values))
        start += new
    return torch.cat(rows)


def attention_case(seqs: list[tuple[int, int]], device: torch.device, dtype: torch.dtype,
                   backend: str, heads: tuple[int, int, int] = (32, 8, 128), seed: int = 0
                   ) -> float:
    """Relative error of the engine's attention on one step of `seqs` (context, new tokens)."""
    num_heads, num_kv_heads, head_dim = heads
    rng = random.Random(seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    needed = [-(-(ctx + new) // BLOCK) for ctx, new in seqs]
    num_blocks = 1 + sum(needed) + 4
    ids = list(range(1, num_blocks))
    rng.shuffle(ids)
    tables, taken = [], 0
    for count in needed:
        tables.append(ids[taken:taken + count])
        taken += count
    shape = (num_blocks, BLOCK, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen, device=device).to(dtype)
    v_cache = torch.randn(shape, generator=gen, device=device).to(dtype)
    k_hist, v_hist = [], []
    for (ctx, new), table in zip(seqs, tables, strict=True):
        k_hist.append(torch.randn(ctx + new, num_kv_heads, head_dim, generator=gen,
                                  device=device).to(dtype))
        v_hist.append(torch.randn(ctx + new, num_kv_heads, head_dim, generator=gen,
                                  device=device).to(dtype))
        pos = torch.arange(ctx, device=device)
        blocks = torch.tensor(table, device=device)[pos // BLOCK]
        k_cache[blocks, pos % BLOCK] = k_hist[-1][:ctx]
        v_cache[blocks, pos % BLOCK] = v_hist[-1][:ctx]
    q = torch.randn(sum(n for _, n in seqs), num_heads, head_dim, generator=gen,
                    device=device).to(dtype)
    k = torch.cat([h[ctx:] for (ctx, _), h in zip(seqs, k_hist, strict=True)])
    v = torch.cat([h[ctx:] for (ctx, _), h in zip(seqs, v_hist, strict=True)])
    inputs = build_inputs([[0] * n for _, n in seqs], [c for c, _ in seqs], tables,
                          [True] * len(seqs), BLOCK, device, backend=backend)
    scale = 1 / math.sqrt(head_dim)
    out = paged_attention(q, k, v, k_cache, v_cache, inputs, scale)
    ref = _dense_reference(q, k_hist, v_hist, seqs, scale)
    if not torch.isfinite(out).all():
        return math.inf
    return float((out.float() - ref).norm() / ref.norm())


def attention_errors(device: torch.device, dtype: torch.dtype, backend: str,
                     small: bool = False) -> dict[str, float]:
    long = 300 if small else 4000
    heads = (4, 2, 16) if small else (32, 8, 128)
    cases = {
        "decode": [(long, 1), (17, 1), (long // 2, 1), (0, 1)] * (1 if small else 16),
        "chunk_among_decodes": [(long // 4, 300 if not small else 40), (63, 1), (long, 1)],
        "fresh_prefill": [(0, 512 if not small else 48)],
        "verify": [(long // 3, 5), (200, 4), (9, 1)],
    }
    return {name: attention_case(seqs, device, dtype, backend, heads, seed=i)
            for i, (name, seqs) in enumerate(cases.items())}


def _engine(spec: ModelSpec, device: torch.device, dtype: torch.dtype, max_seqs: int,
            blocks: int, cuda_graphs: bool = True, speculative_tokens: int = 0) -> Engine:
    """An engine whose scheduler pads decode steps to the runner's graphs, as sim.assemble's
    does for a deployment with CUDA graphs."""
    model = build_model(spec, device, dtype, seed=0)
    kv = PagedKVCache.for_spec(spec, blocks, BLOCK, dtype, device)
    runner = ModelRunner(model, kv, device, max_seqs, 64, cuda_graphs)
    runner.warmup()
    settings = SchedulerSettings(max_num_seqs=max_seqs, max_num_batched_tokens=512,
                                 max_model_len=64 * BLOCK, speculative_tokens=speculative_tokens,
                                 cuda_graphs=runner.use_graphs)
    scheduler = build_scheduler("continuous", PagedBlockManager(blocks, BLOCK), settings)
    return Engine(model, kv, scheduler, runner, seed=0)


def graph_vs_eager(spec: ModelSpec, device: torch.device, dtype: torch.dtype
                   ) -> dict[str, Any]:
    """Each decode step of a served workload replayed as its graph and run eagerly on the
    same inputs, then one decode step whose second and last rows emit nothing."""
    engine = _engine(spec, device, dtype, 8, 512)
    runner = engine.runner
    if not runner.use_graphs:
        return {"skipped": f"no CUDA graphs here ({device.type}, {runner.backend})"}
    stats: Counter = Counter()
    worst = [0.0]
    replay = runner._replay

    def both(inputs: Any) -> torch.Tensor:
        eager = runner.model(inputs, runner.kv)
        graph = replay(inputs)
        stats["steps"] += 1
        stats["rows"] += graph.shape[0]
        stats["token_mismatches"] += int((graph.argmax(-1) != eager.argmax(-1)).sum())
        stats["rows_without_logits"] += inputs.num_seqs - graph.shape[0]
        worst[0] = max(worst[0], float((graph - eager).abs().max()))
        return graph

    runner._replay = both  # type: ignore[method-assign]
    try:
        for i, (prompt, output) in enumerate([(40, 30), (7, 5), (100, 18), (20, 9), (3, 24)]):
            engine.add_request(Request(i, 0.0, prompt, output), now=0.0)
        for _ in engine.stream():
            pass
        tables = [tuple(range(1 + 4 * i, 5 + 4 * i)) for i in range(5)]
        inputs = runner.prepare([[3]] * 5, [50, 9, 33, 60, 2], tables,
                                [True, False, True, True, False],
                                min_seqs=padded_batch_size(5, runner.graph_sizes),
                                seq_ids=[90, 91, 92, 93, 94])
        with torch.inference_mode():
            runner._forward(inputs)
    finally:
        runner._replay = replay  # type: ignore[method-assign]
    return {**stats, "max_abs_logit_diff": worst[0], "graphs": runner.num_graphs,
            "identical": stats["steps"] > 0 and stats["token_mismatches"] == 0}


def step_syncs(spec: ModelSpec, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """Host waits per engine step, over prefills, mixed, decode (graph), sampled, speculative."""
    out: dict[str, Any] = {}
    for case in ("greedy", "sampled", "speculative"):
        engine = _engine(spec, device, dtype, 8, 512,
                         speculative_tokens=3 if case == "speculative" else 0)
        if case == "speculative":
            engine.drafter = NgramDrafter()
        for i in range(6):
            params = SamplingParams(temperature=0.8, top_k=50, top_p=0.9) \
                if case != "greedy" and i % 2 else SamplingParams()
            engine.add_request(Request(i, 0.0, 20 + 37 * i, 6 + i), params, now=0.0)
        per_step: Counter = Counter()
        while True:
            with count_syncs(device) as counts:
                outcome = engine.step()
            if outcome is None:
                break
            per_step[sum(counts.values())] += 1
        out[case] = {f"{k} syncs": v for k, v in sorted(per_step.items())}
    out["ok"] = all(set(v) == {"1 syncs"} for v in out.values() if isinstance(v, dict))
    return out


def decode_allocation(spec: ModelSpec, device: torch.device, dtype: torch.dtype,
                      batch: int, context: int) -> dict[str, Any]:
    """Peak bytes an eager decode step allocates on top of what it found, vs the live KV."""
    if device.type != "cuda":
        return {"skipped": "CUDA memory statistics only"}
    small = dataclasses.replace(spec, num_layers=2)
    model = build_model(small, device, dtype, seed=0)
    per_seq = -(-(context + 1) // BLOCK)
    kv = PagedKVCache.for_spec(small, batch * per_seq + 1, BLOCK, dtype, device)
    runner = ModelRunner(model, kv, device, batch, per_seq, cuda_graphs=False)
    tables = [tuple(range(1 + i * per_seq, 1 + (i + 1) * per_seq)) for i in range(batch)]
    inputs = runner.prepare([[1]] * batch, [context] * batch, tables, [True] * batch,
                            seq_ids=list(range(batch)))
    with torch.inference_mode():
        model(inputs, kv)  # warm the allocator
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        model(inputs, kv)
        torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated(device) - before
    itemsize = torch.empty((), dtype=dtype).element_size()
    live_layer = batch * (context + 1) * kv_bytes_per_token(small, itemsize) / small.num_layers
    return {"batch": batch, "context": context, "step_extra_bytes": extra,
            "live_kv_bytes_per_layer": live_layer, "extra_over_live_kv": extra / live_layer,
            "ok": extra < 0.5 * live_layer}
