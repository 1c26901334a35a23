"""One bench_sim point in this process: the simulation's wall time, steps, events and RSS.

bench_sim.py runs each point in a fresh process of this module's code (through its
`--point N RATE`), so a point's peak RSS is its own; the counts hook the classes
they count (the decode runs the scheduler applies, the requests the recorder
records) rather than adding counters to the simulator. Apart from bench_sim.py,
which only starts processes and compares their rows.
"""

from __future__ import annotations

import inspect
import resource
import shutil
import tempfile
import threading
import time
from pathlib import Path


def scenario_dict(num_requests: int, rate: float) -> dict:
    trace = "builtin:azure_conv"
    lengths = {"prompt_tokens": {"dist": "empirical", "trace": trace, "column": "prompt"},
               "output_tokens": {"dist": "empirical", "trace": trace, "column": "output"}}
    return {"name": "bench", "workload": {"arrivals": {"process": "poisson", "rate": rate},
                                         "num_requests": num_requests, **lengths}}


def one_point(num_requests: int, rate: float) -> dict:
    """The point's row, its process started as the `servesim` process starts (its
    collector off and no pydantic plugin scan while it imports, one BLAS thread:
    sim.cli.start_up) and its work begun where `servesim run` begins it, once the
    scenario is read; a checkout without that start-up (the code before it) starts
    plainly, as its own `servesim` did."""
    try:
        from sim.cli import start_up
    except ImportError:
        start_up = None
    if start_up is not None:
        start_up.begin()
    from sim.config.scenario import Scenario
    from sim.experiments.run import run_scenario

    runs = _count_runs()
    done = _count_recorded()
    scenario = Scenario.model_validate(scenario_dict(num_requests, rate))
    if start_up is not None:
        start_up.started()
    rss_before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out_dir = Path(tempfile.mkdtemp(prefix="bench-point-"))
    samples: list[list[float]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=_sample_rss, args=(done, samples, stop), daemon=True)
    sampler.start()
    started = time.perf_counter()
    # as `servesim run` does: requests.csv streams to disk as requests finish
    streams = "requests_csv" in inspect.signature(run_scenario).parameters
    result = (run_scenario(scenario, show_progress=False, requests_csv=out_dir / "requests.csv")
              if streams else run_scenario(scenario, show_progress=False))
    wall_s = time.perf_counter() - started
    stop.set()
    sampler.join()
    shutil.rmtree(out_dir, ignore_errors=True)
    s = result.summary
    row = {"n": num_requests, "rate": rate, "wall_s": wall_s,
           "sim_req_per_wall_s": num_requests / wall_s,
           "steps": s["num_steps"], "steps_per_wall_s": s["num_steps"] / wall_s,
           "mean_batch": s["mean_batch_size"], "sim_duration_s": s["duration"],
           "max_waiting": int(result.recorder.steps_columns()["max_waiting"].max()),
           "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "rss_after_setup_mib": rss_before_kib / 1024,
           "rss_by_requests_done": samples}
    slope = _slope(samples)
    if slope is not None:
        row["rss_bytes_per_request_done"] = slope
    if runs is not None:
        row["decode_runs"], row["steps_in_runs"] = runs
        row["events"] = s["num_steps"] - runs[1] + runs[0]
    if start_up is not None:
        start_up.leaving()
    return row


def _count_runs() -> list[int] | None:
    """[runs, steps in them], counted as the scheduler applies them (None: no fast-forward)."""
    from sim.core.schedulers.continuous import ContinuousScheduler

    advance = getattr(ContinuousScheduler, "advance_decodes", None)
    if advance is None:
        return None
    counts = [0, 0]

    def counted(self: ContinuousScheduler, run: object, begin: int, end: int,
                step_end_s: object) -> object:
        counts[0] += begin == 0  # a run may be applied in parts (at arrivals during it)
        counts[1] += end - begin
        return advance(self, run, begin, end, step_end_s)

    ContinuousScheduler.advance_decodes = counted  # type: ignore[method-assign]
    return counts


def _count_recorded() -> list[int]:
    """[requests recorded so far] (finished or rejected), counted as the recorder sees them."""
    from sim.results.record.recorder import RunRecorder

    counts = [0]
    for name in ("record_finished", "record_rejected"):
        method = getattr(RunRecorder, name)

        def counted(self: RunRecorder, req: object, _method=method) -> None:  # noqa: ANN001
            counts[0] += 1
            _method(self, req)

        setattr(RunRecorder, name, counted)
    return counts


def _rss_mib() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**20


def _sample_rss(done: list[int], samples: list[list[float]], stop: threading.Event) -> None:
    """[requests recorded, RSS MiB] every second until `stop`."""
    while not stop.wait(1.0):
        samples.append([done[0], round(_rss_mib(), 2)])


def _slope(samples: list[list[float]]) -> float | None:
    """RSS bytes per request recorded: least squares over the second half of the samples
    (past the start-up and the queue's fill), None with too few."""
    part = samples[len(samples) // 2:]
    if len(part) < 5 or part[-1][0] == part[0][0]:
        return None
    n = len(part)
    mx = sum(x for x, _ in part) / n
    my = sum(y for _, y in part) / n
    sxx = sum((x - mx) ** 2 for x, _ in part)
    sxy = sum((x - mx) * (y - my) for x, y in part)
    return sxy / sxx * 2**20
