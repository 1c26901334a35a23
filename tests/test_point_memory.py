"""Sweep, compare, plan and replication points keep no request rows: memory follows the
requests in flight, not those done, and every figure and file equals the in-memory run's."""

from __future__ import annotations

import gc
import io
import tracemalloc
from pathlib import Path

import pandas as pd
import pytest

from sim.config.loader import load_scenario
from sim.experiments.outputs import write_outputs
from sim.experiments.replicate import replicate
from sim.experiments.run import run_scenario
from sim.experiments.runner import Backend, Task, run_task, stream_digest
from sim.results.files.report import jsonable

CASES = {
    "plain": [],
    "rejections": ["scheduler.max_model_len=2048"],
    "speculative": ["speculative.num_tokens=3"],
    "fleet": ["replicas=2"],
}


def _scenario(sets: list[str], num_requests: int = 120):  # noqa: ANN202
    return load_scenario("scenarios/quickstart.yaml",
                         [f"workload.num_requests={num_requests}", *sets])


def _same(a: dict, b: dict) -> bool:
    """Equal dicts, NaN equal to NaN (compared by their JSON text)."""
    return pd.Series({k: str(v) for k, v in a.items()}).equals(
        pd.Series({k: str(v) for k, v in b.items()}))


@pytest.mark.parametrize("case", list(CASES))
def test_a_point_keeps_no_rows_and_gives_the_in_memory_runs_figures(case: str) -> None:
    scenario, base_dir = _scenario(CASES[case])
    kept = run_scenario(scenario, base_dir, show_progress=False)
    dropped = run_scenario(scenario, base_dir, show_progress=False, keep_rows=False)
    for recorder in (dropped.recorder, *dropped.replica_recorders):
        with pytest.raises(ValueError, match="keeps no request rows"):
            recorder.request_arrays()
    assert dropped.timeline is None
    wall = ("simulation_wall_s",)
    assert _same({k: v for k, v in dropped.summary.items() if k not in wall},
                 {k: v for k, v in kept.summary.items() if k not in wall})
    finish_s = kept.recorder.requests_frame()["finish_s"].dropna()
    assert len(finish_s) > 1
    assert dropped.recorder.finish_span_s == float(finish_s.max() - finish_s.min())
    assert kept.recorder.finish_span_s == dropped.recorder.finish_span_s


def test_a_points_result_is_what_it_was_when_it_read_the_rows() -> None:
    """run_task's dict, rebuilt as it was before the rows were dropped (from a kept run's
    frame), equals the row-free one in every field but wall time."""
    scenario, base_dir = _scenario(CASES["rejections"])
    point = run_task(Task(scenario, base_dir))
    kept = run_scenario(scenario, base_dir, show_progress=False)
    finish_s = kept.recorder.requests_frame()["finish_s"].dropna()
    digest, count, span_s = stream_digest(scenario, base_dir)
    before = jsonable(dict(kept.summary))
    before.pop("simulation_wall_s")
    before.update(request_stream=digest, num_arrivals=count, arrival_span_s=span_s,
                  finish_span_s=float(finish_s.max() - finish_s.min()))
    point.pop("wall_s")
    assert point["rejected"] > 0
    assert _same(point, before)


@pytest.mark.parametrize("case", ["rejections", "fleet"])
def test_a_point_with_outputs_writes_a_plain_runs_files(case: str, tmp_path: Path) -> None:
    scenario, base_dir = _scenario(CASES[case])
    point_dir, run_dir = tmp_path / "runs" / "000", tmp_path / "run"
    assert "error" not in run_task(Task(scenario, base_dir, point_dir, plots=False))
    run_dir.mkdir()
    result = run_scenario(scenario, base_dir, show_progress=False,
                          requests_csv=run_dir / "requests.csv")  # as `servesim run`
    write_outputs(result, run_dir, plots=False)
    names = sorted(p.name for p in run_dir.iterdir())
    assert names == sorted(p.name for p in point_dir.iterdir())
    assert "requests.csv" in names and "timeseries.csv" in names
    for name in names:
        if name != "summary.json":  # (its wall time differs)
            assert (point_dir / name).read_bytes() == (run_dir / name).read_bytes(), name


def test_a_failed_point_leaves_no_rows_behind(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_bytes(Path("sim/workload/data/synthetic_conv.csv").read_bytes())
    scenario, base_dir = load_scenario("scenarios/synthetic_trace.yaml",
                                       [f"workload.trace.path={trace}"])
    trace.unlink()  # gone by the time the point runs: the run fails after it began
    result = run_task(Task(scenario, base_dir, tmp_path / "p", plots=False))
    assert "error" in result
    assert not (tmp_path / "p" / "requests.csv").exists()


def test_replication_zero_streams_the_plain_runs_requests_csv(tmp_path: Path) -> None:
    scenario, base_dir = _scenario(CASES["rejections"], 80)
    first, pooled = replicate(scenario, base_dir, 2, Backend(jobs=1), show_progress=False,
                              requests_csv=tmp_path / "repl.csv")
    assert pooled and first.recorder.streamed_to == tmp_path / "repl.csv"
    run_scenario(scenario, base_dir, show_progress=False, requests_csv=tmp_path / "run.csv")
    assert (tmp_path / "repl.csv").read_bytes() == (tmp_path / "run.csv").read_bytes()
    frame = pd.read_csv(io.StringIO((tmp_path / "repl.csv").read_text()))
    assert (frame["status"] == "rejected").any() and len(frame) == 80


def test_a_timeline_needs_the_rows() -> None:
    scenario, base_dir = _scenario([])
    with pytest.raises(ValueError, match="timeline"):
        run_scenario(scenario, base_dir, show_progress=False, timeline=3, keep_rows=False)


# Equal requests arriving evenly: past the first few thousand, the time batches, the time
# series and the sketches have met every value they will see (and only merge as the run
# grows longer), so what still grows with the count is what is kept per request.
_EVEN = ["workload.prompt_tokens={dist: fixed, value: 32}",
         "workload.output_tokens={dist: fixed, value: 4}",
         "workload.arrivals={process: constant, rate: 20}"]


def _retained_bytes(num_requests: int, keep_rows: bool) -> int:
    scenario, base_dir = _scenario(_EVEN, num_requests)
    gc.collect()
    tracemalloc.start()
    try:
        result = run_scenario(scenario, base_dir, show_progress=False, keep_rows=keep_rows)
        gc.collect()
        retained = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert result.summary["completed"] == num_requests
    return retained


def test_a_points_memory_does_not_grow_with_requests_done() -> None:
    """Allocations, not timing: a kept run's result grows by its rows (96 B a request in the
    log, 96 B of TTFT diagnosis); a point's does not grow."""
    _retained_bytes(200, False)  # imports and first-use caches out of the measurement
    extra = 2000
    dropped = (_retained_bytes(4000, False) - _retained_bytes(2000, False)) / extra
    kept = (_retained_bytes(4000, True) - _retained_bytes(2000, True)) / extra
    assert kept > 150  # the rows: what the measurement sees
    assert dropped < 20
