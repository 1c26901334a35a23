"""Recorded step traces: gzip'd JSON lines, a metadata line first, then one run per line.

The metadata names the scheduler that produced the runs (for vLLM its exact
version) and the generator version, so a stale file is refused rather than
silently compared; each run also carries its configuration's digest.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from pathlib import Path

from parity.steps import RunResult, StepRecord

FORMAT_VERSION = 2  # 2: a step's drafts


def write_trace(path: Path, metadata: dict, runs: Iterable[RunResult]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # mtime=0: the same runs give the same bytes, so a re-record diffs cleanly
    with open(path, "wb") as raw, \
            gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as gz:
        head = {"format": FORMAT_VERSION, **metadata}
        gz.write((json.dumps(head, sort_keys=True) + "\n").encode())
        for run in runs:
            row = {"name": run.name, "digest": run.digest, "error": run.error,
                   "steps": [s.to_json() for s in run.steps]}
            gz.write((json.dumps(row, separators=(",", ":")) + "\n").encode())


def read_trace(path: Path) -> tuple[dict, dict[str, RunResult]]:
    """(metadata, runs by configuration name)."""
    with gzip.open(path, "rt") as f:
        head = json.loads(f.readline())
        if head.get("format") != FORMAT_VERSION:
            raise ValueError(f"{path}: trace format {head.get('format')}, expected "
                             f"{FORMAT_VERSION}; re-record it")
        runs = {}
        for line in f:
            row = json.loads(line)
            runs[row["name"]] = RunResult(row["name"], row["digest"],
                                          tuple(StepRecord.from_json(s) for s in row["steps"]),
                                          row["error"])
    return head, runs
