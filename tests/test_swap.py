"""Swap preemption: KV parked in host memory, computed tokens kept, the host-link copies
issued as KVTransfers and their time charged to the step that swaps."""

from __future__ import annotations

import random

import pytest

from sim.config.catalogue import get_hardware, get_model
from sim.config.costs import kv_bytes_per_token
from sim.config.link import Link
from sim.config.scenario import Scenario
from sim.core.contiguous import ContiguousAllocator
from sim.core.drive import run_steps
from sim.core.kv import PagedBlockManager
from sim.core.plan import StepShape
from sim.core.request import Request, RequestState
from sim.core.schedulers import ContinuousScheduler
from sim.experiments.run import run_scenario
from sim.experiments.slots import record_slots
from sim.latency.kv_transfer import kv_transfer_s, step_moves_s
from sim.latency.roofline import RooflineLatency
from sim.results.record.recorder import RunRecorder
from sim.serve.fidelity import simulate_measured
from sim.workload import make_requests
from sim.world.fleet import simulate_fleet
from sim.world.replica import ReplicaSetup

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


def test_swap_moves_carry_each_plans_swapped_bytes_at_the_host_link_price() -> None:
    """Each plan that swaps issues host-link KVTransfers (sync) holding exactly its shape's
    swapped slots; their idle-link price, passed to the latency model, is added whole."""
    per_token = kv_bytes_per_token(get_model("llama-3-8b"))
    host = get_hardware("h100-sxm").host_link
    kv = PagedBlockManager(60, 8, 0.01, host_swap_blocks=10_000, block_shard_bytes=8 * per_token)
    sched = ContinuousScheduler(kv, 16, 256, preemption="swap")
    priced: list[float] = []

    def check(plan, _start_s: float) -> None:
        moves = sched.take_transfers()
        assert all(m.sync and m.link == "host" for m in moves)
        assert {(m.src, m.dst) for m in moves} <= {("gpu", "swap"), ("swap", "gpu")}
        out = sum(m.num_blocks for m in moves if m.dst == "swap") * 8
        back = sum(m.num_blocks for m in moves if m.src == "swap") * 8
        assert (out, back) == (plan.shape.swap_out_tokens, plan.shape.swap_in_tokens)
        moved_s = step_moves_s({"host": host}, moves)
        assert moved_s == kv_transfer_s(host, (out + back) * per_token)
        if moves:
            assert moved_s > 0
            assert ROOF.step_time(plan.shape, moved_s) - ROOF.step_time(plan.shape) == \
                pytest.approx(moved_s, rel=1e-9)
            priced.append(moved_s)

    requests = [Request(i, a, p, o) for i, (a, p, o) in enumerate(workload())]
    run_steps(sched, requests, step_s=ROOF.step_time, check=check)
    assert len(priced) > 1


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


class _Spy:
    """A 10 ms step plus its sync KV moves' idle-link time; logs (moved_s, priced_s)."""

    name = "spy"

    def __init__(self) -> None:
        self.calls: list[tuple[float, float]] = []

    def step_time(self, shape: StepShape, moved_s: float = 0.0) -> float:
        self.calls.append((moved_s, 0.01 + moved_s))
        return self.calls[-1][1]

    def decode_run_s(self, shape: StepShape, steps: int) -> None:
        raise AssertionError("fast_forward is off")


class _Durations(RunRecorder):
    """A recorder that keeps every step's recorded duration, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.durations: list[float] = []

    def record_step(self, start_s: float, duration_s: float, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        self.durations.append(duration_s)
        super().record_step(start_s, duration_s, *args, **kwargs)


def _swapping_chat(seed: int, tier_blocks: int, link: Link) -> tuple[list[tuple], int]:
    """Prefix-sharing requests through a 23-block pool with swap preemption and an async
    host tier on one host link; returns each step's (moved_s, priced_s, recorded_s) and
    the preemptions."""
    rng = random.Random(seed)
    kv = PagedBlockManager(24, 16, enable_prefix_cache=True, offload_blocks=tier_blocks,
                           host_swap_blocks=200, block_shard_bytes=4000.0, offload_async=True)
    sched = ContinuousScheduler(kv, max_num_seqs=6, max_num_batched_tokens=256,
                                preemption="swap")
    requests, t = [], 0.0
    for i in range(40):
        t += rng.expovariate(20)
        ids = tuple(100 * rng.randrange(4) + j for j in range(rng.randint(1, 4))) + (10_000 + i,)
        requests.append(Request(i, t, len(ids) * 16, rng.randint(5, 60), prefix_block_ids=ids,
                                prefix_unit_tokens=16))
    spy, recorder = _Spy(), _Durations()
    simulate_fleet(requests, [ReplicaSetup(sched, spy, recorder, kv, links={"host": link},
                                           fast_forward=False)], None, None, recorder)
    assert all(r.state is RequestState.FINISHED for r in requests)
    assert len(spy.calls) == len(recorder.durations)
    steps = [(*c, d) for c, d in zip(spy.calls, recorder.durations, strict=True)]
    return steps, sum(r.num_preemptions for r in requests)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_swaps_share_the_host_link_with_tier_loads(seed: int) -> None:
    """Swaps and async tier loads cross one host link (issue 48's one path): a swapping
    step whose copies shared it with a load in flight ends later than its idle-link price,
    never earlier; with no tier (the link to themselves) or a free link, every step lasts
    exactly its price, to the bit."""
    slow = Link("pcie", 1e6, 1e-3, generation=4)
    shared, preempted = _swapping_chat(seed, 200, slow)
    assert preempted > 0 and any(moved for moved, _, _ in shared)
    late = [(moved, priced, took) for moved, priced, took in shared if took != priced]
    assert late and all(moved > 0 and took > priced for moved, priced, took in late)
    for tier_blocks, link in ((0, slow), (200, Link("nvlink", None, 1e-3))):
        steps, preempted = _swapping_chat(seed, tier_blocks, link)
        assert preempted > 0 and any(moved for moved, _, _ in steps)
        assert all(took == priced for _, priced, took in steps)


def test_every_one_replica_path_gives_swaps_their_host_link() -> None:
    """`servesim serve`'s fidelity replay and the slot picture build their replica by hand:
    each hands the scheduler's swaps the scenario's links (no 'host' link would fail)."""
    scenario = Scenario.model_validate({
        "name": "swap", "scheduler": {"preemption": "swap"}, "kv": {"num_blocks": 400},
        "workload": {"arrivals": {"process": "poisson", "rate": 50.0}, "num_requests": 150,
                     "prompt_tokens": {"dist": "uniform", "low": 200, "high": 900},
                     "output_tokens": {"dist": "uniform", "low": 50, "high": 300}}})
    summary = simulate_measured(scenario, list(make_requests(scenario.workload, scenario.seed)))
    assert summary["completed"] == 150 and summary["swapped_out_bytes"] > 0
    small = scenario.model_copy(update={"kv": scenario.kv.model_copy(
        update={"num_blocks": 120})})  # 8 slots of prompts up to 900 tokens: swaps
    assert record_slots(small, "continuous", slots=8, num_requests=30,
                        mean_output_tokens=100.0) is not None
