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
from sim.config.link import Link
from sim.config.scenario import Scenario
from sim.core.kv_transfer import KVTransfer
from sim.core.offload_tier import TierStack
from sim.core.paged import PagedBlockManager
from sim.core.plan import StepResult
from sim.core.request import Request
from sim.core.schedulers.continuous import ContinuousScheduler
from sim.experiments.run import run_scenario
from sim.latency.fixed import FixedLatency
from sim.latency.kv_transfer import kv_transfer_s, shared_finish_s
from sim.results.record.recorder import RunRecorder
from sim.world.fleet import simulate_fleet
from sim.world.replica import ReplicaSetup

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
    stack = TierStack((2, 2), block_shard_bytes=100.0)
    stack.spill([1, 2, 3])  # host keeps 2, 3; 1 goes down to disk
    assert 1 in stack.tiers[1] and 1 not in stack.tiers[0]
    stack.spill([4, 5])  # host drops 2, 3; disk (LRU) keeps 2, 3 and drops 1
    assert [n in stack for n in (1, 2, 3, 4, 5)] == [False, True, True, True, True]
    assert stack.run_length([4, 2, 5, 1, 3]) == 3
    stack.load([4, 2, 5])
    assert stack.last_loaded_blocks == (2, 1)
    # one transfer per tier, over that tier's link, carrying its blocks' shards
    assert stack.transfers(7) == (KVTransfer(7, 2, 200.0, "host", "gpu", "host", True),
                                  KVTransfer(7, 1, 100.0, "disk", "gpu", "disk", True))
    assert stack.tiers[1].num_dropped_blocks == 1 and stack.tiers[0].num_dropped_blocks == 3


def test_an_async_stack_issues_async_transfers_and_no_load_issues_none() -> None:
    stack = TierStack((4,), block_shard_bytes=8.0, asynchronous=True)
    stack.spill([1, 2])
    stack.load([1, 2])
    assert [t.sync for t in stack.transfers(0)] == [False]
    stack.load([])
    assert stack.transfers(0) == ()


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
                           block_shard_bytes=1000.0, offload_async=asynchronous)
    sched = ContinuousScheduler(kv, max_num_seqs=8, max_num_batched_tokens=512)
    _run_alone(sched, _request(0, (1, 2, 3, 4)), 0.0)
    _run_alone(sched, _request(1, (5, 6, 7, 8)), 1.0)  # evicts request 0's blocks
    assert kv.offload is not None and len(kv.offload) >= 1
    assert kv.cached_prefix_tokens(_request(2, (1, 2, 3, 4, 9))) == 64  # GPU + host tier
    return sched


def test_an_async_load_waits_for_the_world_and_lets_others_run() -> None:
    sched = _pool_with_spilled_prefix(asynchronous=True)
    sched.add(_request(2, (1, 2, 3, 4, 9)), 100.0)  # hits the tier
    sched.add(_request(3, (20,)), 100.0)  # no hit: runs at once
    plan = sched.schedule(100.0)
    assert plan is not None and plan.request_ids == (3,)
    (load,) = sched.take_transfers()  # the step does not wait for it; the request does
    assert (load.request_id, load.src, load.link, load.sync) == (2, "host", "host", False)
    assert load.shard_bytes == 1000.0 * load.num_blocks and sched.take_transfers() == ()
    # the core keeps no clock of its own: only the world's kv_landed admits the request
    assert sched.num_waiting == 1 and sched.next_wakeup(100.0) is None
    sched.on_step_done(plan, StepResult(), 100.0)
    assert sched.schedule(1e9) is None  # still loading, however late
    assert sched.decode_run() is None  # step by step while a load is in flight
    sched.kv_landed(load, 10.0)
    plan = sched.schedule(110.0)
    assert plan is not None and plan.request_ids == (2,)
    assert plan.context_tokens == (64,) and plan.num_new_tokens == (16,)  # loaded: computed
    offload = sched.kv.offload  # type: ignore[attr-defined]
    assert offload.total_load_s == 10.0


@pytest.mark.parametrize("asynchronous", [False, True])
def test_the_step_driver_lands_tier_loads_and_finishes(asynchronous: bool) -> None:
    """sim.core.drive (the engine's replay, the tests' run_steps) has no links: the loads
    land at once, and a request held by an async load alone still runs (it used to stop
    with a livelock: nothing runnable, no wakeup)."""
    from sim.core.drive import run_steps

    sched = _pool_with_spilled_prefix(asynchronous)
    hit = _request(2, (1, 2, 3, 4, 9))
    hit.arrival_s = 5.0
    done, plans = run_steps(sched, [hit])
    assert [r.request_id for r in done] == [2]
    assert plans[0].context_tokens == (64,)  # its prefix came back from the tier, not recomputed
    assert sched.take_transfers() == ()  # every move was taken and landed


def test_a_sync_load_is_a_transfer_of_the_admitting_step() -> None:
    sched = _pool_with_spilled_prefix(asynchronous=False)
    sched.add(_request(2, (1, 2, 3, 4, 9)), 100.0)
    sched.add(_request(3, (20,)), 100.0)
    plan = sched.schedule(100.0)
    assert plan is not None and plan.request_ids == (2, 3)
    (load,) = sched.take_transfers()
    assert load.request_id == 2 and load.sync


def test_an_aborted_load_frees_its_blocks() -> None:
    sched = _pool_with_spilled_prefix(asynchronous=True)
    sched.add(_request(2, (1, 2, 3, 4, 9)), 100.0)
    assert sched.schedule(100.0) is None  # parked while its blocks load
    used = sched.kv.num_used_blocks
    assert used > 0
    assert sched.abort(2, 101.0) is not None
    assert sched.kv.num_used_blocks == 0 and not sched.has_unfinished()
    (load,) = sched.take_transfers()
    sched.kv_landed(load, 1.0)  # landing after the abort changes nothing
    assert sched.schedule(102.0) is None and not sched.has_unfinished()


BYTES_PER_S = 1e6
HOST = Link("pcie", BYTES_PER_S, 1e-3, generation=4)


def _two_loads(asynchronous: bool, *, alone: bool = False) -> tuple[list[Request], float]:
    """Requests A and B each load 2 blocks back from the host tier at t = 10 s (B only
    if `alone`), through one replica whose host link carries both; returns them and the
    tier's summed load time."""
    kv = PagedBlockManager(7, 16, enable_prefix_cache=True, offload_blocks=50,
                           block_shard_bytes=4000.0, offload_async=asynchronous)
    sched = ContinuousScheduler(kv, max_num_seqs=8, max_num_batched_tokens=512)
    # each filler of 6 blocks evicts the whole GPU cache into the tier
    for i, ids in enumerate([(1, 2, 3), (20, 21, 22, 23, 24, 25), (5, 6, 7),
                             (30, 31, 32, 33, 34, 35)]):
        _run_alone(sched, _request(i, ids), float(i))
    wanted = [_request(10, (1, 2, 9)), _request(11, (5, 6, 19))]
    wanted = wanted[1:] if alone else wanted
    for req in wanted:
        req.arrival_s = 10.0
    recorder = RunRecorder()
    simulate_fleet(wanted, [ReplicaSetup(sched, FixedLatency(0.01), recorder, kv,
                                         links={"host": HOST})], None, None, recorder)
    assert kv.offload is not None
    return wanted, kv.offload.total_load_s


@pytest.mark.parametrize("asynchronous", [True, False])
def test_concurrent_loads_share_the_replicas_link(asynchronous: bool) -> None:
    """Two loads issued together on one host link land at shared_finish_s's times: later
    than either alone (each its latency + bytes / bandwidth)."""
    shard = 2 * 4000.0
    together, together_s = _two_loads(asynchronous)
    (alone,), alone_s = _two_loads(asynchronous, alone=True)
    shared = shared_finish_s(HOST, [10.0, 10.0], [shard, shard])
    assert shared[0] == shared[1] == pytest.approx(10.0 + 1e-3 + 2 * shard / BYTES_PER_S)
    assert alone_s == pytest.approx(kv_transfer_s(HOST, shard))
    assert together_s == pytest.approx(2 * (shared[0] - 10.0))
    for req in together:
        # async: admitted when its load lands; sync: the step computes once both landed
        landed = req.first_scheduled_s if asynchronous else req.first_token_s - 0.01
        assert landed == pytest.approx(shared[0])
    landed = alone.first_scheduled_s if asynchronous else alone.first_token_s - 0.01
    assert landed == pytest.approx(10.0 + kv_transfer_s(HOST, shard))
    assert landed < shared[0]


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
                           offload_disk_blocks=disk_blocks, block_shard_bytes=1.0,
                           offload_async=asynchronous)
    sched = ContinuousScheduler(kv, max_num_seqs=4, max_num_batched_tokens=64)
    for rid, (ids, output) in enumerate(requests):
        assert sched.add(Request(rid, 0.0, len(ids) * 16, output, prefix_block_ids=tuple(ids),
                                 prefix_unit_tokens=16), 0.0)
    per_byte_s = {"host": 0.05, "disk": 0.2}  # a stand-in world: each load alone on its link
    in_flight: list[tuple[float, KVTransfer]] = []  # async loads and when they land
    now, finished = 0.0, 0
    for _ in range(10_000):
        if not sched.has_unfinished():
            break
        plan = sched.schedule(now)
        wait_s = 0.0
        for move in sched.take_transfers():
            took_s = per_byte_s[move.link] * move.shard_bytes
            if move.sync:
                sched.kv_landed(move, took_s)
                wait_s = max(wait_s, took_s)
            else:
                in_flight.append((now + took_s, move))
        if plan is None:
            assert in_flight, "stuck with nothing to run and nothing loading"
            in_flight.sort(key=lambda e: e[0])
            now, move = in_flight.pop(0)
            sched.kv_landed(move, 0.0)
            continue
        now += 0.01 + wait_s
        for entry in [e for e in in_flight if e[0] <= now]:
            in_flight.remove(entry)
            sched.kv_landed(entry[1], 0.0)
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


def test_serve_refuses_async_loads_naming_the_field() -> None:
    """`servesim serve`'s wall-clock loop has no world to report a landing."""
    from sim.serve.simulated import build_simulated

    scenario = Scenario.model_validate({"kv": {"prefix_caching": True, "offload_host_gib": 4,
                                               "offload_load": "async"}})
    with pytest.raises(ValueError, match="kv.offload_load"):
        build_simulated(scenario, None)  # type: ignore[arg-type]
