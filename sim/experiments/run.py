"""Simulate one scenario: its replicas built by sim.assemble, observed, run in the SimPy world,
summarised once (sim.results.files.summary).

Every replica diagnoses its requests' TTFT (sim.observe.diagnose); a run can
also trace a few requests' timelines. The result is a `RunResult`, the same
value the engine's replay returns.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sim.assemble import build_group_latency, build_latency, build_replica, kv_budget
from sim.config.frontend import Frontend
from sim.config.scenario import Scenario
from sim.core.plan import StepShape
from sim.experiments.progress import DelayedBar
from sim.latency import LatencyModel
from sim.observe.diagnose import COLUMNS as DIAGNOSIS_COLUMNS
from sim.observe.diagnose import TTFTDiagnoser
from sim.observe.observer import ReplicaObserver
from sim.observe.trace import choose_requests
from sim.results.files.run import RunResult
from sim.results.files.summary import run_summary, scenario_slo
from sim.results.record.recorder import KEEP, RunRecorder
from sim.results.record.requests import RequestCSV
from sim.workload import make_requests
from sim.world.dp_group import simulate_dp_group
from sim.world.dp_log import LockstepRecorder
from sim.world.fleet import simulate_fleet
from sim.world.replica import ReplicaSetup
from sim.world.router import build_router, router_rng

if TYPE_CHECKING:
    import pandas as pd

    from sim.world.speculation import AcceptanceSampler


def run_scenario(scenario: Scenario, base_dir: Path | None = None,
                 show_progress: bool = True, timeline: int = 0, *,
                 fast_forward: bool = True, requests_csv: Path | None = None,
                 keep_rows: bool = True) -> RunResult:
    """Simulate `scenario.replicas` identical replicas behind its router.

    Each replica gets its own block manager, scheduler and latency model from
    sim.assemble; one replica's recorder is the fleet's, so a single
    replica records exactly as before. Every replica diagnoses its requests' TTFT
    (sim.observe.diagnose); `timeline` > 0 also traces that many requests, spread over the run.
    `fast_forward=False`: every step its own event (the oracle the default must equal).
    `requests_csv`: stream the rows there as requests finish, keeping none in memory
    (the result's recorders then read them back from that file only). Without it,
    `keep_rows=False` drops the rows (and runs no TTFT diagnosis, which only fills
    them): memory then follows the requests in flight, and the result gives the summary,
    the time series and the sketches, not `requests_frame()` (what the sweep's points need).
    """
    if not keep_rows and timeline:
        raise ValueError("a traced timeline needs the request rows (keep_rows=True)")
    if scenario.disaggregation is not None:  # two pools and a link (sim.world.disaggregated)
        from sim.experiments.run_disaggregated import run_disaggregated

        return run_disaggregated(scenario, base_dir, show_progress,
                                 keep_rows or requests_csv is not None)
    budget = kv_budget(scenario)
    slo = scenario_slo(scenario)
    dp = scenario.hardware.data_parallel  # > 1: one replica's ranks, in lockstep
    parts = [build_replica(scenario, budget) for _ in range(scenario.replicas * dp)]
    latencies = [build_latency(scenario, base_dir) for _ in parts]
    verifiers: list[AcceptanceSampler | None] = [None] * len(parts)
    if scenario.speculative.num_tokens:  # the draft's pricing and the verifier load only here
        from sim.latency.draft import with_draft
        from sim.world.speculation import build_speculation

        latencies = [with_draft(scenario, latency) for latency in latencies]
        verifiers = [build_speculation(scenario) for _ in parts]
    traced = choose_requests(array("q", (r.request_id for r in make_requests(
        scenario.workload, scenario.seed, base_dir))), timeline) if timeline else frozenset()
    streaming = requests_csv is not None
    kept = keep_rows and not streaming
    diagnose = streaming or keep_rows  # the TTFT parts go only into the rows
    frontend = scenario.frontend.value()
    observers: list[ReplicaObserver | None] = [
        ReplicaObserver(p.scheduler, lat.step_time, traced, hand_off=streaming,
                        delivery_s=_delivery(p.scheduler, lat, frontend))
        if diagnose else None for p, lat in zip(parts, latencies, strict=True)]
    rows: RequestCSV | str | None = KEEP if kept else None
    if requests_csv is not None:
        rows = RequestCSV(requests_csv, bool(scenario.speculative.num_tokens),
                          DIAGNOSIS_COLUMNS,
                          _take_from([o.diagnoser for o in observers if o is not None]))
    recorder = RunRecorder(rows=rows, slo=slo) if dp == 1 else LockstepRecorder(
        rows=rows, slo=slo, ranks=dp)
    setups = [ReplicaSetup(p.scheduler, lat, recorder if len(parts) == 1 else
                           RunRecorder(rows=KEEP if kept else None, slo=slo),
                           p.kv, verifier, fast_forward=fast_forward, observer=observer,
                           links=p.links)
              for p, lat, observer, verifier in zip(parts, latencies, observers, verifiers,
                                                    strict=True)]
    latency = setups[0].latency
    router = build_router(scenario.router.policy, scenario.router.load_limit)
    try:
        requests = make_requests(scenario.workload, scenario.seed, base_dir)
    except BaseException:  # a bad trace: close requests.csv before the error is printed
        recorder.close()
        raise
    total = scenario.workload.num_requests
    started = time.perf_counter()
    try:
        # short runs stay silent (and load no tqdm): the bar appears only after 2 s
        with DelayedBar(total, "simulating", "req", enabled=show_progress) as bar:
            if isinstance(recorder, LockstepRecorder):  # sim.world.dp_group
                simulate_dp_group(requests, setups, build_group_latency(scenario), router,
                                  router_rng(scenario.seed), recorder, recorder.lockstep,
                                  on_done=bar.update, frontend=frontend)
            else:
                simulate_fleet(requests, setups, router, router_rng(scenario.seed), recorder,
                               on_done=bar.update, frontend=frontend)
    finally:
        recorder.close()
    wall_s = time.perf_counter() - started
    timeline_frame = collect(setups, recorder if kept else None)
    summary = run_summary(scenario, budget, recorder, setups, latency.name, wall_s,
                          [s.recorder for s in setups], frontend)
    if isinstance(recorder, LockstepRecorder):  # the rows under `replicas` are the ranks
        summary["data_parallel"] = recorder.lockstep.summary()
    num_blocks = setups[0].kv.num_usable_blocks
    return RunResult(scenario, summary, recorder, budget, num_blocks, latency.name,
                     wall_s, tuple(s.recorder for s in setups), timeline_frame)


def _delivery(scheduler: object, latency: LatencyModel, frontend: Frontend
              ) -> Callable[[StepShape], float]:
    """How long after a step's GPU time its tokens reach the client, as the world stamps
    them (sim.world.replica): the async output lag, then the frontend's output terms."""
    out_s = frontend.detokenize_s_per_token + frontend.stream_s_per_token
    lag = getattr(latency, "output_lag_s", None)
    if lag is None or not getattr(scheduler, "async_scheduling", False):
        return lambda _shape: out_s
    return lambda shape: lag(shape) + out_s


def _take_from(diagnosers: Sequence[TTFTDiagnoser]
               ) -> Callable[[int], tuple[float | int, ...] | None]:
    """A request's TTFT row from whichever replica diagnosed it (ids are unique)."""
    if len(diagnosers) == 1:
        return diagnosers[0].take

    def take(rid: int) -> tuple[float | int, ...] | None:
        for diagnoser in diagnosers:
            row = diagnoser.take(rid)
            if row is not None:
                return row
        return None

    return take


def observe(setups: Sequence[ReplicaSetup], traced: frozenset[int] = frozenset()
            ) -> list[ReplicaSetup]:
    """`setups`, each with its own ReplicaObserver (clocks are per replica)."""
    return [s._replace(observer=ReplicaObserver(s.scheduler, s.latency.step_time, traced))
            for s in setups]


def collect(setups: Sequence[ReplicaSetup], fleet: RunRecorder | None
            ) -> pd.DataFrame | None:
    """Join each replica's TTFT parts into its recorder and the fleet's (None: the rows
    were streamed with them, or dropped); return the traced requests' timelines (None
    when nothing was traced)."""
    observers, frames = [], []
    for s in setups:
        if isinstance(s.observer, ReplicaObserver):
            observers.append(s.observer)
            if fleet is not None:
                frames.append(s.observer.diagnoser.frame())
                s.recorder.add_columns(frames[-1])
    if frames and fleet is not None:
        import pandas as pd

        fleet.add_columns(pd.concat(frames, ignore_index=True))
    traces = [o.tracer.frame() for o in observers if o.tracer is not None]
    if not traces:
        return None
    import pandas as pd

    return pd.concat(traces, ignore_index=True)
