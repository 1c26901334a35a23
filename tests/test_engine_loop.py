"""The engine loop: the same scheduler code as the simulator, on real kernels (CPU, float32)."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from calibrate.recorded import Diverged, RecordedSteps, resimulate  # noqa: E402
from gpu_engine.engine import Engine  # noqa: E402
from gpu_engine.replay import replay_scenario  # noqa: E402
from gpu_engine.sampling import SamplingParams  # noqa: E402
from gpu_engine.setup import EngineSetupError, build_engine  # noqa: E402
from sim.assemble import (  # noqa: E402
    build_block_manager,
    build_latency,
    build_scheduler,
    kv_budget,
)
from sim.config.scenario import Scenario  # noqa: E402
from sim.core.batching import graph_batch_sizes, padded_batch_size  # noqa: E402
from sim.core.plan import StepPlan  # noqa: E402
from sim.core.request import Request  # noqa: E402
from sim.experiments.outputs import write_outputs  # noqa: E402
from sim.results.record.recorder import RunRecorder  # noqa: E402
from sim.workload import make_requests  # noqa: E402
from sim.world.fleet import simulate, simulate_fleet  # noqa: E402
from sim.world.replica import ReplicaSetup  # noqa: E402


class SpyRecorder(RunRecorder):
    """A real recorder that also keeps every step's start, duration and plan."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[tuple[float, float, StepPlan]] = []

    def record_step(self, start_s, duration_s, plan, num_waiting, num_running,  # noqa: ANN001
                    kv_blocks_used, kv_slots_held=None) -> None:  # noqa: ANN001
        self.steps.append((start_s, duration_s, plan))
        super().record_step(start_s, duration_s, plan, num_waiting, num_running,
                            kv_blocks_used, kv_slots_held)


CPU_HW = {"name": "cpu-test", "bf16_flops_per_s": 5e10, "memory_bytes": 2**26,
          "memory_bandwidth_bytes_per_s": 1e10, "interconnect_bandwidth_bytes_per_s": 1e9,
          "host_link_bandwidth_bytes_per_s": 1e9}


def scenario(**sections: object) -> Scenario:
    raw: dict = {
        "name": "engine-test", "seed": 3, "model": "tiny",
        "hardware": {"gpu": CPU_HW},
        # the engine steps synchronously (sim.core.drive): so does the simulator compared
        "scheduler": {"max_num_seqs": 8, "max_num_batched_tokens": 64,
                      "async_scheduling": False},
        "kv": {"num_blocks": 24, "block_size": 8},
        "engine": {"device": "cpu", "warmup": False},
        "workload": {"arrivals": {"process": "poisson", "rate": 200.0},
                     "prompt_tokens": {"dist": "uniform", "low": 4, "high": 60},
                     "output_tokens": {"dist": "uniform", "low": 1, "high": 24},
                     "num_requests": 24},
    }
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    return Scenario.model_validate(raw)


def simulate_plans(sc: Scenario) -> SpyRecorder:
    recorder = SpyRecorder()
    kv = build_block_manager(sc, kv_budget(sc))
    # plan for plan against the engine: the simulator's step-by-step world (the spy keeps
    # each step; fast-forward's equality to it is tests/test_fast_forward.py)
    simulate(make_requests(sc.workload, sc.seed), build_scheduler(sc, kv), build_latency(sc),
             recorder, fast_forward=False)
    return recorder


def engine_plans(sc: Scenario) -> tuple[SpyRecorder, Engine]:
    recorder = SpyRecorder()
    engine = build_engine(sc, latency=build_latency(sc)).engine
    engine.replay(make_requests(sc.workload, sc.seed), recorder)
    return recorder, engine


@pytest.mark.parametrize("sections", [
    {},  # continuous, chunked prefill, a pool small enough to preempt
    {"kv": {"prefix_caching": True},
     "workload": {"shared_prefix": {"fraction": 0.8, "num_prompts": 2, "tokens": 24}}},
    {"scheduler": {"policy": "static", "batch_size": 4, "max_model_len": 100},
     "kv": {"num_blocks": 60}},
    {"scheduler": {"policy": "dynamic", "batch_size": 4, "max_wait_ms": 20,
                   "max_model_len": 100},
     "kv": {"num_blocks": 200}},
    {"engine": {"cuda_graphs": True}},  # decode-only steps padded to graph batch sizes
], ids=["continuous-preempting", "prefix-cache", "static", "dynamic", "cuda-graphs"])
def test_virtual_clock_engine_makes_the_simulators_plans(sections: dict) -> None:
    sc = scenario(**sections)
    sim_rec = simulate_plans(sc)
    eng_rec, engine = engine_plans(sc)
    assert len(eng_rec.steps) == len(sim_rec.steps) > 10
    for (s_start, s_dur, s_plan), (e_start, e_dur, e_plan) in zip(sim_rec.steps, eng_rec.steps,
                                                                  strict=True):
        assert e_plan == s_plan
        assert (e_start, e_dur) == (s_start, s_dur)
    pd.testing.assert_frame_equal(eng_rec.requests_frame(), sim_rec.requests_frame())
    if not sections:
        assert sum(len(p.preempted_ids) for _, _, p in eng_rec.steps) > 0, "no preemption"
    assert engine.kv.k[0].shape[0] == engine.scheduler.kv.num_blocks


@pytest.mark.parametrize("sections", [
    {"engine": {"cuda_graphs": True}},  # continuous, decode steps padded to graph sizes
    {"engine": {"cuda_graphs": False}},  # continuous, never padded
    {"scheduler": {"policy": "static", "batch_size": 4, "max_model_len": 100},
     "kv": {"num_blocks": 60}},  # finished members pad every step to B
], ids=["cuda-graphs", "eager", "static"])
def test_the_engine_runs_the_plans_padded_batch(sections: dict) -> None:
    """The plan says what runs: every step the engine executes has exactly the plan's
    padded_batch rows, and with CUDA graphs a decode-only step's padded batch is its graph
    size (sim.core.batching), which the simulator's latency models price."""
    sc = scenario(**sections)
    _, engine = engine_plans(sc)
    sizes = graph_batch_sizes(sc.scheduler.max_num_seqs)
    assert [s.rows for s in engine.steps] == [s.shape.padded_batch for s in engine.steps]
    decodes = [s for s in engine.steps if not s.shape.prefill_chunk_tokens]
    assert len(decodes) > 10
    padded = [s for s in engine.steps if s.shape.padded_batch > s.num_seqs]
    if sections.get("engine", {}).get("cuda_graphs"):
        assert all(s.shape.padded_batch == padded_batch_size(s.num_seqs, sizes)
                   for s in decodes)
        assert padded and all(not s.shape.prefill_chunk_tokens for s in padded)
    elif "scheduler" in sections:
        assert all(s.shape.padded_batch == 4 for s in engine.steps)
    else:
        assert padded == []


WORLDS = [
    {},  # continuous, chunked prefill, a pool small enough to preempt
    {"kv": {"num_blocks": 200}, "workload": {"arrivals": {"process": "poisson", "rate": 20.0},
                                             "num_requests": 8}},  # arrivals find it idle
    {"kv": {"prefix_caching": True},
     "workload": {"shared_prefix": {"fraction": 0.8, "num_prompts": 2, "tokens": 24}}},
    {"scheduler": {"policy": "dynamic", "batch_size": 4, "max_wait_ms": 5,
                   "max_model_len": 100},
     "kv": {"num_blocks": 200}},  # idle waits that end at the scheduler's wakeup
    {"scheduler": {"policy": "static", "batch_size": 4, "max_model_len": 100},
     "kv": {"num_blocks": 60}},
    {"kv": {"num_blocks": 200}, "speculative": {"num_tokens": 3}},  # n-gram drafts
]
WORLD_IDS = ["continuous-preempting", "idle-arrivals", "prefix-cache", "dynamic", "static",
             "speculative"]


@pytest.mark.parametrize("sections", WORLDS, ids=WORLD_IDS)
def test_simulator_fed_the_wall_clock_engines_step_times_lands_on_its_timestamps(
        sections: dict) -> None:
    """The world, not the machine: however fast or slow each step ran, the simulator given
    the engine's measured durations makes the same plans and every request's arrival, first
    schedule, first token and finish are the same floats (so a fidelity report's errors are
    its latency model's step errors alone)."""
    sc = scenario(**sections)
    run = replay_scenario(sc, show_progress=False)  # the wall clock
    engine = run.result.recorder.requests_frame()
    simulated = resimulate(sc, None, run.steps).requests_frame()
    assert len(engine) == sc.workload.num_requests
    pd.testing.assert_frame_equal(simulated, engine, check_exact=True)
    # each step began where the last ended or at the arrival or wakeup it idled until
    for prev, nxt in zip(run.steps, run.steps[1:], strict=False):
        assert nxt.start_s >= prev.start_s + prev.duration_s
    if "arrivals" in sections.get("workload", {}):  # idle engine: the step starts at arrival
        assert (engine["first_scheduled_s"] == engine["arrival_s"]).sum() >= 1
    assert (engine["first_scheduled_s"] >= engine["arrival_s"]).all()


def test_recorded_steps_catch_a_world_that_differs() -> None:
    sc = scenario()
    run = replay_scenario(sc, show_progress=False)

    def simulate_with(steps: list) -> pd.DataFrame:  # noqa: ANN001
        recorder = SpyRecorder()
        kv = build_block_manager(sc, kv_budget(sc))
        simulate_fleet(make_requests(sc.workload, sc.seed), [ReplicaSetup(build_scheduler(sc, kv),
                                                     RecordedSteps(steps), recorder, kv,
                                                     fast_forward=False)],
                       None, None, recorder)
        return recorder.requests_frame()

    assert simulate_with(list(run.steps)).equals(run.result.recorder.requests_frame())
    # the last step 1 us longer moves the last finish: the comparison is exact
    steps = list(run.steps)
    steps[-1] = dataclasses.replace(steps[-1], duration_s=steps[-1].duration_s + 1e-6)
    assert not simulate_with(steps).equals(run.result.recorder.requests_frame())
    # another workload's steps (other prompt lengths): its first step is another shape
    with pytest.raises(Diverged, match="step 1: the simulator planned"):
        resimulate(scenario(seed=4), None, run.steps)
    with pytest.raises(Diverged, match="the engine ran"):
        resimulate(sc, None, run.steps + run.steps[-1:])


def serve_alone_and_together(sc: Scenario) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    requests = list(make_requests(sc.workload, sc.seed))
    together: dict[int, list[int]] = {}
    engine = build_engine(sc, latency=build_latency(sc)).engine
    for r in requests:
        engine.add_request(Request(r.request_id, 0.0, r.prompt_tokens, r.output_tokens), now=0.0)
    for _ in engine.stream():
        pass
    for r in requests:
        together[r.request_id] = engine.output_ids(r.request_id)
    alone: dict[int, list[int]] = {}
    for r in requests:
        solo = build_engine(sc, latency=build_latency(sc)).engine
        solo.add_request(Request(r.request_id, 0.0, r.prompt_tokens, r.output_tokens), now=0.0)
        for _ in solo.stream():
            pass
        alone[r.request_id] = solo.output_ids(r.request_id)
    return together, alone


def test_batched_greedy_decoding_equals_each_request_alone() -> None:
    sc = scenario(kv={"num_blocks": 400}, workload={"num_requests": 8})
    together, alone = serve_alone_and_together(sc)
    assert together == alone
    assert all(len(v) > 0 for v in together.values())


def test_preempted_and_recomputed_requests_produce_the_same_tokens() -> None:
    big = scenario(kv={"num_blocks": 400}, workload={"num_requests": 10})
    small = scenario(kv={"num_blocks": 14}, workload={"num_requests": 10})
    requests = list(make_requests(big.workload, big.seed))
    outputs = []
    preemptions = []
    for sc in (big, small):
        engine = build_engine(sc, latency=build_latency(sc)).engine
        for r in requests:
            engine.add_request(Request(r.request_id, 0.0, r.prompt_tokens, r.output_tokens),
                               now=0.0)
        count = 0
        while (out := engine.step()) is not None:
            count += len(out[0].preempted_ids)
        outputs.append({r.request_id: engine.output_ids(r.request_id) for r in requests})
        preemptions.append(count)
    assert preemptions[0] == 0 and preemptions[1] > 0
    assert outputs[0] == outputs[1]


def test_streaming_yields_each_token_once_in_order_with_times() -> None:
    sc = scenario(kv={"num_blocks": 100})
    engine = build_engine(sc).engine  # wall clock
    engine.add_request(Request(0, 0.0, 10, 6), SamplingParams(temperature=0.8, seed=1))
    engine.add_request(Request(1, 0.0, 30, 4))
    events = list(engine.stream())
    by_request: dict[int, list] = {0: [], 1: []}
    for e in events:
        by_request[e.request_id].append(e)
    assert [e.index for e in by_request[0]] == list(range(6))
    assert [e.index for e in by_request[1]] == list(range(4))
    assert [e.token_id for e in by_request[0]] == engine.output_ids(0)
    assert all(a.time_s <= b.time_s for a, b in zip(events, events[1:], strict=False))
    assert [e.finished for e in by_request[1]] == [False] * 3 + [True]


def test_wall_clock_replay_writes_the_simulators_result_files(tmp_path) -> None:  # noqa: ANN001
    arrivals = {"process": "poisson", "rate": 50.0}
    sc = scenario(kv={"num_blocks": 200}, workload={"num_requests": 6, "arrivals": arrivals})
    run = replay_scenario(sc, show_progress=False)
    written = [*write_outputs(run.result, tmp_path, plots=False), run.write_steps(tmp_path)]
    files = {p.name for p in written}
    assert {"summary.json", "requests.csv", "engine_steps.csv"} <= files
    assert run.result.summary["completed"] == 6
    assert run.result.summary["latency_model"].startswith("engine(cpu")
    steps = pd.read_csv(tmp_path / "engine_steps.csv")
    assert len(steps) == len(run.steps) > 0
    assert (steps.device_ms <= steps.wall_ms).all()
    requests = pd.read_csv(tmp_path / "requests.csv")
    arrival_gap = requests.first_token_s - requests.arrival_s
    assert (arrival_gap > 0).all()
    # the steps' shapes, then their times, as calibration reads them
    assert list(steps.columns[:2]) == ["start_s", "num_seqs"]
    assert steps.duration_ms.to_numpy() == pytest.approx([s.duration_s * 1e3 for s in run.steps])


def test_engine_refuses_what_it_cannot_run() -> None:
    with pytest.raises(EngineSetupError, match="preemption"):
        build_engine(scenario(scheduler={"preemption": "swap"}))
    with pytest.raises(EngineSetupError, match="replicas"):
        build_engine(scenario(replicas=2))
    with pytest.raises(EngineSetupError, match="GiB free"):
        build_engine(scenario(model="llama-3.1-405b", kv={"num_blocks": 1000}))
