"""Calibration tables on disk: a versioned directory the profiler writes and the simulator reads.

    metadata.json       what produced the numbers (device, versions, model spec, block size)
    measurements.csv    one row per measured step shape (see `Measurement`)
    fit.json            coefficients `calibrate fit` derived from the measurements

A table is only valid for the model shape and block size it was measured
with: stale profiles silently move predictions by large factors, so
`load_table` refuses any mismatch, naming the field and both values, and
refuses a fit.json fitted to other measurements than the ones beside it.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from sim.config.catalogue import model_from_fields
from sim.config.specs import ModelSpec
from sim.core.plan import StepShape
from sim.latency.table import TIMINGS, ErrorStats, TableFit, TableLatency

FORMAT_VERSION = 1
METADATA_FILE, MEASUREMENTS_FILE, FIT_FILE = "metadata.json", "measurements.csv", "fit.json"
KINDS = ("prefill", "decode", "mixed", "verify")
DEVICE_KINDS = ("cpu", "cuda")
_INT_COLUMNS = ("num_decodes", "decode_context_sum", "decode_context_max", "padded_batch",
                "decode_query_tokens", "repeats")
_MS_COLUMNS = ("device_ms_median", "device_ms_p10", "device_ms_p90",
               "wall_ms_median", "wall_ms_p10", "wall_ms_p90")
COLUMNS = ("kind", "prefill_chunk_tokens", "prefill_context_tokens", *_INT_COLUMNS, *_MS_COLUMNS)

# Upgrades of an older metadata.json, keyed by the version they upgrade from (v -> v + 1).
# None exist yet: version 1 is the first released format.
Migration = Callable[[dict[str, Any]], dict[str, Any]]
MIGRATIONS: Mapping[int, Migration] = MappingProxyType({})


def step_kind(shape: StepShape) -> str:
    """Which of KINDS a step is: prefill chunks with decodes are mixed, decodes verifying
    drafts are verify."""
    if shape.prefill_chunk_tokens:
        return "mixed" if shape.num_decodes else "prefill"
    return "verify" if shape.num_spec_tokens else "decode"


class TableError(ValueError):
    """A missing, malformed or mismatched calibration table: a user error, printed as is."""


@dataclass(frozen=True, slots=True)
class Measurement:
    """One measured step shape: its StepShape fields, repeats and time percentiles (ms).

    A device-time column the profiler cannot measure (CPU) is NaN.
    """

    kind: str
    prefill_chunk_tokens: tuple[int, ...] = ()
    prefill_context_tokens: tuple[int, ...] = ()
    num_decodes: int = 0
    decode_context_sum: int = 0
    decode_context_max: int = 0
    padded_batch: int = 0
    decode_query_tokens: int = 1  # k + 1 when verifying k speculative tokens
    repeats: int = 1
    device_ms_median: float = math.nan
    device_ms_p10: float = math.nan
    device_ms_p90: float = math.nan
    wall_ms_median: float = math.nan
    wall_ms_p10: float = math.nan
    wall_ms_p90: float = math.nan

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if len(self.prefill_chunk_tokens) != len(self.prefill_context_tokens):
            raise ValueError("prefill_chunk_tokens and prefill_context_tokens must have one "
                             f"entry per chunk, got {len(self.prefill_chunk_tokens)} and "
                             f"{len(self.prefill_context_tokens)}")
        if any(c < 1 for c in self.prefill_chunk_tokens) or any(
                c < 0 for c in self.prefill_context_tokens):
            raise ValueError("prefill chunks must be >= 1 token and contexts >= 0, got "
                             f"{self.prefill_chunk_tokens} / {self.prefill_context_tokens}")
        for name in _INT_COLUMNS:
            low = 1 if name in ("decode_query_tokens", "repeats") else 0
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)!r}")
        for name in _MS_COLUMNS:
            value = getattr(self, name)
            if not (math.isnan(value) or (math.isfinite(value) and value > 0)):
                raise ValueError(f"{name} must be a positive number of ms or empty, "
                                 f"got {value!r}")

    @property
    def shape(self) -> StepShape:
        """The StepShape measured; decode_query_tokens > 1 means every decode verified
        decode_query_tokens - 1 speculative tokens."""
        drafts = self.decode_query_tokens - 1
        spec = self.num_decodes if drafts else 0
        return StepShape(self.prefill_chunk_tokens, self.prefill_context_tokens,
                         self.num_decodes, self.decode_context_sum, self.decode_context_max,
                         self.padded_batch, num_spec_decodes=spec, num_spec_tokens=spec * drafts,
                         spec_depth=drafts if spec else 0,
                         spec_context_sum=self.decode_context_sum if spec else 0)

    def median_ms(self, timing: str) -> float:
        """The median the fit predicts: whole-step wall time or device (kernel) time."""
        return self.wall_ms_median if timing == "wall" else self.device_ms_median


@dataclass(frozen=True, slots=True)
class TableMetadata:
    """What produced a table; `timing` is the column `calibrate fit` predicts by default."""

    device_name: str
    device_kind: str
    torch_version: str
    cuda_version: str | None
    dtype: str
    model_spec: ModelSpec
    block_size: int
    max_num_batched_tokens: int
    max_num_seqs: int
    engine_commit: str | None = None
    timing: str = "wall"
    notes: str = ""
    created: str = dataclasses.field(
        default_factory=lambda: datetime.date.today().isoformat())
    tp: int = 1  # tensor-parallel GPUs the engine ran on
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.device_kind not in DEVICE_KINDS:
            raise ValueError(f"device_kind must be one of {', '.join(DEVICE_KINDS)}, "
                             f"got {self.device_kind!r}")
        if self.timing not in TIMINGS:
            raise ValueError(f"timing must be one of {', '.join(TIMINGS)}, got {self.timing!r}")
        for name in ("block_size", "max_num_batched_tokens", "max_num_seqs", "tp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        raw = dataclasses.asdict(self)
        return {"format_version": raw.pop("format_version"), **raw}


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
                             *(int(getattr(m, c)) for c in _INT_COLUMNS),
                             *(_format_ms(getattr(m, c)) for c in _MS_COLUMNS)])
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
        for column in _INT_COLUMNS:
            values[column] = int(row[column])
        for column in _MS_COLUMNS:
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


def upgrade_metadata(raw: dict[str, Any], source: str,
                     migrations: Mapping[int, Migration] | None = None) -> dict[str, Any]:
    """Bring an older metadata.json to FORMAT_VERSION (`migrations`, default MIGRATIONS),
    or refuse it; refuse a newer one."""
    migrations = MIGRATIONS if migrations is None else migrations
    if "format_version" not in raw:
        raise TableError(f"{source}: missing field format_version (the file set's version; "
                         f"this servesim reads {FORMAT_VERSION})")
    version = raw["format_version"]
    if isinstance(version, bool) or not isinstance(version, int):
        raise TableError(f"{source}: format_version must be an integer, got {version!r}")
    if version > FORMAT_VERSION:
        raise TableError(f"{source}: format_version {version} is newer than this servesim "
                         f"reads ({FORMAT_VERSION}); upgrade servesim")
    while version < FORMAT_VERSION:
        if version not in migrations:
            raise TableError(f"{source}: format_version {version} is older than "
                             f"{FORMAT_VERSION} and cannot be migrated; re-profile the engine")
        raw = migrations[version](dict(raw))
        version += 1
        raw["format_version"] = version
    return raw


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
        return TableMetadata(**{**raw, "model_spec": model_from_fields(spec)})
    except (TypeError, ValueError) as err:
        raise TableError(f"{path}: {err}") from None


def measurements_sha256(directory: str | Path) -> str:
    """Identifies the measurements a fit came from, so a re-profile invalidates the fit."""
    path = _require(Path(directory) / MEASUREMENTS_FILE, "the profiler writes it")
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_fit(directory: str | Path, fit: TableFit, features: Mapping[str, str]) -> Path:
    """Write fit.json: coefficients, knots, feature definitions and held-out error."""
    raw = dataclasses.asdict(fit)
    raw["held_out"] = [dataclasses.asdict(e) for e in fit.held_out]
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
                       swap_s_per_token: float = 0.0) -> TableLatency:
    """`load_table` as a LatencyModel named table(<directory name>, <device name>)."""
    table = load_table(directory, expected_spec, expected_block_size, tp)
    name = f"table({table.path.resolve().name}, {table.metadata.device_name})"
    return TableLatency(table.fit, name, swap_s_per_token)
