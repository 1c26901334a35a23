"""The disk tier below the host tier and asynchronous tier loads: host drops go down to
disk (LRU per tier), a disk hit loads back priced over the disk's link, an async load
delays its own request's admission while others run, and mistakes exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cli import main
from sim.config.catalogue import link_from_fields
from sim.config.link import Link
from sim.config.scenario import Scenario
from sim.core.offload_tier import TierStack
from sim.core.paged import PagedBlockManager
from sim.core.plan import StepResult
from sim.core.request import Request
from sim.core.schedulers.continuous import ContinuousScheduler
from sim.experiments.run import run_scenario
from sim.latency.kv_transfer import kv_transfer_s, tier_load_s

CHAT: dict[str, Any] = {
    "arrivals": {"process": "poisson", "rate": 4.0},
    "prompt_tokens": {"dist": "lognormal", "mean": 1500, "cv": 0.5, "min": 64, "max": 3000},
    "output_tokens": {"dist": "lognormal", "mean": 150, "cv": 0.5, "min": 4, "max": 400},
    "conversations": {"turns": 6, "user_tokens": {"dist": "fixed", "value": 200},
                      "think_time_s": 20.0},
    "num_requests": 300}
BLOCK_GIB = 2 * 2**20 / 2**30  # one llama-3-8b block of 16 tokens: 2 MiB


def _chat(**kv_extra: Any) -> dict[str, Any]:
    kv: dict[str, Any] = {"prefix_caching": True, "num_blocks": 3000, **kv_extra}
    scenario = Scenario.model_validate({"seed": 2, "kv": kv, "workload": CHAT})
    return run_scenario(scenario, show_progress=False).summary


def _plain(summary: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in summary.items() if k != "simulation_wall_s"},
                      sort_keys=True)


def test_host_drops_go_down_to_disk_and_each_block_loads_from_the_highest_tier() -> None:
    stack = TierStack((2, 2), load_s=lambda blocks: 1.0 * blocks[0] + 10.0 * blocks[1])
    stack.spill([1, 2, 3])  # host keeps 2, 3; 1 goes down to disk
    assert 1 in stack.tiers[1] and 1 not in stack.tiers[0]
    stack.spill([4, 5])  # host drops 2, 3; disk (LRU) keeps 2, 3 and drops 1
    assert [n in stack for n in (1, 2, 3, 4, 5)] == [False, True, True, True, True]
    assert stack.run_length([4, 2, 5, 1, 3]) == 3
    stack.load([4, 2, 5])
    assert stack.last_loaded_blocks == (2, 1)
    assert stack.last_load_s == 2.0 + 10.0
    assert stack.tiers[1].num_dropped_blocks == 1 and stack.tiers[0].num_dropped_blocks == 3


def test_each_tier_is_priced_over_its_own_link() -> None:
    host = Link("pcie", 32e9, 0.0, generation=4)
    disk = link_from_fields({"kind": "pcie", "generation": 4, "bandwidth_bytes_per_s": 7e9,
                             "latency_s": 1e-4})
    block = 2.0 * 2**20
    assert tier_load_s((host, disk), block, (3, 0)) == kv_transfer_s(host, 3 * block)
    assert tier_load_s((host, disk), block, (0, 2)) == kv_transfer_s(disk, 2 * block)
    assert tier_load_s((host, disk), block, (3, 2)) == pytest.approx(
        3 * block / 32e9 + 2 * block / 7e9 + 1e-4)


def test_a_disk_tier_catches_what_a_small_host_tier_drops() -> None:
    small = _chat(offload_host_gib=2.0)
    disk = _chat(offload_host_gib=2.0, offload_disk_gib=64.0)
    tiers = disk["kv_offload"]["tiers"]
    assert list(tiers) == ["host", "disk"]
    host_tier, disk_tier = tiers["host"], tiers["disk"]
    assert host_tier["dropped_blocks"] > 0  # the host tier overflows ...
    # ... into the disk (a name the disk holds already is refreshed, not written again)
    assert 0 < disk_tier["written_blocks"] <= host_tier["dropped_blocks"]
    assert disk_tier["loaded_blocks"] > 0 and disk_tier["hit_rate"] > 0
    assert disk["prefix_hit_rate"] > small["prefix_hit_rate"]
    assert disk["kv_offload"]["loaded_blocks"] == (host_tier["loaded_blocks"]
                                                    + disk_tier["loaded_blocks"])
    assert sum(disk["kv_offload"]["hits_over_time"]["disk"]) == disk_tier["loaded_blocks"]


def test_a_slower_disk_costs_more_load_time() -> None:
    fast = _chat(offload_host_gib=2.0, offload_disk_gib=64.0)
    slow = _chat(offload_host_gib=2.0, offload_disk_gib=64.0, offload_disk_link={
        "kind": "pcie", "generation": 4, "bandwidth_bytes_per_s": 5e8, "latency_s": 1e-3})
    assert slow["kv_offload"]["load_s"] > 2 * fast["kv_offload"]["load_s"]


def test_async_without_a_tier_is_no_tier_bit_for_bit() -> None:
    assert _plain(_chat(offload_load="async", offload_host_gib=0)) == _plain(_chat())


def test_async_loads_finish_every_request() -> None:
    sync = _chat(offload_host_gib=64.0)
    lazy = _chat(offload_host_gib=64.0, offload_load="async")
    assert lazy["kv_offload"]["load"] == "async"
    assert lazy["completed"] == sync["completed"] == CHAT["num_requests"]
    assert lazy["kv_offload"]["loaded_blocks"] > 0


def _request(rid: int, ids: tuple[int, ...], output: int = 1) -> Request:
    return Request(rid, 0.0, len(ids) * 16, output, prefix_block_ids=ids, prefix_unit_tokens=16)


def _run_alone(sched: ContinuousScheduler, req: Request, now: float) -> None:
    sched.add(req, now)
    plan = sched.schedule(now)
    assert plan is not None
    assert sched.on_step_done(plan, StepResult(), now)  # one output token: done


def _pool_with_spilled_prefix(asynchronous: bool) -> ContinuousScheduler:
    """A 6-block pool where request 1 evicted some of request 0's blocks to the host tier."""
    kv = PagedBlockManager(7, 16, enable_prefix_cache=True, offload_blocks=50,
                           offload_load_s=lambda blocks: 10.0, offload_async=asynchronous)
    sched = ContinuousScheduler(kv, max_num_seqs=8, max_num_batched_tokens=512)
    _run_alone(sched, _request(0, (1, 2, 3, 4)), 0.0)
    _run_alone(sched, _request(1, (5, 6, 7, 8)), 1.0)  # evicts request 0's blocks
    assert kv.offload is not None and len(kv.offload) >= 1
    assert kv.cached_prefix_tokens(_request(2, (1, 2, 3, 4, 9))) == 64  # GPU + host tier
    return sched


def test_an_async_load_delays_its_request_and_lets_others_run() -> None:
    sched = _pool_with_spilled_prefix(asynchronous=True)
    sched.add(_request(2, (1, 2, 3, 4, 9)), 100.0)  # hits the tier
    sched.add(_request(3, (20,)), 100.0)  # no hit: runs at once
    plan = sched.schedule(100.0)
    assert plan is not None and plan.request_ids == (3,)
    assert plan.shape.tier_load_s == 0.0  # the step does not wait for the load
    assert sched.num_waiting == 1 and sched.next_wakeup(100.0) == 110.0
    sched.on_step_done(plan, StepResult(), 100.0)
    assert sched.schedule(105.0) is None  # still loading
    plan = sched.schedule(110.0)
    assert plan is not None and plan.request_ids == (2,)
    assert plan.context_tokens == (64,) and plan.num_new_tokens == (16,)  # loaded: computed


def test_a_sync_load_lengthens_the_admitting_step() -> None:
    sched = _pool_with_spilled_prefix(asynchronous=False)
    sched.add(_request(2, (1, 2, 3, 4, 9)), 100.0)
    sched.add(_request(3, (20,)), 100.0)
    plan = sched.schedule(100.0)
    assert plan is not None and plan.request_ids == (2, 3)
    assert plan.shape.tier_load_s == 10.0


def test_an_aborted_load_frees_its_blocks() -> None:
    sched = _pool_with_spilled_prefix(asynchronous=True)
    sched.add(_request(2, (1, 2, 3, 4, 9)), 100.0)
    assert sched.schedule(100.0) is None  # parked while its blocks load
    used = sched.kv.num_used_blocks
    assert used > 0
    assert sched.abort(2, 101.0) is not None
    assert sched.kv.num_used_blocks == 0 and not sched.has_unfinished()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 5), min_size=1, max_size=7),
                          st.integers(1, 5)), min_size=1, max_size=20),
       st.integers(1, 20), st.integers(0, 20), st.booleans())
def test_every_request_finishes_and_blocks_stay_conserved(
        requests: list[tuple[list[int], int]], host_blocks: int, disk_blocks: int,
        asynchronous: bool) -> None:
    """Random prompts sharing prefixes through a 11-block pool with tiers and slow loads:
    no request is lost or stuck, the pool's invariants hold after every step, and at the
    end every block is free again."""
    kv = PagedBlockManager(12, 16, enable_prefix_cache=True, offload_blocks=host_blocks,
                           offload_disk_blocks=disk_blocks,
                           offload_load_s=lambda blocks: 0.05 * blocks[0] + 0.2 * sum(blocks[1:]),
                           offload_async=asynchronous)
    sched = ContinuousScheduler(kv, max_num_seqs=4, max_num_batched_tokens=64)
    for rid, (ids, output) in enumerate(requests):
        assert sched.add(Request(rid, 0.0, len(ids) * 16, output, prefix_block_ids=tuple(ids),
                                 prefix_unit_tokens=16), 0.0)
    now, finished = 0.0, 0
    for _ in range(10_000):
        if not sched.has_unfinished():
            break
        plan = sched.schedule(now)
        if plan is None:
            wake = sched.next_wakeup(now)
            assert wake is not None and wake >= now, "stuck with nothing to run"
            now = wake
            continue
        now += 0.01 + plan.shape.tier_load_s
        finished += len(sched.on_step_done(plan, StepResult(), now))
        kv.check_invariants()
    assert finished == len(requests)
    assert kv.num_used_blocks == 0


@pytest.mark.parametrize(("kv", "field"), [
    ("{prefix_caching: true, offload_host_gib: 4, offload_disk_gib: 1.0e-9}",
     "kv.offload_disk_gib"),
    ("{prefix_caching: true, offload_disk_gib: 4}", "kv.offload_disk_gib"),
    ("{prefix_caching: true, offload_host_gib: 4, offload_load: later}", "offload_load"),
])
def test_bad_tiers_exit_2_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           kv: str, field: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(f"kv: {kv}\n")
    code = main(["run", str(path), "--out", str(tmp_path / "out"), "--no-plots", "--quiet"])
    text = capsys.readouterr()
    assert code == 2
    assert field in text.err + text.out
    assert "Traceback" not in text.err + text.out


def test_one_block_of_disk_is_enough() -> None:
    summary = _chat(offload_host_gib=BLOCK_GIB, offload_disk_gib=BLOCK_GIB)
    assert [t["capacity_blocks"] for t in summary["kv_offload"]["tiers"].values()] == [1, 1]
