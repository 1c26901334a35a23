"""Fast-forward: a run of decode steps as one SimPy event equals step by step, float for float.

The oracle is the same world with `fast_forward=False` (one event per step).
Random workloads cover what can end or change a run: arrivals (also at the
exact instant a step ends: power-of-two step times and arrival grids), the
first finisher, a pool that runs dry (recompute and swap preemption), a
queue held back by seats, budget or KV blocks, prefix caching, chunked
prefill on and off, CUDA-graph padding, contiguous pools, request-level
batching (static, dynamic, padded prompts or not), fleets behind each router
(whose recorder must get the replicas' steps in step by step's global order,
ties included), and the TTFT diagnosis observing it all.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config.catalogue import get_hardware, get_model
from sim.core.contiguous import ContiguousAllocator
from sim.core.decode_run import decode_shape
from sim.core.kv import PagedBlockManager
from sim.core.plan import StepShape
from sim.core.request import Request, RequestState
from sim.core.schedulers import ContinuousScheduler, DynamicScheduler, StaticScheduler
from sim.latency import each_step_s
from sim.latency.roofline import RooflineLatency
from sim.latency.table import TableFit, TableLatency
from sim.observe.observer import ReplicaObserver
from sim.results.record.recorder import RunRecorder
from sim.world.fleet import simulate_fleet
from sim.world.replica import ReplicaSetup
from sim.world.router import build_router, router_rng

ROOF = RooflineLatency(get_model("llama-3-8b"), get_hardware("h100-sxm"))
# as a scenario builds it under async scheduling: part of the host work overlaps the next
# step, and the step's tokens leave output_lag_s after it
ROOF_LAG = RooflineLatency(get_model("llama-3-8b"), get_hardware("h100-sxm"),
                           host_serial_share=0.3)


class PowerOfTwo:
    """Step times on a 2^-10 s grid: sums stay exact, so arrivals tie with step ends."""

    name = "power-of-two"

    def step_time(self, shape: StepShape, moved_s: float = 0.0) -> float:
        return (1 + shape.num_tokens // 8 + shape.decode_context_max // 64) / 1024 + moved_s

    def decode_run_s(self, shape: StepShape, steps: int) -> np.ndarray:
        return each_step_s(self.step_time, shape, steps)


@st.composite
def workloads(draw: st.DrawFn) -> list[tuple[float, int, int, int]]:
    """(arrival s, prompt, output, prefix group) rows, in arrival order."""
    n = draw(st.integers(1, 40))
    grid = draw(st.sampled_from([0.0, 1 / 256, 1 / 64]))  # 0: exponential gaps
    rows, t = [], 0.0
    for _ in range(n):
        if grid:
            t += grid * draw(st.integers(0, 8))
        else:
            t += draw(st.floats(0.0, 0.3))
        rows.append((t, draw(st.integers(1, 300)), draw(st.integers(1, 120)),
                     draw(st.integers(0, 3))))
    return rows


def requests(rows: list[tuple[float, int, int, int]]) -> list[Request]:
    # group > 0: prompts sharing the group's leading tokens, so prefix hits happen
    return [Request(i, a, p, o, prompt_token_ids=tuple(range(g * 1000, g * 1000 + p))
                    if g else None) for i, (a, p, o, g) in enumerate(rows)]


@st.composite
def replicas(draw: st.DrawFn) -> dict:
    policy = draw(st.sampled_from(["continuous", "continuous", "continuous", "static",
                                   "static", "dynamic", "dynamic", "contiguous"]))
    return {"policy": policy, "blocks": draw(st.integers(30, 600)),
            "block": draw(st.sampled_from([1, 4, 16])), "seqs": draw(st.integers(1, 24)),
            "budget": draw(st.integers(16, 600)), "chunked": draw(st.booleans()),
            "prefix": draw(st.booleans()), "swap": draw(st.booleans()),
            "watermark": draw(st.sampled_from([0.0, 0.01, 0.1])),
            "graphs": draw(st.booleans()), "batch": draw(st.integers(1, 6)),
            "pad": draw(st.booleans()), "wait": draw(st.sampled_from([None, 0.0, 0.05])),
            "async": draw(st.booleans())}


def build(c: dict):  # noqa: ANN201 - (scheduler, kv)
    if c["policy"] in ("static", "dynamic"):
        kv = ContiguousAllocator(c["blocks"] * 4, c["block"], 0.0)
        pad, wait = c.get("pad", True), c.get("wait")
        if c["policy"] == "static":
            return StaticScheduler(kv, c["batch"], wait, max_model_len=500, pad_prompts=pad), kv
        return DynamicScheduler(kv, c["batch"], 0.02 if wait is None else wait,
                                max_model_len=500, pad_prompts=pad), kv
    # async scheduling (vLLM's default) where it applies: not with swap preemption
    overlap = c.get("async", False)
    if c["policy"] == "contiguous":
        kv = ContiguousAllocator(c["blocks"], c["block"], c["watermark"])
        return ContinuousScheduler(kv, c["seqs"], max(c["budget"], c["seqs"]), c["chunked"],
                                   500, cuda_graphs=c["graphs"], async_scheduling=overlap), kv
    kv = PagedBlockManager(c["blocks"], c["block"], c["watermark"],
                           enable_prefix_cache=c["prefix"],
                           host_swap_blocks=200 if c["swap"] else 0)
    return ContinuousScheduler(kv, c["seqs"], max(c["budget"], c["seqs"]), c["chunked"], 500,
                               preemption="swap" if c["swap"] else "recompute",
                               cuda_graphs=c["graphs"],
                               async_scheduling=overlap and not c["swap"]), kv


def simulate(rows: list, config: dict, count: int, router: str, latency, fast: bool):  # noqa: ANN001, ANN201
    reqs = requests(rows)
    fleet = RunRecorder()
    setups = []
    for _ in range(count):
        scheduler, kv = build(config)
        setups.append(ReplicaSetup(scheduler, latency, fleet if count == 1 else RunRecorder(),
                                   kv, observer=ReplicaObserver(scheduler, latency.step_time),
                                   fast_forward=fast))
    end_s = simulate_fleet(iter(reqs), setups, build_router(router), router_rng(0), fleet)
    return reqs, fleet, setups, end_s


def _same(a: object, b: object) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float)
                      and math.isnan(a) and math.isnan(b))


def stamps(r: Request) -> tuple:
    return (r.state, r.first_scheduled_s, r.first_token_s, r.finish_s, r.num_preemptions,
            r.prefix_hit_tokens, r.num_output_done)


@settings(max_examples=300, deadline=None)
@given(workloads(), replicas(), st.sampled_from([1, 1, 2, 3, 4]),
       st.sampled_from(["round_robin", "least_outstanding", "least_kv", "power_of_two",
                        "prefix_aware"]),
       st.sampled_from(["roofline", "power-of-two"]))
def test_fast_forward_equals_step_by_step(rows, config, count, router, latency_name) -> None:
    assert_same(rows, config, count, router, ROOF if latency_name == "roofline" else PowerOfTwo())


def test_a_run_ending_where_no_delay_from_its_start_lands() -> None:
    """From 0.038... s no SimPy delay reaches the run's float sum 0.3497604669134328 s (only
    every other float of that binade is now + delay): the event must sit at the sum itself."""
    rows = [(0.0, 1, 1, 0), (0.0, 1, 2, 0), (0.0, 1, 2, 0), (0.0, 1, 45, 0), (0.0, 1, 2, 0)]
    config = {"policy": "continuous", "blocks": 30, "block": 4, "seqs": 2, "budget": 16,
              "chunked": False, "prefix": False, "swap": False, "watermark": 0.0,
              "graphs": False, "batch": 1}
    assert_same(rows, config, 1, "round_robin", ROOF)


def assert_same(rows: list, config: dict, count: int, router: str, latency) -> None:  # noqa: ANN001
    step = simulate(rows, config, count, router, latency, False)
    fast = simulate(rows, config, count, router, latency, True)
    assert [stamps(r) for r in fast[0]] == [stamps(r) for r in step[0]]
    assert fast[3] == step[3]  # the simulated end time
    for a, b in zip([fast[1], *(s.recorder for s in fast[2])],
                    [step[1], *(s.recorder for s in step[2])], strict=True):
        sa, sb = a.summary(), b.summary()
        assert sa.keys() == sb.keys()
        assert [k for k in sa if not _same(sa[k], sb[k])] == []
        assert a.steps_frame().equals(b.steps_frame())
        assert a.requests_frame().equals(b.requests_frame())
    for a, b in zip(fast[2], step[2], strict=True):
        assert a.observer.diagnoser.frame().equals(b.observer.diagnoser.frame())


@pytest.mark.parametrize("overlap", [False, True])
def test_long_decode_runs_are_taken_and_cut_by_arrivals(overlap: bool) -> None:
    """Not vacuous: on a quiet replica most steps go by in runs, and arrivals cut them, with
    async scheduling too (a run then begins with the plan made ahead)."""
    rows = [(0.5 * i, 50, 400, 0) for i in range(20)]
    config = {"policy": "continuous", "blocks": 4000, "block": 16, "seqs": 32, "budget": 512,
              "chunked": True, "prefix": False, "swap": False, "watermark": 0.0,
              "graphs": True, "batch": 1, "async": overlap}
    assert_same(rows, config, 1, "round_robin", ROOF)
    scheduler, kv = build(config)
    assert scheduler.async_scheduling is overlap
    runs = []
    advance = scheduler.advance_decodes

    def spy(run, begin: int, end: int, step_end_s):  # noqa: ANN001, ANN202
        runs.append((run.steps, end - begin))
        return advance(run, begin, end, step_end_s)

    scheduler.advance_decodes = spy  # type: ignore[method-assign]
    recorder = RunRecorder()
    simulate_fleet(iter(requests(rows)), [ReplicaSetup(scheduler, ROOF, recorder, kv)], None,
                   None, recorder)
    in_runs = sum(steps for _, steps in runs)
    assert in_runs > 0.8 * recorder.num_steps
    assert any(steps < offered for offered, steps in runs), "an arrival must cut a run"


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 300), st.integers(0, 10**6), st.integers(0, 400), st.integers(1, 500),
       st.sampled_from(["llama-3-8b", "mixtral-8x7b", "qwen2.5-1.5b"]), st.sampled_from([1, 2]),
       st.floats(0.0, 0.05), st.floats(0.0, 1e-4), st.floats(0.0, 1e-6))
def test_batched_pricing_equals_step_time(n, context_sum, pad, steps, model, tp, a, b, padded
                                          ) -> None:
    shape = StepShape(num_decodes=n, decode_context_sum=context_sum,
                      decode_context_max=context_sum // n, padded_batch=n + pad)
    roof = RooflineLatency(get_model(model), get_hardware("h100-sxm"), tp=tp)
    table = TableLatency(TableFit("device", (0, 64, 512), 1.0 + a, (a, b * 1e3), b, b, a, a,
                                  padded), cpu_step_s=a / 3, cpu_seq_s=b / 7)
    for latency in (roof, table):
        fast = latency.decode_run_s(shape, steps)
        assert fast.tolist() == [latency.step_time(decode_shape(shape, s))
                                 for s in range(steps)]


def test_decode_shape_keeps_every_other_field() -> None:
    """decode_shape builds the shape field by field: a field it forgot would fall back to
    its default here (every field set, none to its default)."""
    values = iter(range(1, 100))
    shape = StepShape(*((next(values),) if isinstance(StepShape._field_defaults[f], tuple)
                        else next(values) for f in StepShape._fields))
    assert decode_shape(shape, 0) == shape
    assert decode_shape(shape, 3) == shape._replace(
        decode_context_sum=shape.decode_context_sum + 3 * shape.num_decodes,
        decode_context_max=shape.decode_context_max + 3)


def by_key(log: list) -> dict:
    """A plan log's tables by (start, sequences, how many such plans came before): with
    async scheduling two plans of the same sequences may be made at one instant."""
    seen: dict = {}
    out = {}
    for now, ids, tables in log:
        k = seen[(now, ids)] = seen.get((now, ids), -1) + 1
        out[(now, ids, k)] = tables
    return out


def logged(scheduler: ContinuousScheduler, log: list) -> None:
    """Log every plan schedule() makes: its start, sequences and block tables."""
    schedule = scheduler.schedule

    def spy(now: float):  # noqa: ANN202
        plan = schedule(now)
        if plan is not None:
            log.append((now, plan.request_ids, plan.block_tables))
        return plan

    scheduler.schedule = spy  # type: ignore[method-assign]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 90), min_size=2, max_size=12), st.integers(1, 40),
       st.sampled_from([1, 4, 16]), st.booleans(), st.booleans(), st.floats(0.05, 2.0),
       st.booleans())
def test_a_run_goes_on_across_finishes_freeing_as_step_by_step(outputs, prompt, block, prefix,
                                                                graphs, gap_s, overlap) -> None:
    """Many finishers inside one run (a quiet queue), then a second wave that reuses the
    blocks they freed: every later plan's block tables, every request's timestamps and
    the recorders equal step by step's (so the free order and the finish times do). With
    async scheduling (`overlap`) a step's finishers free their blocks after the next
    step's plan took its own, and their tokens leave output_lag_s later."""
    rows = [(0.0, prompt, o, 1 if prefix else 0) for o in outputs]
    rows += [(gap_s + 0.01 * i, prompt + 5, o, 1 if prefix else 0) for i, o in enumerate(outputs)]
    config = {"policy": "continuous", "blocks": 400, "block": block, "seqs": 64, "budget": 2048,
              "chunked": True, "prefix": prefix, "swap": False, "watermark": 0.0,
              "graphs": graphs, "batch": 1, "async": overlap}
    results, plans, segments = [], [], []
    for fast in (False, True):
        scheduler, kv = build(config)
        log: list = []
        logged(scheduler, log)
        advance = scheduler.advance_decodes

        def spy(run, begin, end, step_end_s, advance=advance):  # noqa: ANN001, ANN202
            ran = advance(run, begin, end, step_end_s)
            segments.extend(ran)
            return ran

        scheduler.advance_decodes = spy  # type: ignore[method-assign]
        reqs = requests(rows)
        recorder = RunRecorder()
        end_s = simulate_fleet(iter(reqs), [ReplicaSetup(
            scheduler, ROOF, recorder, kv, observer=ReplicaObserver(scheduler, ROOF.step_time),
            fast_forward=fast)], None, None, recorder)
        results.append(([stamps(r) for r in reqs], end_s, recorder.summary(),
                         recorder.requests_frame(), recorder.steps_frame()))
        plans.append(log)
    step, fast = results
    assert fast[0] == step[0] and fast[1] == step[1]
    assert [k for k in step[2] if not _same(step[2][k], fast[2][k])] == []
    assert fast[3].equals(step[3]) and fast[4].equals(step[4])
    by_start = by_key(plans[0])
    assert all(by_start[key] == tables for key, tables in by_key(plans[1]).items())
    # several distinct finish steps: one run spans finishes (async: a run stops a step
    # before its last finisher's, so one more distinct step is needed)
    if len(set(outputs)) > 2 + overlap:
        assert sum(s.finish is not None for s in segments) >= 2


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["static", "dynamic"]), st.booleans(), st.integers(2, 6),
       st.lists(st.integers(1, 80), min_size=4, max_size=20))
def test_a_launched_batch_decodes_as_one_run(policy, pad, batch, outputs) -> None:
    """Not vacuous: after its prefill a request-level batch's decode steps are one run to its
    longest member's last step, across its other members' finishes, arrivals or not; both
    paths agree."""
    rows = [(0.003 * i, 10 + 11 * i, o, 0) for i, o in enumerate(outputs)]
    config = {"policy": policy, "blocks": 2000, "block": 16, "seqs": 1, "budget": 16,
              "chunked": False, "prefix": False, "swap": False, "watermark": 0.0,
              "graphs": False, "batch": batch, "pad": pad, "wait": 0.01}
    assert_same(rows, config, 1, "round_robin", ROOF)
    scheduler, kv = build(config)
    ran: list = []
    advance = scheduler.advance_decodes

    def spy(run, begin, end, step_end_s):  # noqa: ANN001, ANN202
        ran.append((scheduler.batch, run.steps, advance(run, begin, end, step_end_s)))
        return ran[-1][2]

    scheduler.advance_decodes = spy  # type: ignore[method-assign]
    launched: list = []
    launch = scheduler._launch  # noqa: SLF001

    def spy_launch(now: float):  # noqa: ANN202
        launched.append(launch(now))
        return launched[-1]

    scheduler._launch = spy_launch  # type: ignore[method-assign]  # noqa: SLF001
    recorder = RunRecorder()
    simulate_fleet(iter(requests(rows)), [ReplicaSetup(scheduler, ROOF, recorder, kv)], None,
                   None, recorder)
    runs = {}
    for batch_ran, steps, segments in ran:  # one run per batch, applied in one or more calls
        runs.setdefault(id(batch_ran), (steps, []))[1].extend(segments)
    for one in launched:
        longest = max(r.output_tokens for r in one.members)
        if longest < 3:  # one decode step at most: no run
            assert id(one) not in runs
            continue
        steps, segments = runs[id(one)]
        assert steps == longest - 1  # every decode step after the prefill's first token
        finishes = {r.output_tokens for r in one.members if r.output_tokens > 1}
        assert sum(s.finish is not None for s in segments) == len(finishes)
        assert sum(s.run.steps + (s.finish is not None) for s in segments) == steps
    assert recorder.num_steps == sum(max(r.output_tokens for r in one.members)
                                     for one in launched)


def test_runs_span_finishers_at_a_quiet_rate() -> None:
    """Not vacuous: with nobody waiting a run carries on past its finishers."""
    rows = [(0.0, 20, 10 + 7 * i, 0) for i in range(12)]
    scheduler, kv = build({"policy": "continuous", "blocks": 2000, "block": 16, "seqs": 32,
                           "budget": 512, "chunked": True, "prefix": False, "swap": False,
                           "watermark": 0.0, "graphs": False, "batch": 1})
    ran: list = []
    advance = scheduler.advance_decodes

    def spy(run, begin, end, step_end_s):  # noqa: ANN001, ANN202
        ran.append(advance(run, begin, end, step_end_s))
        return ran[-1]

    scheduler.advance_decodes = spy  # type: ignore[method-assign]
    recorder = RunRecorder()
    simulate_fleet(iter(requests(rows)), [ReplicaSetup(scheduler, ROOF, recorder, kv)], None,
                   None, recorder)
    assert len(ran) == 1  # one run after the prefill step, to the last finisher
    assert sum(s.finish is not None for s in ran[0]) == 12
    assert recorder.num_steps == 1 + 10 + 7 * 11 - 1


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(["round_robin", "least_outstanding", "least_kv", "power_of_two",
                        "prefix_aware"]), st.sampled_from([2, 4]), st.booleans())
def test_replicas_behind_a_router_fast_forward(router, count, ties) -> None:
    """Not vacuous: behind a router that reads only running sets most steps go by in runs
    (caught up before each arrival); one reading KV gets replicas that run step by step."""
    gap_s = 1 / 64 if ties else 0.037
    rows = [(gap_s * i, 30 + 17 * (i % 7), 20 + 31 * (i % 5), i % 3) for i in range(40)]
    config = {"policy": "continuous", "blocks": 3000, "block": 16, "seqs": 32, "budget": 512,
              "chunked": True, "prefix": True, "swap": False, "watermark": 0.0,
              "graphs": True, "batch": 1}
    latency = PowerOfTwo() if ties else ROOF
    assert_same(rows, config, count, router, latency)
    fleet, setups, ran = RunRecorder(), [], []
    for _ in range(count):
        scheduler, kv = build(config)
        advance = scheduler.advance_decodes

        def spy(run, begin, end, step_end_s, advance=advance):  # noqa: ANN001, ANN202
            ran.append(end - begin)
            return advance(run, begin, end, step_end_s)

        scheduler.advance_decodes = spy  # type: ignore[method-assign]
        setups.append(ReplicaSetup(scheduler, latency, RunRecorder(), kv))
    simulate_fleet(iter(requests(rows)), setups, build_router(router), router_rng(0), fleet)
    if build_router(router).reads_kv:
        assert ran == []
    else:
        assert sum(ran) > 0.5 * fleet.num_steps
    assert fleet.num_steps == sum(s.recorder.num_steps for s in setups)


def test_a_rejection_during_a_run_is_recorded_after_its_finishers() -> None:
    """A lone replica records a run at its end; an arrival rejected during it is recorded
    after the run's finishers before it, as step by step (requests_frame's order)."""
    rows = [(0.0, 20, 10, 0), (0.0, 20, 120, 0), (0.3, 450, 100, 0), (0.31, 30, 5, 0)]
    config = {"policy": "continuous", "blocks": 2000, "block": 16, "seqs": 32, "budget": 512,
              "chunked": True, "prefix": False, "swap": False, "watermark": 0.0,
              "graphs": False, "batch": 1}
    reqs = simulate(rows, config, 1, "round_robin", ROOF, True)[0]
    assert reqs[0].finish_s < reqs[2].arrival_s < reqs[1].finish_s  # during r1's run
    assert reqs[2].state is RequestState.REJECTED  # prompt + output > max_model_len 500
    assert_same(rows, config, 1, "round_robin", ROOF)


@settings(max_examples=150, deadline=None)
@given(workloads(), replicas(), st.sampled_from(["roofline", "power-of-two"]))
def test_async_scheduling_fast_forward_equals_step_by_step(rows, config, latency_name) -> None:
    """The property above on one replica with async scheduling on wherever it applies
    (continuous batching, recompute preemption): runs begin with the plan made ahead and
    end with one left outstanding."""
    config = {**config, "async": True,
              "policy": config["policy"] if config["policy"] == "contiguous" else "continuous"}
    assert_same(rows, config, 1, "round_robin", ROOF_LAG if latency_name == "roofline"
                else PowerOfTwo())


@pytest.mark.parametrize("prefix", [False, True])
def test_async_runs_take_most_steps_and_span_finishers(prefix: bool) -> None:
    """Not vacuous: with async scheduling on a quiet replica most steps go by in runs, runs
    span finishers (their blocks freed after the next plan took its own), the plan left
    outstanding at a run's end leads to the plans step by step makes, and the results equal step
    by step's."""
    rows = [(0.2 * i, 40 + 9 * i, 30 + 13 * (i % 6), 1 + i % 2 if prefix else 0)
            for i in range(24)]
    config = {"policy": "continuous", "blocks": 600, "block": 4, "seqs": 32, "budget": 512,
              "chunked": True, "prefix": prefix, "swap": False, "watermark": 0.0,
              "graphs": False, "batch": 1, "async": True}
    assert ROOF_LAG.output_lag_s(StepShape(num_decodes=8, decode_context_sum=800,
                                           decode_context_max=100, padded_batch=8)) > 0
    assert_same(rows, config, 1, "round_robin", ROOF_LAG)
    plans = []
    for fast in (False, True):
        scheduler, kv = build(config)
        log: list = []
        logged(scheduler, log)
        ran: list = []
        advance = scheduler.advance_decodes

        def spy(run, begin, end, step_end_s, advance=advance, ran=ran):  # noqa: ANN001, ANN202
            ran.append(advance(run, begin, end, step_end_s))
            return ran[-1]

        scheduler.advance_decodes = spy  # type: ignore[method-assign]
        recorder = RunRecorder()
        simulate_fleet(iter(requests(rows)), [ReplicaSetup(scheduler, ROOF_LAG, recorder, kv,
                                                           fast_forward=fast)],
                       None, None, recorder)
        plans.append(by_key(log))
        if fast:
            in_runs = sum(s.run.steps + (s.finish is not None) for r in ran for s in r)
            assert in_runs > 0.7 * recorder.num_steps
            assert sum(s.finish is not None for r in ran for s in r) >= 3
    # every plan schedule() made (before and after runs) is one step by step made
    assert all(plans[0][key] == tables for key, tables in plans[1].items())


def test_async_replicas_behind_a_router_run_step_by_step() -> None:
    """Behind a router async scheduling runs step by step (no decode run), and equals the
    oracle."""
    rows = [(0.037 * i, 30 + 17 * (i % 7), 20 + 31 * (i % 5), i % 3) for i in range(30)]
    config = {"policy": "continuous", "blocks": 3000, "block": 16, "seqs": 32, "budget": 512,
              "chunked": True, "prefix": True, "swap": False, "watermark": 0.0,
              "graphs": True, "batch": 1, "async": True}
    assert_same(rows, config, 2, "least_outstanding", ROOF)
    fleet, setups, ran = RunRecorder(), [], []
    for _ in range(2):
        scheduler, kv = build(config)
        advance = scheduler.advance_decodes

        def spy(run, begin, end, step_end_s, advance=advance):  # noqa: ANN001, ANN202
            ran.append(end - begin)
            return advance(run, begin, end, step_end_s)

        scheduler.advance_decodes = spy  # type: ignore[method-assign]
        setups.append(ReplicaSetup(scheduler, ROOF, RunRecorder(), kv))
    simulate_fleet(iter(requests(rows)), setups, build_router("least_outstanding"),
                   router_rng(0), fleet)
    assert ran == []
