"""Where the points of a sweep, compare or plan run: joblib (loky here, or Dask or Ray), with
finished points cached so a killed experiment resumes, and dead workers retried.

Every task is one simulation in its own process; workers return plain dicts,
gathered in task order, so a table is the same whichever backend, job count
or interruption produced it (wall-time fields aside). Results land unordered
(so each finished point is cached at once, sim.experiments.cache) and are put
back in task order. A worker that dies (killed, out of memory) fails its
pool; the points not yet finished then run again, up to `RETRIES` times.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.config.scenario import Scenario
from sim.experiments.cache import PointCache

BACKENDS = ("loky", "dask", "ray")
RETRIES = 2


class SweepError(Exception):
    """A user mistake in a sweep or compare request: printed as one line, exit 2."""


@dataclass(frozen=True, slots=True)
class Task:
    """One simulation: a validated scenario; `out_dir` set = write its outputs there."""

    scenario: Scenario
    base_dir: Path
    out_dir: Path | None = None
    plots: bool = False


@dataclass(frozen=True, slots=True)
class Backend:
    """Where tasks run: `jobs` None = every CPU; `address` = an existing Dask scheduler."""

    name: str = "loky"
    jobs: int | None = None
    address: str | None = None


def stream_digest(scenario: Scenario, base_dir: Path) -> tuple[str, int, float]:
    """sha256 of the request stream (ids, arrivals, lengths, prefixes), its size and span.

    Regenerating the seeded stream costs microseconds per request, far less than
    simulating it, and lets compare check that variants saw the same requests.
    """
    from sim.workload import make_requests

    h = hashlib.sha256()
    count, last_s = 0, 0.0
    for r in make_requests(scenario.workload, scenario.seed, base_dir):
        h.update(repr((r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens,
                       r.prefix_block_ids)).encode())
        count, last_s = count + 1, r.arrival_s
    return h.hexdigest()[:16], count, last_s


def run_task(task: Task) -> dict[str, Any]:
    """Simulate one point in a worker; only plain values travel back.

    A user-level failure (no room for KV, a missing trace) comes back as
    {"error": message}, so the parent can say which point failed. No request rows
    stay in memory: a point with `out_dir` streams its requests.csv there, one
    without keeps none (its figures come from the recorder's sketches and totals),
    so a worker's memory follows the requests in flight, not those done.
    """
    from sim.experiments.outputs import write_outputs
    from sim.experiments.run import run_scenario
    from sim.results.files.report import jsonable

    _thread_lock_for_tqdm()
    requests_csv = None
    if task.out_dir is not None:
        task.out_dir.mkdir(parents=True, exist_ok=True)
        requests_csv = task.out_dir / "requests.csv"
    try:
        result = run_scenario(task.scenario, task.base_dir, show_progress=False,
                              requests_csv=requests_csv, keep_rows=False)
    except (ValueError, FileNotFoundError) as err:
        if requests_csv is not None:  # a failed point leaves no half-written rows
            requests_csv.unlink(missing_ok=True)
        return {"error": str(err)}
    summary = dict(result.summary)
    if task.out_dir is not None:
        write_outputs(result, task.out_dir, plots=task.plots)
    digest, count, span_s = stream_digest(task.scenario, task.base_dir)
    out = jsonable(summary)
    out.pop("simulation_wall_s", None)
    out.update(wall_s=result.wall_s, request_stream=digest, num_arrivals=count,
               arrival_span_s=span_s, finish_span_s=result.recorder.finish_span_s)
    return out


def _thread_lock_for_tqdm() -> None:
    """Give tqdm a thread lock in a worker that has none yet.

    Even a disabled bar takes tqdm's class lock, by default a multiprocessing
    semaphore; a worker killed on Ctrl-C never unlinks it, and Python warns of
    "leaked semaphore objects" at exit. A worker draws no bars, so a thread lock does.
    """
    from tqdm import tqdm

    if not hasattr(tqdm, "_lock"):
        tqdm.set_lock(threading.RLock())


def _indexed(work: Any, index: int, task: Task) -> tuple[int, dict[str, Any]]:
    return index, work(task)


def _worker_died(err: BaseException) -> bool:
    """A pool broken by a dead worker (loky's TerminatedWorkerError, a broken pool)."""
    from concurrent.futures.process import BrokenProcessPool

    return isinstance(err, BrokenProcessPool) or type(err).__name__ in (
        "TerminatedWorkerError", "WorkerLostError", "KilledWorker")


@dataclass(slots=True)
class Runner:
    """Runs tasks under the backend `open_backend` set up; results in task order.

    `cache` set: a task whose point is cached is not run again, and each result is
    cached as it lands; `reused` counts the points the cache gave.
    """

    n_jobs: int
    in_process: bool  # one job on loky runs here: no pickling, and tests can watch it
    cache: PointCache = field(default_factory=lambda: PointCache(None))
    reused: int = 0
    work: Any = None  # what runs one task: run_task (None); tests pass one that dies

    def run(self, tasks: Sequence[Task], progress: Any = None) -> list[dict[str, Any]]:
        """`progress` (a tqdm bar) advances as each result lands."""
        keys = [self.cache.key(t, stream_digest) for t in tasks]
        results: list[dict[str, Any] | None] = [self.cache.get(k) for k in keys]
        done = sum(r is not None for r in results)
        self.reused += done
        if progress is not None and done:
            progress.update(done)
        for attempt in range(RETRIES + 1):
            pending = [i for i, r in enumerate(results) if r is None]
            try:
                for i, result in self._stream(tasks, pending):
                    results[i] = result
                    self.cache.put(keys[i], result)
                    if progress is not None:
                        progress.update(1)
                break
            except Exception as err:  # noqa: BLE001 - only a dead worker is retried
                if not _worker_died(err) or attempt == RETRIES:
                    raise
        return [r for r in results if r is not None]

    def _stream(self, tasks: Sequence[Task], pending: list[int]) -> Iterator[tuple[int, Any]]:
        from joblib import Parallel, delayed

        if not pending:
            return iter(())
        n_jobs = min(self.n_jobs, len(pending)) if self.n_jobs > 0 else self.n_jobs
        work = self.work or run_task
        if n_jobs == 1 and self.in_process:
            return ((i, work(tasks[i])) for i in pending)
        return Parallel(n_jobs=n_jobs, return_as="generator_unordered")(
            delayed(_indexed)(work, i, tasks[i]) for i in pending)


@contextmanager
def open_backend(backend: Backend, cache: PointCache | None = None) -> Iterator[Runner]:
    """Set joblib's backend (and a Dask client) up for the block; yields the runner."""
    import joblib

    if backend.name not in BACKENDS:
        raise SweepError(f"unknown backend {backend.name!r}; choose from {', '.join(BACKENDS)}")
    if backend.jobs is not None and backend.jobs < 1:
        raise SweepError(f"--jobs must be >= 1, got {backend.jobs}")
    if backend.address is not None and backend.name != "dask":
        raise SweepError("--scheduler-address only applies to --backend dask")
    if backend.name == "loky":
        yield Runner(backend.jobs or os.cpu_count() or 1, True, cache or PointCache(None))
        return
    with ExitStack() as stack:
        if backend.name == "dask":
            try:
                from dask.distributed import Client, LocalCluster
            except ImportError:
                raise SweepError("--backend dask needs dask.distributed: "
                                 "pip install 'servesim[dask]'") from None
            if backend.address:
                client = stack.enter_context(Client(backend.address))
            else:
                cluster = stack.enter_context(LocalCluster(
                    n_workers=backend.jobs or os.cpu_count() or 1, threads_per_worker=1,
                    processes=True, dashboard_address=None))
                client = stack.enter_context(Client(cluster))
            client.wait_for_workers(1)
        else:
            try:
                from ray.util.joblib import register_ray
            except ImportError:
                raise SweepError("--backend ray needs ray: pip install 'servesim[ray]'") from None
            register_ray()
        stack.enter_context(joblib.parallel_config(backend=backend.name))
        # -1: every worker the cluster has (for Dask, --jobs sized the local cluster)
        jobs = -1 if backend.jobs is None or backend.name == "dask" else backend.jobs
        yield Runner(jobs, False, cache or PointCache(None))
