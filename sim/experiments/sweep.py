"""Parameter sweeps: a grid of scenario overrides, one simulation per point, in parallel.

Every point is validated in the parent first (a typo fails before any worker
starts), then runs in its own process through joblib: loky on this machine by
default, or the user's Dask or Ray cluster through joblib's backend, with the
scenario file unchanged. Workers return plain dicts, gathered in grid order,
so the table is the same whichever backend or job count ran it (wall-time
fields aside). Workers write nothing unless asked to (`--plots`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from sim.config.loader import load_scenario
from sim.config.scenario import Scenario
from sim.config.yaml_input import ScenarioError
from sim.results.steady import window_columns

BACKENDS = ("loky", "dask", "ray")
WALL_FIELDS = ("wall_s",)
TABLE_METRICS = ("completed", "rejected", "request_throughput", "output_throughput",
                 "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
                 "request_goodput", "slo_attainment", "mean_batch_size", "slot_utilization",
                 "kv_waste_fraction", "kv_waste_of_held", "total_preemptions",
                 "max_num_running", "kv_blocks_total")
SHORT_METRICS = ("completed", "request_throughput", "output_throughput", "p99_ttft_ms",
                 "p99_tpot_ms", "request_goodput", "slot_utilization", "kv_waste_of_held",
                 "sustained")


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


def parse_grid(items: Sequence[str]) -> dict[str, list[Any]]:
    """'key=v1,v2' strings -> {key: [v1, v2]}; values are YAML ('[1,2],[3]' is two lists)."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or not text.strip() or any(not p for p in key.split(".")):
            raise SweepError(f"--grid {item!r}: expected key.path=v1,v2,...")
        if key in grid:
            raise SweepError(f"--grid {item!r}: {key} is already in the grid")
        try:
            values = yaml.safe_load(f"[{text}]")
        except yaml.YAMLError as err:
            raise SweepError(f"--grid {item!r}: values are not valid YAML: "
                             f"{getattr(err, 'problem', None) or err}") from None
        if not values or any(v is None for v in values):
            raise SweepError(f"--grid {item!r}: empty value in the list")
        grid[key] = values
    if not grid:
        raise SweepError("give at least one --grid key=v1,v2,...")
    return grid


def override(key: str, value: Any) -> str:
    """The `--set` string for one parsed value (JSON is YAML, so it round-trips)."""
    return f"{key}={json.dumps(value)}"


def grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The cartesian product in grid order: the first key varies slowest."""
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*grid.values())]


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
    {"error": message}, so the parent can say which point failed.
    """
    from sim.experiments.outputs import write_outputs
    from sim.experiments.run import run_scenario
    from sim.results.report import jsonable

    _thread_lock_for_tqdm()
    try:
        result = run_scenario(task.scenario, task.base_dir, show_progress=False)
    except (ValueError, FileNotFoundError) as err:
        return {"error": str(err)}
    summary = dict(result.summary)
    if task.out_dir is not None:
        write_outputs(result, task.out_dir, plots=task.plots)
    digest, count, span_s = stream_digest(task.scenario, task.base_dir)
    finish_s = result.recorder.requests_frame()["finish_s"].dropna()
    out = jsonable(summary)
    out.pop("simulation_wall_s", None)
    out.update(wall_s=result.wall_s, request_stream=digest, num_arrivals=count,
               arrival_span_s=span_s,
               finish_span_s=float(finish_s.max() - finish_s.min()) if len(finish_s) else 0.0)
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


@dataclass(frozen=True, slots=True)
class Runner:
    """Runs tasks under the backend `open_backend` set up; results in task order."""

    n_jobs: int
    in_process: bool  # one job on loky runs here: no pickling, and tests can watch it

    def run(self, tasks: Sequence[Task], progress: Any = None) -> list[dict[str, Any]]:
        """`progress` (a tqdm bar) advances as each result lands."""
        from joblib import Parallel, delayed

        n_jobs = min(self.n_jobs, len(tasks)) if self.n_jobs > 0 else self.n_jobs
        if n_jobs == 1 and self.in_process:
            stream: Any = map(run_task, tasks)
        else:
            stream = Parallel(n_jobs=n_jobs, return_as="generator")(
                delayed(run_task)(t) for t in tasks)
        results = []
        for result in stream:
            results.append(result)
            if progress is not None:
                progress.update(1)
        return results


@contextmanager
def open_backend(backend: Backend) -> Iterator[Runner]:
    """Set joblib's backend (and a Dask client) up for the block; yields the runner."""
    import joblib

    if backend.name not in BACKENDS:
        raise SweepError(f"unknown backend {backend.name!r}; choose from {', '.join(BACKENDS)}")
    if backend.jobs is not None and backend.jobs < 1:
        raise SweepError(f"--jobs must be >= 1, got {backend.jobs}")
    if backend.address is not None and backend.name != "dask":
        raise SweepError("--scheduler-address only applies to --backend dask")
    if backend.name == "loky":
        yield Runner(backend.jobs or os.cpu_count() or 1, in_process=True)
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
        yield Runner(jobs, in_process=False)


def build_tasks(path: str | Path, points: list[dict[str, Any]], out_dir: Path | None,
                plots: bool) -> list[Task]:
    """Validate every point in the parent: a bad key or value fails before any run."""
    tasks = []
    for i, point in enumerate(points):
        sets = [override(k, v) for k, v in point.items()]
        try:
            scenario, base_dir = load_scenario(path, sets)
        except ScenarioError as err:
            raise SweepError(f"{err} (grid point {point_label(point)})") from None
        run_dir = out_dir / "runs" / f"{i:03d}" if out_dir is not None and plots else None
        tasks.append(Task(scenario, base_dir, run_dir, plots))
    return tasks


def point_label(point: dict[str, Any]) -> str:
    return " ".join(f"{k}={json.dumps(v)}" for k, v in point.items())


def sweep(path: str | Path, grid: dict[str, list[Any]], backend: Backend | None = None,
          out_dir: Path | None = None, plots: bool = False, progress: bool = True
          ) -> pd.DataFrame:
    """Run every grid point; one row per point, grid columns first, in grid order."""
    from tqdm import tqdm

    backend = backend or Backend()
    points = grid_points(grid)
    tasks = build_tasks(path, points, out_dir, plots)
    with open_backend(backend) as runner, tqdm(total=len(tasks), unit="run", desc="sweep",
                                                disable=not progress) as bar:
        results = runner.run(tasks, bar)
    rows = []
    for point, result in zip(points, results, strict=True):
        if "error" in result:
            raise SweepError(f"{result['error']} (grid point {point_label(point)})")
        row: dict[str, Any] = {k: _cell(v) for k, v in point.items()}
        row.update({m: result.get(m) for m in TABLE_METRICS})
        row.update(window_columns(result))
        row["wall_s"] = result["wall_s"]
        rows.append(row)
    table = pd.DataFrame(rows)
    if plots and out_dir is not None:
        from sim.plots.compare import plot_sweep  # lazy: matplotlib only when plotting

        plot_sweep(table, list(grid), out_dir / "sweep.png")
    return table


def _cell(value: Any) -> Any:
    """Grid values as table cells: scalars as is, lists and mappings as JSON text."""
    return json.dumps(value) if isinstance(value, list | dict) else value


def markdown_table(frame: pd.DataFrame, float_format: str = "{:.4g}") -> str:
    """A GitHub Markdown table (no `tabulate` dependency); NaN/None as 'n/a'."""

    def cell(value: Any) -> str:
        if value is None or (isinstance(value, float) and value != value):
            return "n/a"
        if isinstance(value, float):
            return float_format.format(value)
        return str(value)

    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "| " + " | ".join("---" for _ in frame.columns) + " |"
    body = ["| " + " | ".join(cell(v) for v in row) + " |"
            for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body]) + "\n"


def write_table(frame: pd.DataFrame, out_dir: Path, stem: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out_dir / f"{stem}.csv", out_dir / f"{stem}.md"
    frame.to_csv(csv_path, index=False)
    md_path.write_text(markdown_table(frame))
    return [csv_path, md_path]
