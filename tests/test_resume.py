"""Resumable experiments: finished points cached by hash, reused after a kill, dead workers
retried, and the results identical to an uninterrupted run."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from test_sweep import TINY

from sim.cli import main
from sim.config.loader import load_scenario
from sim.experiments.cache import CACHE_DIR, PointCache, point_key
from sim.experiments.runner import Runner, Task, run_task, stream_digest

ROOT = Path(__file__).resolve().parent.parent


def _tasks(tmp_path: Path, rates: list[float], n: int = 40) -> list[Task]:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    tasks = []
    for rate in rates:
        scenario, base_dir = load_scenario(path, [f"workload.arrivals.rate={rate}",
                                                  f"workload.num_requests={n}"])
        tasks.append(Task(scenario, base_dir))
    return tasks


def test_the_key_names_the_resolved_scenario_its_stream_and_the_code(tmp_path: Path) -> None:
    a, b = _tasks(tmp_path, [4.0, 5.0])
    cache = PointCache(tmp_path / "c", "v1")
    assert cache.key(a, stream_digest) == cache.key(a, stream_digest)
    assert cache.key(a, stream_digest) != cache.key(b, stream_digest)
    assert PointCache(tmp_path / "c", "v2").key(a, stream_digest) != cache.key(a, stream_digest)
    assert point_key("s", "d", "c") != point_key("s", "d", "c2")
    assert PointCache(None).key(a, stream_digest) is None
    with_files = Task(a.scenario, a.base_dir, out_dir=tmp_path / "run")
    assert cache.key(with_files, stream_digest) is None  # its files would not come back


def test_a_cached_point_comes_back_identical_and_a_torn_one_reruns(tmp_path: Path) -> None:
    tasks = _tasks(tmp_path, [4.0, 8.0])
    cache = PointCache(tmp_path / "c", "v1")
    first = Runner(1, True, cache)
    results = first.run(tasks)
    assert first.reused == 0 and len(list((tmp_path / "c").glob("*.json"))) == 2
    again = Runner(1, True, cache, work=_forbidden)
    assert again.run(tasks) == results and again.reused == 2
    key = cache.key(tasks[1], stream_digest)
    (tmp_path / "c" / f"{key}.json").write_text('{"torn')
    third = Runner(1, True, cache)
    rerun = third.run(tasks)
    assert rerun[0] == results[0] and third.reused == 1
    assert _no_wall(rerun[1]) == _no_wall(results[1])


def _no_wall(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "wall_s"}


def _forbidden(task: Task) -> dict:
    raise AssertionError("a cached point ran again")


def _die_once(marker: Path, task: Task) -> dict:
    """Kill this worker the first time `marker` is missing; run the task after."""
    if task.scenario.workload.arrivals.rate == 8.0 and not marker.exists():
        marker.write_text("died")
        os._exit(1)
    return run_task(task)


def test_a_dead_worker_is_retried_with_identical_results(tmp_path: Path) -> None:
    cloudpickle = pytest.importorskip("cloudpickle")  # what loky pickles tasks with

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        tasks = _tasks(tmp_path, [4.0, 8.0, 16.0])
        work = functools.partial(_die_once, tmp_path / "marker")
        results = Runner(2, False, work=work).run(tasks)
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert (tmp_path / "marker").exists()  # a worker did die
    expected = Runner(1, True).run(tasks)
    assert [_no_wall(r) for r in results] == [_no_wall(r) for r in expected]


def test_a_sweep_killed_half_way_resumes_where_it_stopped(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY)
    rates = ",".join(str(r) for r in range(1, 9))
    args = ["sweep", str(scenario), "--grid", f"workload.arrivals.rate={rates}",
            "--grid", "workload.num_requests=800", "--jobs", "1"]
    killed = tmp_path / "killed" / "out"
    killed.parent.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "sim.cli", *args, "--out", str(killed)],
                            cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    points = killed.parent / CACHE_DIR / "points"
    deadline = time.monotonic() + 300  # a generous bound, not a speed requirement
    while len(list(points.glob("*.json"))) < 2 and proc.poll() is None:
        assert time.monotonic() < deadline, "no point finished"
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not killed.exists()  # nothing half-written where the results go
    cached = len(list(points.glob("*.json")))
    assert 2 <= cached < 8
    assert main([*args, "--out", str(killed)]) == 0
    reused = capsys.readouterr().out
    assert f"8 runs ({cached} reused" in reused
    fresh = tmp_path / "fresh" / "out"
    fresh.parent.mkdir()
    assert main([*args, "--out", str(fresh)]) == 0
    assert "(0 reused" in capsys.readouterr().out
    a = pd.read_csv(killed / "sweep.csv").drop(columns="wall_s")
    b = pd.read_csv(fresh / "sweep.csv").drop(columns="wall_s")
    pd.testing.assert_frame_equal(a, b)
