"""Calibration tables on disk: writing and reading metadata.json, measurements.csv and
fit.json, and loading a table for a scenario (refusing one measured for another model
shape or block size, or a fit of other measurements). The format is sim.latency.table_format.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.config.catalogue import model_from_fields
from sim.config.specs import ModelSpec
from sim.latency.table import ErrorStats, TableFit, TableLatency
from sim.latency.table_format import (
    COLUMNS,
    FIT_FILE,
    FORMAT_VERSION,
    INT_COLUMNS,
    MEASUREMENTS_FILE,
    METADATA_FILE,
    MS_COLUMNS,
    Measurement,
    TableError,
    TableMetadata,
    upgrade_metadata,
)


def _format_ms(value: float) -> str:
    """Shortest text that reads back to the same float; empty for NaN.

    `float()` first: repr of a numpy float is `np.float64(1.5)`, which no reader parses.
    """
    value = float(value)
    return "" if math.isnan(value) else repr(value)


def _plain(value: Any) -> Any:
    """JSON for numpy scalars and arrays (a fit computed with numpy hands them over)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _dumps(raw: Mapping[str, Any]) -> str:
    return json.dumps(raw, indent=2, default=_plain) + "\n"


def write_measurements(directory: str | Path, rows: Iterable[Measurement],
                       metadata: TableMetadata) -> Path:
    """Write metadata.json and measurements.csv into `directory` (created); returns it."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / METADATA_FILE).write_text(_dumps(metadata.to_dict()))
    with (out / MEASUREMENTS_FILE).open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        for m in rows:
            writer.writerow([m.kind, " ".join(str(int(t)) for t in m.prefill_chunk_tokens),
                             " ".join(str(int(t)) for t in m.prefill_context_tokens),
                             *(int(getattr(m, c)) for c in INT_COLUMNS),
                             *(_format_ms(getattr(m, c)) for c in MS_COLUMNS)])
    return out


def _require(path: Path, what: str) -> Path:
    if not path.parent.is_dir():
        raise TableError(f"{path.parent}: no such calibration table directory")
    if not path.is_file():
        raise TableError(f"{path.parent}: missing {path.name} ({what})")
    return path


def _parse_row(row: dict[str, str], line: int, source: Path) -> Measurement:
    column = "kind"
    try:
        values: dict[str, Any] = {"kind": row["kind"]}
        for column in ("prefill_chunk_tokens", "prefill_context_tokens"):
            values[column] = tuple(int(t) for t in (row[column] or "").split())
        for column in INT_COLUMNS:
            values[column] = int(row[column])
        for column in MS_COLUMNS:
            values[column] = float(row[column]) if (row[column] or "").strip() else math.nan
    except (TypeError, ValueError) as err:
        raise TableError(f"{source}: line {line}, column {column}: {err}") from None
    try:
        return Measurement(**values)
    except ValueError as err:  # its message starts with the field
        raise TableError(f"{source}: line {line}: {err}") from None


def read_measurements(directory: str | Path) -> list[Measurement]:
    """Every row of measurements.csv, validated; errors name the line and column."""
    path = _require(Path(directory) / MEASUREMENTS_FILE, "the profiler writes it")
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise TableError(f"{path}: missing column(s) {', '.join(missing)}; "
                             f"expected {', '.join(COLUMNS)}")
        rows = [_parse_row(row, i, path) for i, row in enumerate(reader, start=2)]
    if not rows:
        raise TableError(f"{path}: no measurements")
    return rows


def _read_json(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise TableError(f"{path}: not valid JSON: {err}") from None
    if not isinstance(raw, dict):
        raise TableError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    return raw


def read_metadata(directory: str | Path) -> TableMetadata:
    path = _require(Path(directory) / METADATA_FILE, "what produced the table")
    raw = upgrade_metadata(_read_json(path), str(path))
    fields = {f.name for f in dataclasses.fields(TableMetadata)}
    missing = [f.name for f in dataclasses.fields(TableMetadata) if f.name not in raw
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    unknown = sorted(set(raw) - fields)
    if missing or unknown:
        raise TableError(f"{path}: " + "; ".join(
            ([f"missing field(s) {', '.join(missing)}"] if missing else [])
            + ([f"unknown field(s) {', '.join(unknown)}"] if unknown else [])))
    try:
        spec = raw["model_spec"]
        if not isinstance(spec, Mapping):
            raise ValueError(f"model_spec must be a mapping of ModelSpec fields, got {spec!r}")
        provenance = raw.get("provenance", {})
        if not isinstance(provenance, Mapping):
            raise ValueError(f"provenance must be a mapping of names to text, got {provenance!r}")
        return TableMetadata(**{**raw, "model_spec": model_from_fields(spec),
                                "provenance": tuple((str(k), str(v))
                                                    for k, v in provenance.items())})
    except (TypeError, ValueError) as err:
        raise TableError(f"{path}: {err}") from None


def measurements_sha256(directory: str | Path) -> str:
    """Identifies the measurements a fit came from, so a re-profile invalidates the fit."""
    path = _require(Path(directory) / MEASUREMENTS_FILE, "the profiler writes it")
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_fit(directory: str | Path, fit: TableFit, features: Mapping[str, str]) -> Path:
    """Write fit.json: coefficients, knots, feature definitions and held-out error."""
    raw = dataclasses.asdict(fit)
    raw["held_out"] = [e._asdict() for e in fit.held_out]
    body = {"format_version": FORMAT_VERSION, "features": dict(features), **raw}
    path = Path(directory) / FIT_FILE
    path.write_text(_dumps(body))
    return path


def read_fit(directory: str | Path) -> TableFit:
    path = Path(directory) / FIT_FILE
    if Path(directory).is_dir() and not path.is_file():
        raise TableError(f"{directory}: missing {FIT_FILE}; run `servesim calibrate fit "
                         f"{directory}` first")
    path = _require(path, "written by `servesim calibrate fit`")
    raw = _read_json(path)
    upgrade_metadata(raw, str(path), {})  # versioned like metadata; no fit migrations exist
    try:
        raw.pop("format_version")
        raw.pop("features", None)
        raw["knots_tokens"] = tuple(raw["knots_tokens"])
        raw["segment_slopes_ms_per_token"] = tuple(raw["segment_slopes_ms_per_token"])
        raw["held_out"] = tuple(ErrorStats(**e) for e in raw.get("held_out", ()))
        return TableFit(**raw)
    except (KeyError, TypeError, ValueError) as err:
        raise TableError(f"{path}: malformed fit ({type(err).__name__}: {err}); rerun "
                         f"`servesim calibrate fit {directory}`") from None


@dataclass(frozen=True, slots=True)
class CalibrationTable:
    path: Path
    metadata: TableMetadata
    fit: TableFit


def _spec_differences(table: ModelSpec, expected: ModelSpec) -> list[str]:
    """Fields that change the kernels; `name` is a label, so it may differ."""
    return [f"{f.name}: table {getattr(table, f.name)!r}, scenario {getattr(expected, f.name)!r}"
            for f in dataclasses.fields(ModelSpec)
            if f.name != "name" and getattr(table, f.name) != getattr(expected, f.name)]


def load_table(directory: str | Path, expected_spec: ModelSpec | None = None,
               expected_block_size: int | None = None, expected_tp: int | None = None
               ) -> CalibrationTable:
    """A table ready to predict, refused if it does not fit the scenario or its measurements."""
    directory = Path(directory)
    metadata = read_metadata(directory)
    problems = []
    if expected_spec is not None:
        problems += [f"model_spec.{d}" for d in _spec_differences(metadata.model_spec,
                                                                  expected_spec)]
    if expected_block_size is not None and metadata.block_size != expected_block_size:
        problems.append(f"block_size: table {metadata.block_size}, "
                        f"scenario {expected_block_size}")
    if expected_tp is not None and metadata.tp != expected_tp:
        problems.append(f"tp: table {metadata.tp} GPU(s), scenario hardware.count {expected_tp}")
    if problems:
        raise TableError(f"{directory}: the table was measured for a different setup "
                         f"({'; '.join(problems)}); profile one for this scenario")
    fit = read_fit(directory)
    if fit.measurements_sha256 != measurements_sha256(directory):
        raise TableError(f"{directory}: {FIT_FILE} was fitted to other measurements than "
                         f"{MEASUREMENTS_FILE}; rerun `servesim calibrate fit {directory}`")
    return CalibrationTable(directory, metadata, fit)


def open_table_latency(directory: str | Path, expected_spec: ModelSpec | None = None,
                       expected_block_size: int | None = None, tp: int = 1,
                       cpu_step_ms: float | None = None,
                       cpu_seq_ms: float | None = None) -> TableLatency:
    """`load_table` as a LatencyModel named table(<directory name>, <device name>); the CPU
    terms are the table's own unless given."""
    table = load_table(directory, expected_spec, expected_block_size, tp)
    name = f"table({table.path.resolve().name}, {table.metadata.device_name})"
    meta = table.metadata
    step_ms = meta.cpu_step_ms if cpu_step_ms is None else cpu_step_ms
    seq_ms = meta.cpu_seq_ms if cpu_seq_ms is None else cpu_seq_ms
    return TableLatency(table.fit, name, step_ms / 1e3, seq_ms / 1e3)
