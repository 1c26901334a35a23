"""Scheduler.abort: a request dropped between steps leaves every later plan and frees its KV,
for every policy; the others finish as if it had never run on."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sim.core.contiguous import ContiguousAllocator
from sim.core.drive import EMPTY, default_step_s
from sim.core.kv import KVManager, PagedBlockManager
from sim.core.plan import StepPlan
from sim.core.request import ABORTED_REASON, Request, RequestState
from sim.core.schedulers import ContinuousScheduler, DynamicScheduler, StaticScheduler
from sim.core.schedulers.base import Scheduler


def serve(sched: Scheduler, kv: KVManager, requests: list[Request],
          abort_at: dict[int, list[int]], max_steps: int = 5000) -> list[StepPlan]:
    """All requests at t=0; before step i, abort the ids in abort_at[i]; checks the pool."""
    for r in requests:
        assert sched.add(r, 0.0)
    sched.close(0.0)
    now, plans = 0.0, []
    for i in range(max_steps):
        for rid in abort_at.get(i, []):
            held = sched.kv_blocks_used
            req = sched.abort(rid, now)
            assert req is not None and req.state is RequestState.ABORTED
            assert req.rejection_reason == ABORTED_REASON and req.finish_s == now
            assert req.is_done
            assert sched.kv_blocks_used <= held
            assert sched.abort(rid, now) is None  # once only
            kv.check_invariants()
        plan = sched.schedule(now)
        if plan is None:
            if not sched.has_unfinished():
                break
            wake = sched.next_wakeup(now)
            assert wake is not None, "livelock"
            now = max(now, wake)
            continue
        plans.append(plan)
        now += default_step_s(plan.shape)
        sched.on_step_done(plan, EMPTY, now)
        kv.check_invariants()
    assert not sched.has_unfinished()
    assert sched.kv_blocks_used == 0  # nothing leaks
    return plans


def after(plans: list[StepPlan], rid: int) -> int:
    """How many plans name `rid`."""
    return sum(rid in p.request_ids for p in plans)


Build = Callable[[], tuple[Scheduler, KVManager]]


def continuous(preemption: str = "recompute", blocks: int = 200) -> Build:
    def build() -> tuple[Scheduler, KVManager]:
        kv = PagedBlockManager(blocks, 4, 0.0, enable_prefix_cache=True,
                               host_swap_blocks=400 if preemption == "swap" else 0)
        return ContinuousScheduler(kv, max_num_seqs=8, max_num_batched_tokens=32,
                                   preemption=preemption), kv
    return build


@pytest.mark.parametrize("build", [continuous()], ids=["continuous"])
def test_continuous_abort_running_and_waiting(build: Build) -> None:
    requests = [Request(i, 0.0, 20 + i, 30) for i in range(12)]
    sched, kv = build()
    # step 3: request 1 runs (8 seats), request 10 waits
    plans = serve(sched, kv, requests, {3: [1, 10]})
    assert after(plans[:3], 1) == 3  # it ran before
    assert all(1 not in p.request_ids and 10 not in p.request_ids for p in plans[3:])
    assert requests[1].state is RequestState.ABORTED
    assert requests[10].state is RequestState.ABORTED and requests[10].first_scheduled_s is None
    others = [r for r in requests if r.request_id not in (1, 10)]
    assert all(r.state is RequestState.FINISHED and r.num_output_done == 30 for r in others)


def test_continuous_abort_frees_blocks_at_once() -> None:
    sched, kv = continuous()()
    a, b = Request(0, 0.0, 40, 50), Request(1, 0.0, 40, 50)
    sched.add(a, 0.0)
    sched.add(b, 0.0)
    plan = sched.schedule(0.0)
    assert plan is not None
    sched.on_step_done(plan, EMPTY, 0.01)
    before = kv.num_used_blocks
    own = len(kv.block_table(1))
    sched.abort(1, 0.01)
    assert kv.num_used_blocks == before - own  # no prefix shared: every block back
    assert sched.num_running == 1


def test_continuous_abort_a_preempted_swapped_request() -> None:
    # tight memory: long outputs preempt by swap; abort whoever sits swapped out
    sched, kv = continuous("swap", blocks=40)()
    requests = [Request(i, 0.0, 16, 60) for i in range(6)]
    for r in requests:
        sched.add(r, 0.0)
    now = 0.0
    assert isinstance(kv, PagedBlockManager)
    for _ in range(500):
        swapped = [r.request_id for r in requests if kv.is_swapped(r.request_id)]
        if swapped:
            break
        plan = sched.schedule(now)
        assert plan is not None
        now += 0.01
        sched.on_step_done(plan, EMPTY, now)
    assert swapped, "the pool never ran short"
    parked = kv.num_host_blocks_used
    sched.abort(swapped[0], now)
    assert not kv.is_swapped(swapped[0]) and kv.num_host_blocks_used < parked
    kv.check_invariants()  # the host pool's count matches what is parked
    rest = [r for r in requests if r.request_id != swapped[0]]
    plans = serve(sched, kv, [], {})
    assert all(swapped[0] not in p.request_ids for p in plans)
    assert all(r.state is RequestState.FINISHED for r in rest)
    assert kv.num_host_blocks_used == 0


@pytest.mark.parametrize("policy", [StaticScheduler, DynamicScheduler])
def test_request_level_abort(policy: type[StaticScheduler]) -> None:
    kv = ContiguousAllocator(2000, 4, watermark=0.0)
    sched = policy(kv, batch_size=3, max_wait_s=0.0, max_model_len=256)
    requests = [Request(i, 0.0, 10, 8 + i) for i in range(5)]
    # the first batch is 0, 1, 2; before step 2 abort live member 2 and waiting request 4
    plans = serve(sched, kv, requests, {2: [2, 4]})
    assert [p.request_ids for p in plans[:2]] == [(0, 1, 2)] * 2
    assert all(2 not in p.request_ids for p in plans[2:])
    assert all(4 not in p.request_ids for p in plans)
    # the batch still runs to its longest live member (1: 9 tokens), then 3 runs alone
    assert [p.request_ids for p in plans[2:9]] == [(0, 1)] * 6 + [(1,)]
    assert all(p.request_ids == (3,) for p in plans[9:])
    assert [r.state for r in requests] == [RequestState.FINISHED] * 2 + [
        RequestState.ABORTED, RequestState.FINISHED, RequestState.ABORTED]


def test_request_level_abort_of_every_member_ends_the_batch() -> None:
    kv = ContiguousAllocator(2000, 4, watermark=0.0)
    sched = StaticScheduler(kv, batch_size=2, max_model_len=256)
    requests = [Request(i, 0.0, 10, 20) for i in range(4)]
    plans = serve(sched, kv, requests, {1: [0, 1]})
    assert plans[0].request_ids == (0, 1)
    assert all(p.request_ids == (2, 3) for p in plans[1:])  # the next batch launched
    assert len(plans) == 1 + 20


def test_the_simpy_world_aborts_between_steps_and_records_it() -> None:
    import simpy
    from test_des import FixedLatency

    from sim.results.record.recorder import RunRecorder
    from sim.world.replica import Replica

    env = simpy.Environment()
    sched, kv = continuous()()
    recorder = RunRecorder()
    replica = Replica(env, sched, FixedLatency(0.01), recorder)
    env.process(replica.run())
    requests = [Request(i, 0.0, 8, 40) for i in range(3)]
    for r in requests:
        replica.submit(r)

    def client():  # noqa: ANN202 - a SimPy process
        yield env.timeout(0.055)  # mid-step: applied when the step ends, at 0.06
        replica.abort(1)

    env.process(client())
    env.run()
    frame = recorder.requests_frame().set_index("request_id")
    assert frame.loc[1, "status"] == "rejected"
    assert frame.loc[1, "rejection_reason"] == ABORTED_REASON
    assert frame.loc[1, "finish_s"] == pytest.approx(0.06)
    assert (frame.loc[[0, 2], "status"] == "finished").all()
    assert kv.num_used_blocks == 0


def test_the_engine_aborts_and_forgets_the_request() -> None:
    pytest.importorskip("torch")
    from test_engine_loop import scenario

    from gpu_engine.setup import build_engine
    from sim.assemble import build_latency

    sc = scenario()
    engine = build_engine(sc, latency=build_latency(sc)).engine
    for i in range(3):
        assert engine.add_request(Request(i, 0.0, 10, 12), now=0.0)
    for _ in range(3):
        engine.step()
    assert engine.abort(1) is not None
    assert engine.abort(1) is None
    with pytest.raises(KeyError):
        engine.output_ids(1)
    while engine.step() is not None:
        pass
    assert len(engine.output_ids(0)) == len(engine.output_ids(2)) == 12
    assert engine.scheduler.kv_blocks_used == 0
