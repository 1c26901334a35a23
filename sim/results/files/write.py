"""A run's result files: summary.json (with provenance), requests.csv, timeseries.csv, and for
a fleet replicas.csv, for a traced run timeline.csv. No pictures here (sim.plots.run).

The CLI writes into a staging directory that replaces the old run whole
(sim.results.files.output_dir), so files here need no atomic renames of their own;
a simulated run streams requests.csv into it as requests finish
(sim.results.record.requests.RequestCSV). Plain columns are written in pandas' format
(floats as repr, NaN empty), so a run without plots loads no pandas.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.results.files.provenance import provenance
from sim.results.files.report import jsonable

if TYPE_CHECKING:
    import pandas as pd


def write_columns(path: Path, columns: Mapping[str, np.ndarray]) -> Path:
    """Numeric columns as CSV, byte for byte what pandas' to_csv(index=False) writes.

    Lines are joined here, not by the csv module: a number's cell never needs quoting,
    and the csv writer's own per-character scan of each cell costs as much as its repr.
    """
    cells = [_cells(np.asarray(col)) for col in columns.values()]
    lines = [",".join(columns), *map(",".join, zip(*cells, strict=True))]
    with open(path, "w", newline="") as f:
        f.write("\n".join(lines) + "\n")
    return path


def _cells(col: np.ndarray) -> list[str]:
    """A numeric column's cells as the csv module writes them: a float as its repr (an int's
    repr is its str), NaN empty."""
    cells = list(map(repr, col.tolist()))
    if col.dtype.kind == "f" and np.isnan(col).any():
        return ["" if c == "nan" else c for c in cells]
    return cells


def write_run_files(out_dir: Path, summary: dict[str, Any], requests: pd.DataFrame | None,
                    series: pd.DataFrame | Mapping[str, np.ndarray]) -> list[Path]:
    """summary.json (gaining a `provenance` block: servesim version, git commit, schema
    version), requests.csv (None: already streamed there) and timeseries.csv (a frame or
    its columns) in `out_dir`; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary_path = out_dir / "summary.json"
    stamped = {**summary, "provenance": provenance()}
    summary_path.write_text(json.dumps(jsonable(stamped), indent=2, allow_nan=False) + "\n")
    requests_path, series_path = out_dir / "requests.csv", out_dir / "timeseries.csv"
    if requests is not None:
        requests.to_csv(requests_path, index=False)
    if isinstance(series, Mapping):
        write_columns(series_path, series)
    else:
        series.to_csv(series_path, index=False)
    return [summary_path, requests_path, series_path]


def write_replicas(out_dir: Path, rows: Sequence[dict[str, Any]]) -> Path:
    """replicas.csv: a fleet's row per replica (sim.results.files.summary.replica_rows)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "replicas.csv"
    import pandas as pd  # a fleet's rows mix types as pandas prints them

    pd.DataFrame(list(rows)).to_csv(path, index=False)
    return path


def write_timeline(out_dir: Path, frame: pd.DataFrame) -> Path:
    """timeline.csv: the traced requests' segments (sim.observe.trace.timeline_frame)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "timeline.csv"
    frame.to_csv(path, index=False)
    return path
