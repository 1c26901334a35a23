"""Calibration tables' format: the versioned file set, its rows and metadata, and upgrades.

    metadata.json       what produced the numbers (device, versions, model spec, block size)
    measurements.csv    one row per measured step shape (see `Measurement`)
    fit.json            coefficients `calibrate fit` derived from the measurements

A table is only valid for the model shape and block size it was measured
with: stale profiles silently move predictions by large factors, so
`load_table` refuses any mismatch, naming the field and both values, and
refuses a fit.json fitted to other measurements than the ones beside it.
Reading and writing the files is sim.latency.table_files.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from sim.config.specs import ModelSpec
from sim.core.plan import StepShape
from sim.latency.table import TIMINGS

FORMAT_VERSION = 1
METADATA_FILE, MEASUREMENTS_FILE, FIT_FILE = "metadata.json", "measurements.csv", "fit.json"
KINDS = ("prefill", "decode", "mixed", "verify")
DEVICE_KINDS = ("cpu", "cuda")
INT_COLUMNS = ("num_decodes", "decode_context_sum", "decode_context_max", "padded_batch",
                "decode_query_tokens", "repeats")
MS_COLUMNS = ("device_ms_median", "device_ms_p10", "device_ms_p90",
               "wall_ms_median", "wall_ms_p10", "wall_ms_p90")
COLUMNS = ("kind", "prefill_chunk_tokens", "prefill_context_tokens", *INT_COLUMNS, *MS_COLUMNS)

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
        for name in INT_COLUMNS:
            low = 1 if name in ("decode_query_tokens", "repeats") else 0
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)!r}")
        for name in MS_COLUMNS:
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
    # Host time a device-time table leaves out, added to every step it prices (an imported
    # profile carries them; a wall-time table has them inside its fit: 0)
    cpu_step_ms: float = 0.0
    cpu_seq_ms: float = 0.0
    # where the numbers come from, field by field (an imported profile: repository, commit,
    # files; which parts the roofline supplied)
    provenance: tuple[tuple[str, str], ...] = ()
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
        for name in ("cpu_step_ms", "cpu_seq_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not (
                    0 <= value < math.inf):
                raise ValueError(f"{name} must be a finite number of ms >= 0, got {value!r}")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.provenance):
            raise ValueError(f"provenance must map names to text, got {self.provenance!r}")

    def to_dict(self) -> dict[str, Any]:
        raw = dataclasses.asdict(self)
        raw["provenance"] = dict(self.provenance)
        return {"format_version": raw.pop("format_version"), **raw}


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
