"""Readers for request traces: CSV (Azure LLM 2023, BurstGPT, Vidur, servesim's own, or any
CSV with a column mapping; see `csv_traces`), Mooncake JSONL and text JSONL (`text`).

Every reader returns a `Trace` whose row i is the file's data row i (so request i
replays row i), with arrivals relative to the first row (first arrival at 0) and
divided by `time_scale` (2.0 replays twice as fast). Arrivals that go back are an
error and a length of 0 is read as 1 with a warning (`trace_rows` says why). A
trace without arrival times (`arrivals_given` False) takes them from
`workload.arrivals`. Negative or non-integer lengths and unparsable rows raise
`TraceFormatError` naming the file, the line and what was expected.

Mooncake's `hash_ids` name consecutive 512-token pieces of the prompt, so a
row should carry ceil(input_length / 512) of them (every row of the shipped
conversation trace does). A row that disagrees is kept as given, never
padded or cut, and counted in `num_prefix_mismatched`: consumers pair id j
with tokens [512 j, 512 (j+1)), so a missing tail is content nothing else
names and surplus ids lie past the prompt.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sim.config.draws import TraceFormat
from sim.workload.csv_traces import (
    CSV_FORMATS,
    detect_csv_format,
    mapped_columns,
    read_csv_column,
    read_csv_rows,
    read_header,
)
from sim.workload.text import is_text_jsonl, read_text_trace
from sim.workload.trace import MOONCAKE_UNIT_TOKENS, Trace, rebased_s
from sim.workload.trace_rows import (
    TraceFormatError,
    at_least_one,
    check_arrivals,
    count,
    jsonl_records,
    row_error,
    seconds,
)

if TYPE_CHECKING:
    from sim.text import Tokenizer

_MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")

__all__ = ["TraceFormatError", "detect_format", "read_column", "read_trace"]


def _read_csv(path: Path, fmt: str, mapping: Mapping[str, str | None] | None,
              time_scale: float) -> Trace:
    rows = read_csv_rows(path, mapped_columns(fmt, mapping))
    if not rows.lines:
        raise TraceFormatError(f"{path}: the trace has no rows")
    columns = rows.columns
    arrival_column = columns.arrival_s or "arrival times (trace.columns.arrival_s is null)"
    if rows.arrival_s is not None:
        check_arrivals(rows.arrival_s, rows.lines, rows.arrival_cells, path, arrival_column,
                       time_scale)
    return Trace(
        source=str(path),
        arrival_s=(rebased_s(rows.arrival_s, time_scale) if rows.arrival_s is not None
                   else np.zeros(len(rows.lines))),
        prompt_tokens=at_least_one(rows.prompt_tokens, rows.lines, path, columns.prompt_tokens),
        output_tokens=at_least_one(rows.output_tokens, rows.lines, path, columns.output_tokens),
        arrivals_given=rows.arrival_s is not None,
        arrival_column=arrival_column,
    )


def _read_mooncake(path: Path, time_scale: float) -> Trace:
    lines: list[int] = []
    stamps: list[object] = []
    arrivals: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    hashes: list[tuple[int, ...]] = []
    expected = 'a JSON object with "timestamp" (ms), "input_length", "output_length"'
    for line, record in jsonl_records(path, expected, lambda r: set(_MOONCAKE_KEYS) <= r.keys()):
        lines.append(line)
        stamps.append(record["timestamp"])
        arrivals.append(seconds(record["timestamp"], path, line, "timestamp") / 1000.0)
        prompts.append(count(record["input_length"], path, line, "input_length"))
        outputs.append(count(record["output_length"], path, line, "output_length"))
        ids = record.get("hash_ids", [])
        if not isinstance(ids, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in ids
        ):
            raise row_error(path, line, "hash_ids as a list of integers", ids)
        hashes.append(tuple(ids))
    if not lines:
        raise TraceFormatError(f"{path}: the trace has no rows")
    arrival_s = np.asarray(arrivals, dtype=np.float64)
    check_arrivals(arrival_s, lines, stamps, path, "timestamp", time_scale)
    unit = MOONCAKE_UNIT_TOKENS
    return Trace(
        source=str(path),
        arrival_s=rebased_s(arrival_s, time_scale),
        prompt_tokens=at_least_one(np.asarray(prompts, dtype=np.int64), lines, path,
                                   "input_length"),
        output_tokens=at_least_one(np.asarray(outputs, dtype=np.int64), lines, path,
                                   "output_length"),
        prefix_block_ids=tuple(hashes),
        num_prefix_mismatched=sum(
            len(ids) != -(-tokens // unit) for ids, tokens in zip(hashes, prompts, strict=True)
        ),
        arrival_column="timestamp",
    )


def detect_format(path: Path) -> TraceFormat:
    """Guess the format from the extension and, for CSV, the header (`csv` if none fits)."""
    path = _checked(path)
    try:
        if path.suffix.lower() in (".jsonl", ".json"):
            return "text" if is_text_jsonl(path) else "mooncake"
        return detect_csv_format(read_header(path)) or "csv"  # type: ignore[return-value]
    except UnicodeDecodeError as err:
        raise _not_text(path, err) from None


# A trace of MAX_REQUESTS (10 million) rows is a few hundred MB; the reader holds every
# cell as a Python string, so a larger file is refused before it is read.
MAX_TRACE_BYTES = 2 * 2**30


def _checked(path: Path | str, time_scale: float = 1.0) -> Path:
    path = Path(path)
    if not (math.isfinite(time_scale) and time_scale > 0):
        raise ValueError(f"time_scale must be finite and > 0, got {time_scale}")
    if path.is_dir():
        raise TraceFormatError(f"{path}: is a directory, not a trace file")
    if path.exists() and not path.is_file():
        raise TraceFormatError(f"{path}: is not a regular file (a device or pipe); give a "
                               "trace file")
    if not path.is_file():
        raise FileNotFoundError(f"trace file not found: {path}")
    size = path.stat().st_size
    if size > MAX_TRACE_BYTES:
        raise TraceFormatError(f"{path}: {size:,} bytes is more than a trace may hold (at most "
                               f"{MAX_TRACE_BYTES:,}: 10 million requests are far smaller)")
    return path


def _not_text(path: Path, err: UnicodeDecodeError) -> TraceFormatError:
    return TraceFormatError(f"{path}: not a text file (a byte at offset {err.start} is not "
                            "UTF-8); give a CSV or JSONL trace")


def read_trace(path: Path | str, fmt: TraceFormat | None = None, time_scale: float = 1.0,
               tokenizer: Tokenizer | None = None,
               columns: Mapping[str, str | None] | None = None) -> Trace:
    """Load a whole trace in file order, first arrival at 0, sped up by `time_scale`.

    `columns` maps any of arrival_s / prompt_tokens / output_tokens to a CSV's own
    header names (over the format's). A text trace's prompts are tokenized with
    `tokenizer` (default: bytes).
    """
    path = _checked(path, time_scale)
    try:
        return _read_trace(path, fmt, time_scale, tokenizer, columns)
    except UnicodeDecodeError as err:
        raise _not_text(path, err) from None


def _read_trace(path: Path, fmt: TraceFormat | None, time_scale: float,
                tokenizer: Tokenizer | None, columns: Mapping[str, str | None] | None
                ) -> Trace:
    fmt = fmt or detect_format(path)
    if columns and fmt not in CSV_FORMATS:
        raise ValueError(f"trace.columns: maps the columns of a CSV trace; {path} is read as "
                         f"{fmt!r} (remove columns, or give a CSV)")
    if fmt == "text":
        return read_text_trace(path, tokenizer, time_scale)
    if fmt == "mooncake":
        return _read_mooncake(path, time_scale)
    if fmt not in CSV_FORMATS:
        known = sorted([*CSV_FORMATS, "mooncake", "text"])
        raise ValueError(f"unknown trace format {fmt!r}; expected one of {known}")
    return _read_csv(path, fmt, columns, time_scale)


def read_column(path: Path | str, fmt: TraceFormat | None, column: str) -> np.ndarray:
    """One named column (CSV) or key (JSONL) of token counts, zeros read as 1 with a warning:
    the values of an empirical length distribution's `column:`."""
    path = _checked(path)
    try:
        return _read_column(path, fmt, column)
    except UnicodeDecodeError as err:
        raise _not_text(path, err) from None


def _read_column(path: Path, fmt: TraceFormat | None, column: str) -> np.ndarray:
    fmt = fmt or detect_format(path)
    if fmt in CSV_FORMATS:
        lines, values = read_csv_column(path, column)
    else:
        expected = f'a JSON object with "{column}"'
        rows = list(jsonl_records(path, expected, lambda r: column in r))
        lines = [line for line, _ in rows]
        values = np.asarray([count(r[column], path, line, column) for line, r in rows],
                            dtype=np.int64)
    if not lines:
        raise TraceFormatError(f"{path}: the trace has no rows")
    return at_least_one(values, lines, path, column)
