"""Parameter sweeps: a grid of scenario overrides, one simulation per point, in parallel.

Every point is validated in the parent first (a typo fails before any worker
starts), then runs in its own process through joblib: loky on this machine by
default, or the user's Dask or Ray cluster through joblib's backend, with the
scenario file unchanged. Workers return plain dicts, gathered in grid order,
so the table is the same whichever backend or job count ran it (wall-time
fields aside). Workers write nothing unless asked to (`--plots`).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from sim.config.loader import load_scenario
from sim.config.yaml_input import ScenarioError
from sim.experiments.cache import PointCache
from sim.experiments.runner import (
    BACKENDS,
    Backend,
    Runner,
    SweepError,
    Task,
    open_backend,
    run_task,
    stream_digest,
)
from sim.results.files.report import nothing_served
from sim.results.files.steady import window_columns

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["BACKENDS", "Backend", "Runner", "SweepError", "Task", "open_backend", "run_task",
           "stream_digest", "sweep", "parse_grid", "grid_points", "override", "markdown_table",
           "write_table"]

WALL_FIELDS = ("wall_s",)
TABLE_METRICS = ("completed", "rejected", "request_throughput", "output_throughput",
                 "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
                 "request_goodput", "slo_attainment", "mean_batch_size", "slot_utilization",
                 "kv_waste_fraction", "kv_waste_of_held", "total_preemptions",
                 "max_num_running", "kv_blocks_total")
SHORT_METRICS = ("completed", "request_throughput", "output_throughput", "p99_ttft_ms",
                 "p99_tpot_ms", "request_goodput", "slot_utilization", "kv_waste_of_held",
                 "sustained")


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


def set_keys(sets: Sequence[str]) -> list[str]:
    """The field paths of `--set KEY=VALUE` strings, as written."""
    return [item.partition("=")[0].strip() for item in sets]


def build_tasks(path: str | Path, points: list[dict[str, Any]], out_dir: Path | None,
                plots: bool, fixed: Sequence[str] = ()) -> list[Task]:
    """Validate every point in the parent: a bad key or value fails before any run.
    `fixed`: `--set` overrides applied to every point first (a grid key may not repeat one)."""
    both = sorted(set(set_keys(fixed)) & {k for point in points[:1] for k in point})
    if both:
        raise SweepError(f"--set {both[0]}: the key is also a --grid key; give it in one of "
                         "them")
    tasks = []
    for i, point in enumerate(points):
        sets = [*fixed, *(override(k, v) for k, v in point.items())]
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
          out_dir: Path | None = None, plots: bool = False, progress: bool = True,
          cache: PointCache | None = None, sets: Sequence[str] = ()) -> pd.DataFrame:
    """Run every grid point; one row per point, grid columns first, in grid order.

    `cache`: finished points are reused from it and added to it (sim.experiments.cache);
    the table's `attrs["reused"]` says how many came from it. `sets`: `--set KEY=VALUE`
    overrides of the scenario, the same for every point (as `servesim run` takes them).
    `attrs["nothing_served"]`: each point where every request was rejected, and why."""
    from tqdm import tqdm

    backend = backend or Backend()
    points = grid_points(grid)
    tasks = build_tasks(path, points, out_dir, plots, sets)
    with open_backend(backend, cache) as runner, tqdm(total=len(tasks), unit="run",
                                                       desc="sweep", disable=not progress) as bar:
        results = runner.run(tasks, bar)
    rows, empty = [], []
    for point, result in zip(points, results, strict=True):
        if "error" in result:
            raise SweepError(f"{result['error']} (grid point {point_label(point)})")
        if (why := nothing_served(result)) is not None:
            empty.append(f"grid point {point_label(point)}: {why}")
        row: dict[str, Any] = {k: _cell(v) for k, v in point.items()}
        row.update({m: result.get(m) for m in TABLE_METRICS})
        row.update(window_columns(result))
        row["wall_s"] = result["wall_s"]
        rows.append(row)
    import pandas as pd  # a sweep's table; a single run never loads pandas

    table = pd.DataFrame(rows)
    table.attrs["reused"] = runner.reused
    table.attrs["nothing_served"] = empty
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
            if value.is_integer() and abs(value) < 1e15:  # a count a gap made float: 76800
                return str(int(value))
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
