"""A run's result files: summary.json (with provenance), requests.csv, timeseries.csv, and for
a fleet replicas.csv, for a traced run timeline.csv. No pictures here (sim.plots.run).

The CLI writes into a staging directory that replaces the old run whole
(sim.results.output_dir), so files here need no atomic renames of their own.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from sim.results.provenance import provenance
from sim.results.report import jsonable


def write_run_files(out_dir: Path, summary: dict[str, Any], requests: pd.DataFrame,
                    series: pd.DataFrame) -> list[Path]:
    """summary.json (gaining a `provenance` block: servesim version, git commit, schema
    version), requests.csv and timeseries.csv in `out_dir`; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary_path = out_dir / "summary.json"
    stamped = {**summary, "provenance": provenance()}
    summary_path.write_text(json.dumps(jsonable(stamped), indent=2, allow_nan=False) + "\n")
    requests_path, series_path = out_dir / "requests.csv", out_dir / "timeseries.csv"
    requests.to_csv(requests_path, index=False)
    series.to_csv(series_path, index=False)
    return [summary_path, requests_path, series_path]


def write_replicas(out_dir: Path, rows: Sequence[dict[str, Any]]) -> Path:
    """replicas.csv: a fleet's row per replica (sim.results.summary.replica_rows)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "replicas.csv"
    pd.DataFrame(list(rows)).to_csv(path, index=False)
    return path


def write_timeline(out_dir: Path, frame: pd.DataFrame) -> Path:
    """timeline.csv: the traced requests' segments (sim.observe.trace.timeline_frame)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "timeline.csv"
    frame.to_csv(path, index=False)
    return path
