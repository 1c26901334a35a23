"""A fleet of replicas behind a router in the simulated world: conservation, outputs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_des import FixedLatency

from sim.assemble import build_block_manager, build_latency, build_scheduler, kv_budget
from sim.cli import main
from sim.config.scenario import Scenario
from sim.core.contiguous import ContiguousAllocator
from sim.core.kv import PagedBlockManager
from sim.core.request import Request, RequestState
from sim.core.schedulers import ContinuousScheduler, StaticScheduler
from sim.experiments.run import run_scenario
from sim.results.files.steady import steady_summary
from sim.results.files.summary import summarize
from sim.results.record.recorder import RunRecorder
from sim.workload import make_requests
from sim.world.fleet import simulate, simulate_fleet
from sim.world.replica import ReplicaSetup
from sim.world.router import POLICIES, LeastOutstanding, Router, build_router, router_rng


class Spy:
    """Wraps a router; logs each decision with every replica's outstanding count then."""

    def __init__(self, inner: Router) -> None:
        self.inner = inner
        self.log: list[tuple[list[int], int]] = []

    def choose(self, request: Request, replicas: Sequence, rng: np.random.Generator) -> int:
        i = self.inner.choose(request, replicas, rng)
        self.log.append(([r.num_outstanding for r in replicas], i))
        return i


def continuous(num_blocks: int = 400, block_size: int = 16) -> tuple[ContinuousScheduler,
                                                                     PagedBlockManager]:
    kv = PagedBlockManager(num_blocks, block_size, watermark=0.0)
    return ContinuousScheduler(kv, 16, 1024, True, None), kv


def fleet(requests: list[Request], n: int, router: Router, num_blocks: int = 400
          ) -> tuple[RunRecorder, list[RunRecorder]]:
    setups = []
    for _ in range(n):
        sched, kv = continuous(num_blocks)
        setups.append(ReplicaSetup(sched, FixedLatency(0.01), RunRecorder(), kv))
    whole = RunRecorder()
    simulate_fleet(iter(requests), setups, router, router_rng(0), whole)
    return whole, [s.recorder for s in setups]


def poisson_requests(count: int, rate: float, seed: int = 3) -> list[Request]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, count))
    return [Request(i, float(t), int(p), int(o)) for i, (t, p, o) in enumerate(zip(
        arrivals, rng.integers(1, 400, count), rng.integers(1, 60, count), strict=True))]


def test_least_outstanding_never_picks_a_busier_replica_at_decision_time() -> None:
    spy = Spy(LeastOutstanding())
    fleet(poisson_requests(400, 80.0), 4, spy)
    assert len(spy.log) == 400
    assert all(loads[i] == min(loads) for loads, i in spy.log)
    assert max(max(loads) for loads, _ in spy.log) > 0  # the fleet was actually loaded


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 2, allow_nan=False), st.integers(1, 200),
                          st.integers(1, 40)), min_size=1, max_size=30),
       st.integers(1, 4), st.sampled_from(sorted(POLICIES)), st.integers(8, 30))
def test_every_request_finishes_once_or_is_rejected_across_the_fleet(
        spec: list[tuple[float, int, int]], n: int, policy: str, num_blocks: int) -> None:
    requests = [Request(i, t, p, o) for i, (t, p, o) in enumerate(sorted(spec))]
    whole, parts = fleet(requests, n, build_router(policy), num_blocks)
    ids = [i for rec in parts for i in rec.requests_frame()["request_id"]]
    assert sorted(ids) == list(range(len(requests)))  # each routed to exactly one replica
    assert sorted(whole.requests_frame()["request_id"]) == list(range(len(requests)))
    summary = whole.summary()
    assert summary["completed"] + summary["rejected"] == len(requests)
    assert summary["completed"] == sum(rec.summary()["completed"] for rec in parts)
    assert whole.num_steps == sum(rec.num_steps for rec in parts)
    for r in requests:
        assert r.state in (RequestState.FINISHED, RequestState.REJECTED)
        if r.state is RequestState.FINISHED:
            assert r.num_output_done == r.output_tokens


def test_end_of_arrivals_closes_every_replica_so_short_static_batches_run() -> None:
    """Static B = 8 behind round-robin: 3 requests leave each replica short of B."""
    setups = [ReplicaSetup(StaticScheduler(ContiguousAllocator(100, 4, watermark=0.0),
                                           batch_size=8, max_model_len=64),
                           FixedLatency(0.5), RunRecorder()) for _ in range(2)]
    requests = [Request(0, 0.0, 10, 2), Request(1, 1.0, 10, 2), Request(2, 3.0, 10, 2)]
    whole = RunRecorder()
    end_s = simulate_fleet(iter(requests), setups, build_router("round_robin"), router_rng(0),
                           whole)
    assert [r.first_scheduled_s for r in requests] == [3.0, 3.0, 3.0]  # both launch at close
    assert end_s == 4.0 and whole.summary()["completed"] == 3


# -- through the scenario ----------------------------------------------------------
def scenario(**fields: object) -> Scenario:
    raw = {"name": "fleet", "workload": {
        "arrivals": {"process": "poisson", "rate": 40.0}, "num_requests": 300,
        "prompt_tokens": {"dist": "lognormal", "mean": 600, "cv": 1.0, "min": 4, "max": 4000},
        "output_tokens": {"dist": "lognormal", "mean": 100, "cv": 1.0, "min": 1, "max": 1000}}}
    return Scenario.model_validate({**raw, **fields})


def assignment(result: object) -> list[list[int]]:
    return [rec.requests_frame()["request_id"].tolist() for rec in result.replica_recorders]


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_routing_is_deterministic_per_seed(policy: str) -> None:
    s = scenario(replicas=3, router={"policy": policy})
    first, again = run_scenario(s, show_progress=False), run_scenario(s, show_progress=False)
    assert assignment(first) == assignment(again)
    assert first.summary["replicas"] == again.summary["replicas"]
    assert all(assignment(first))  # every replica served something


def test_power_of_two_assignment_follows_the_seed() -> None:
    runs = [run_scenario(scenario(replicas=3, seed=seed, router={"policy": "power_of_two"}),
                         show_progress=False) for seed in (0, 1)]
    assert assignment(runs[0]) != assignment(runs[1])


def test_round_robin_through_a_scenario_spreads_evenly() -> None:
    rows = run_scenario(scenario(replicas=4), show_progress=False).summary["replicas"]
    counts = [row["requests"] for row in rows]
    assert sum(counts) == 300 and max(counts) - min(counts) <= 1


def test_one_replica_is_exactly_the_single_replica_path() -> None:
    s = scenario()
    fleet_summary = dict(run_scenario(s, show_progress=False).summary)
    budget = kv_budget(s)
    kv = build_block_manager(s, budget)
    recorder, sched, latency = RunRecorder(), build_scheduler(s, kv), build_latency(s)
    simulate(make_requests(s.workload, s.seed), sched, latency, recorder,
             frontend=s.frontend.value())
    today = summarize(s, budget, recorder, [ReplicaSetup(sched, latency, recorder, kv)])
    rows = fleet_summary.pop("replicas")
    for key in ("latency_model", "simulation_wall_s", "summary_schema_version",
                "frontend_offset_ms", "prediction_interval",
                *(k for k in list(fleet_summary) if k.startswith("engine_"))):
        fleet_summary.pop(key)
    steady = steady_summary(recorder.request_batches().series(), recorder.itl_slices)
    assert json.dumps({k: fleet_summary.pop(k) for k in steady}, sort_keys=True) == json.dumps(
        steady, sort_keys=True)
    assert json.dumps(fleet_summary, sort_keys=True) == json.dumps(today, sort_keys=True)
    assert len(rows) == 1 and rows[0]["completed"] == today["completed"]
    # with one replica the router is never asked
    other = run_scenario(scenario(router={"policy": "power_of_two"}), show_progress=False)
    assert other.summary["completed"] == today["completed"]
    assert other.summary["mean_ttft_ms"] == today["mean_ttft_ms"]


def test_fleet_outputs_table_and_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("replicas: 3\nrouter: {policy: least_kv}\n")
    code = main(["run", str(path), "--out", str(tmp_path / "out"),
                 "--set", "workload.num_requests=120", "--set", "workload.arrivals.rate=30"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "3 replicas behind a least_kv router" in out and "Per replica" in out
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"replicas.csv", "load_balance.png", "summary.json"} <= names
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [row["replica"] for row in summary["replicas"]] == [0, 1, 2]
    assert sum(row["completed"] for row in summary["replicas"]) == summary["completed"]
    assert sum(row["request_throughput"] for row in summary["replicas"]) == pytest.approx(
        summary["request_throughput"])


def test_one_replica_writes_no_fleet_files(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--out", str(tmp_path), "--set", "workload.num_requests=20"])
    out, _ = capsys.readouterr()
    assert code == 0 and "Per replica" not in out
    assert not (tmp_path / "replicas.csv").exists()
    assert not (tmp_path / "load_balance.png").exists()


@pytest.mark.parametrize("text, expected", [
    ("replicas: 0\n", "replicas: Input should be greater than or equal to 1 (got 0)"),
    ("router: {policy: random}\n", "router.policy: Input should be 'round_robin'"),
    ("router: {load_limit: 0.5}\n", "router.load_limit: Input should be greater than or equal"),
])
def test_fleet_scenario_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      text: str, expected: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    code = main(["run", str(path), "--out", str(tmp_path / "out"), "--no-plots"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith(f"error: {path}: ") and expected in err and err.count("\n") == 1


def shared_prefix_requests(count: int, seed: int = 5) -> list[Request]:
    """4 system prompts of 32 x 16 tokens; each request = one of them + 2 units of its own."""
    rng = np.random.default_rng(seed)
    requests = []
    for i in range(count):
        system = int(rng.integers(4))
        ids = tuple(range(system * 32, system * 32 + 32)) + (10_000 + 2 * i, 10_001 + 2 * i)
        requests.append(Request(i, 0.2 * i, len(ids) * 16, 4, prefix_block_ids=ids,
                                prefix_unit_tokens=16))
    return requests


def hit_rate(policy: str) -> float:
    setups = []
    for _ in range(4):  # 79 usable blocks: room for about two system prompts per replica
        kv = PagedBlockManager(80, 16, watermark=0.0, enable_prefix_cache=True)
        setups.append(ReplicaSetup(ContinuousScheduler(kv, 16, 1024, True, None),
                                   FixedLatency(0.01), RunRecorder(), kv))
    whole = RunRecorder()
    simulate_fleet(iter(shared_prefix_requests(400)), setups, build_router(policy),
                   router_rng(0), whole)
    summary = whole.summary(prefix_caching=True)
    assert summary["completed"] == 400
    return summary["prefix_hit_rate"]


def test_prefix_aware_routing_beats_round_robin_on_hit_rate() -> None:
    round_robin, prefix_aware = hit_rate("round_robin"), hit_rate("prefix_aware")
    # each replica keeps one system prompt hot: every request after the first 4 hits 512/544
    assert prefix_aware > 0.9 * 512 / 544
    assert prefix_aware > round_robin + 0.2
