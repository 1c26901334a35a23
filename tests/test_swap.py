"""Swap preemption: KV parked in host memory, computed tokens kept, transfer time charged."""

from __future__ import annotations

import random

import pytest

from sim.config.catalogue import get_hardware, get_model
from sim.config.costs import kv_bytes_per_token
from sim.config.scenario import Scenario
from sim.core.contiguous import ContiguousAllocator
from sim.core.drive import run_steps
from sim.core.kv import PagedBlockManager
from sim.core.plan import StepShape
from sim.core.request import Request, RequestState
from sim.core.schedulers import ContinuousScheduler
from sim.experiments.run import run_scenario
from sim.latency.roofline import RooflineLatency

ROOF = RooflineLatency(get_model("llama-3-8b"), get_hardware("h100-sxm"))


def workload(seed: int = 1, n: int = 60) -> list[tuple[float, int, int]]:
    rng = random.Random(seed)
    return [(rng.uniform(0, 1), rng.randint(8, 120), rng.randint(5, 80)) for _ in range(n)]


def run(preemption: str, host_blocks: int = 10_000,
        ) -> tuple[list[Request], list, ContinuousScheduler]:
    kv = PagedBlockManager(60, 8, 0.01, host_swap_blocks=host_blocks)
    sched = ContinuousScheduler(kv, 16, 256, preemption=preemption)
    requests = [Request(i, a, p, o) for i, (a, p, o) in enumerate(workload())]
    _, plans = run_steps(sched, requests, step_s=ROOF.step_time, after=sched.kv.check_invariants)
    assert kv.num_used_blocks == 0 and kv.num_host_blocks_used == 0
    return requests, plans, sched


def test_swap_and_recompute_give_the_same_tokens() -> None:
    by_swap, swap_plans, swap = run("swap")
    by_recompute, rec_plans, recompute = run("recompute")
    assert all(r.state is RequestState.FINISHED for r in by_swap + by_recompute)
    assert [(r.prompt_tokens, r.num_output_done) for r in by_swap] == \
        [(r.prompt_tokens, r.num_output_done) for r in by_recompute]
    assert sum(r.num_preemptions for r in by_swap) > 0
    assert sum(r.num_preemptions for r in by_recompute) > 0
    assert swap.num_recomputed_tokens == 0 and recompute.num_recomputed_tokens > 0
    out = sum(p.shape.swap_out_tokens for p in swap_plans)
    back = sum(p.shape.swap_in_tokens for p in swap_plans)
    assert out == back > 0  # everything swapped out came back
    assert not any(p.shape.swap_out_tokens or p.shape.swap_in_tokens for p in rec_plans)
    # swap never re-prefills: prompt and output are computed once each
    computed = sum(sum(p.num_new_tokens) for p in swap_plans)
    assert computed == sum(r.prompt_tokens + r.output_tokens - 1 for r in by_swap)


def test_swapped_request_resumes_where_it_stopped() -> None:
    _, plans, _ = run("swap")
    swapped_out = next(p for p in plans if p.preempted_ids)
    victim = swapped_out.preempted_ids[0]
    before = [p for p in plans[:plans.index(swapped_out)] if victim in p.request_ids][-1]
    k = before.request_ids.index(victim)
    resumed_at = before.context_tokens[k] + before.num_new_tokens[k]
    back = next(p for p in plans[plans.index(swapped_out):] if victim in p.request_ids)
    assert back.shape.swap_in_tokens > 0
    assert back.context_tokens[back.request_ids.index(victim)] == resumed_at


def test_swap_charges_exactly_the_host_link_time() -> None:
    base = StepShape((128,), (0,), num_decodes=4, decode_context_sum=400, decode_context_max=100,
                     padded_batch=5)
    moved = StepShape((128,), (0,), 4, 400, 100, 5, swap_out_tokens=64, swap_in_tokens=32)
    link = get_hardware("h100-sxm").host_link_bandwidth_bytes_per_s
    expected = 96 * kv_bytes_per_token(get_model("llama-3-8b")) / link
    assert ROOF.step_time(moved) - ROOF.step_time(base) == pytest.approx(expected, rel=1e-12)
    assert ROOF.breakdown(moved)["swap_s"] == pytest.approx(expected, rel=1e-12)
    _, plans, _ = run("swap")
    carrying = [p for p in plans if p.shape.swap_out_tokens or p.shape.swap_in_tokens]
    assert carrying
    for p in carrying:
        plain = StepShape(p.shape.prefill_chunk_tokens, p.shape.prefill_context_tokens,
                          p.shape.num_decodes, p.shape.decode_context_sum,
                          p.shape.decode_context_max, p.shape.padded_batch)
        assert ROOF.step_time(p.shape) - ROOF.step_time(plain) == pytest.approx(
            ROOF.swap_time_s(p.shape), rel=1e-9)


def test_full_host_pool_falls_back_to_recompute() -> None:
    requests, plans, sched = run("swap", host_blocks=4)
    assert sched.num_swap_fallbacks > 0 and sched.num_recomputed_tokens > 0
    assert all(r.state is RequestState.FINISHED for r in requests)
    assert max(p.shape.swap_out_tokens for p in plans) <= 4 * 8
    _, _, none = run("swap", host_blocks=0)
    assert none.num_swap_fallbacks > 0


def test_swap_needs_a_paged_pool() -> None:
    with pytest.raises(ValueError, match="paged"):
        ContinuousScheduler(ContiguousAllocator(50, 8), 4, 64, max_model_len=100,
                            preemption="swap")
    with pytest.raises(ValueError, match="preemption"):
        ContinuousScheduler(PagedBlockManager(50, 8), 4, 64, preemption="drop")


def test_scenario_reports_swap_metrics() -> None:
    results = {}
    for mode in ("recompute", "swap"):
        scenario = Scenario.model_validate({
            "name": "swap", "scheduler": {"preemption": mode}, "kv": {"num_blocks": 400},
            "workload": {"arrivals": {"process": "poisson", "rate": 50.0}, "num_requests": 150,
                         "prompt_tokens": {"dist": "uniform", "low": 200, "high": 900},
                         "output_tokens": {"dist": "uniform", "low": 50, "high": 300}}})
        results[mode] = run_scenario(scenario, show_progress=False).summary
    rec, swap = results["recompute"], results["swap"]
    assert rec["total_preemptions"] > 0 and swap["total_preemptions"] > 0
    assert rec["recomputed_tokens"] > 0 and rec["swapped_out_bytes"] == 0
    assert swap["swapped_out_bytes"] > 0 and swap["swapped_in_bytes"] == swap["swapped_out_bytes"]
    assert swap["recomputed_tokens"] == 0
    assert rec["total_output_tokens"] == swap["total_output_tokens"]
