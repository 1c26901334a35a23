"""CSV traces: the named formats are column names, and any CSV works with a column mapping.

| format | arrival column | prompt column | output column |
| --- | --- | --- | --- |
| `azure` (Azure LLM 2023) | `TIMESTAMP` (date-times) | `ContextTokens` | `GeneratedTokens` |
| `burstgpt` (BurstGPT) | `Timestamp` (s) | `Request tokens` | `Response tokens` |
| `vidur` (Vidur's processed) | `arrived_at` (s) | `num_prefill_tokens` | `num_decode_tokens` |
| `csv` (servesim's own) | `arrival_s` (s) | `prompt_tokens` | `output_tokens` |

An arrival column holds seconds (any origin) or date-times like
`2023-11-16 18:17:03.9799600`. It is optional: a file without the format's
arrival column (Vidur's length-only traces, say) takes its arrivals from
`workload.arrivals`. A mapping (`trace.columns`) renames any of the three
columns; an arrival column it names must exist, and `arrival_s: null` ignores
the file's arrivals. Other columns (BurstGPT's `Model`, `Log Type`) are ignored.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import date
from operator import itemgetter
from pathlib import Path

import numpy as np

from sim.config.checks import shown
from sim.workload.trace_rows import TraceFormatError, counts, row_error, seconds


@dataclass(frozen=True, slots=True)
class CsvColumns:
    """Which header names hold a trace's arrival, prompt and output; `arrival_s` None = none."""

    arrival_s: str | None
    prompt_tokens: str
    output_tokens: str
    arrival_required: bool = False  # True when a mapping named it


CSV_FORMATS = {
    "azure": CsvColumns("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "burstgpt": CsvColumns("Timestamp", "Request tokens", "Response tokens"),
    "vidur": CsvColumns("arrived_at", "num_prefill_tokens", "num_decode_tokens"),
    "csv": CsvColumns("arrival_s", "prompt_tokens", "output_tokens"),
}
_TIMESTAMP = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?Z?")
_DATE_TIME = "a date-time like 2023-11-16 18:17:03.9799600"


@dataclass(frozen=True, slots=True, eq=False)
class CsvRows:
    """The named columns of a CSV's data rows; `lines` are their line numbers in the file.

    `arrival_s` is None when the file has no arrival column (or the mapping ignores it).
    """

    lines: list[int]
    arrival_s: np.ndarray | None  # seconds on the file's own origin
    arrival_cells: list[str]
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    columns: CsvColumns


def mapped_columns(fmt: str, mapping: Mapping[str, str | None] | None) -> CsvColumns:
    """The format's columns with a user's mapping on top (only the keys the user set)."""
    base = CSV_FORMATS[fmt]
    if not mapping:
        return base
    columns = replace(base, **mapping)
    if "arrival_s" in mapping and mapping["arrival_s"] is not None:
        columns = replace(columns, arrival_required=True)
    return columns


def read_header(path: Path) -> list[str]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [name.strip() for name in next(csv.reader(handle), [])]


def detect_csv_format(header: list[str]) -> str | None:
    """The first named format whose prompt and output columns are both in the header."""
    for name, columns in CSV_FORMATS.items():
        if columns.prompt_tokens in header and columns.output_tokens in header:
            return name
    return None


def header_problem(path: Path, header: list[str], needed: list[str]) -> TraceFormatError:
    known = "; ".join(f"{name}: {c.prompt_tokens}, {c.output_tokens}"
                      for name, c in CSV_FORMATS.items())
    return TraceFormatError(
        f"{path}:1: expected a header with {', '.join(needed)}, got {shown(','.join(header))}. "
        f"Known formats (prompt, output columns): {known}; or name yours with "
        "trace: {path: FILE, columns: {prompt_tokens: COL, output_tokens: COL, arrival_s: COL}} "
        "(arrival_s optional), or for an empirical length, column: COL")


def read_cells(path: Path, names: list[str]) -> tuple[list[int], list[list[str]]]:
    """Line numbers of the non-blank data rows and the named columns, as strings.

    Usually every row is one line with every field (the shipped traces): then row j is
    on line j + 2 and the columns are sliced out whole, with no Python step per row (a
    third of the time); the row-by-row read handles the rest (blank or short rows,
    quoted newlines).
    """
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = [name.strip() for name in next(reader, [])]
        missing = [name for name in names if name not in header]
        if missing:
            raise header_problem(path, header, names)
        twice = [name for name in names if header.count(name) > 1]
        if twice:
            at = [i + 1 for i, name in enumerate(header) if name == twice[0]]
            raise TraceFormatError(f"{path}:1: column {shown(twice[0], 40)} appears "
                                   f"{len(at)} times (fields {', '.join(map(str, at))}); a "
                                   "column servesim reads must appear once")
        index = [header.index(name) for name in names]
        rows = list(reader)
    # one line a row (a header or row over several lines would take more) and none short
    if reader.line_num == len(rows) + 1 and min(map(len, rows), default=len(header)) >= len(
            header):
        return list(range(2, len(rows) + 2)), [list(map(itemgetter(i), rows)) for i in index]
    return _read_cells_by_row(path, len(header), index)


def _read_cells_by_row(path: Path, width: int, index: list[int]
                       ) -> tuple[list[int], list[list[str]]]:
    """`read_cells` row by row, each with its line number: blank rows skipped, short ones
    an error naming the line."""
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        next(reader, None)  # the header, checked by read_cells
        lines: list[int] = []
        cells: list[list[str]] = [[] for _ in index]
        for row in reader:
            if len(row) < width:
                if not any(cell.strip() for cell in row):
                    continue
                raise row_error(path, reader.line_num, f"{width} fields", ",".join(row))
            lines.append(reader.line_num)
            for column, i in zip(cells, index, strict=True):
                column.append(row[i])
    return lines, cells


def read_csv_rows(path: Path, columns: CsvColumns) -> CsvRows:
    """The mapped columns of every data row, in file order."""
    arrival = columns.arrival_s
    if arrival is not None and not columns.arrival_required and arrival not in read_header(path):
        arrival = None  # the format's arrival column is optional
    names = [columns.prompt_tokens, columns.output_tokens] + ([arrival] if arrival else [])
    lines, cells = read_cells(path, names)
    stamps = cells[2] if arrival else []
    return CsvRows(
        lines=lines,
        arrival_s=arrival_seconds(stamps, lines, path, arrival) if arrival else None,
        arrival_cells=stamps,
        prompt_tokens=counts(cells[0], lines, path, columns.prompt_tokens),
        output_tokens=counts(cells[1], lines, path, columns.output_tokens),
        columns=columns,
    )


def read_csv_column(path: Path, column: str) -> tuple[list[int], np.ndarray]:
    """One column of token counts (an empirical length's `column:`), with its line numbers."""
    lines, (cells,) = read_cells(path, [column])
    return lines, counts(cells, lines, path, column)


def arrival_seconds(texts: list[str], lines: list[int], path: Path, column: str) -> np.ndarray:
    """Seconds as written, or, when the first cell is a date-time, seconds since the earliest."""
    if texts and _TIMESTAMP.fullmatch(texts[0].strip()):
        return _date_times_s(texts, lines, path, column)
    try:
        values = np.asarray(texts, dtype=np.str_).astype(np.float64)
        if np.isfinite(values).all():
            return values
    except ValueError:
        pass
    return np.asarray(
        [seconds(text, path, line, f"{column} in seconds (or {_DATE_TIME})")
         for text, line in zip(texts, lines, strict=True)],
        dtype=np.float64,
    )


def _date_time(text: str, path: Path, line: int, column: str) -> tuple[int, float]:
    """(whole seconds since year 1, fraction) so 7-digit fractions keep full precision."""
    match = _TIMESTAMP.fullmatch(text.strip())
    try:
        if match is None:
            raise ValueError
        year, month, day, hour, minute, second, frac = match.groups()
        days = date(int(year), int(month), int(day)).toordinal()
    except ValueError:
        raise row_error(path, line, f"{column} as {_DATE_TIME}", text) from None
    whole_s = days * 86_400 + int(hour) * 3600 + int(minute) * 60 + int(second)
    return whole_s, (int(frac) / 10 ** len(frac)) if frac else 0.0


def _date_times_s(stamps: list[str], lines: list[int], path: Path, column: str) -> np.ndarray:
    """Seconds since the earliest stamp, exact to the nanosecond for 7-digit fractions."""
    if all(_TIMESTAMP.fullmatch(text) for text in stamps):
        # numpy parses ISO stamps in C; the regex above guards against its leniency.
        try:
            parsed = np.asarray([text.rstrip("Z") for text in stamps]).astype("datetime64[ns]")
            return (parsed - parsed.min()).astype(np.int64) / 1e9
        except ValueError:
            pass  # e.g. month 13: the row-by-row path names the line
    pairs = [_date_time(t, path, line, column) for t, line in zip(stamps, lines, strict=True)]
    first_whole_s = min(whole for whole, _ in pairs)
    return np.asarray([float(whole - first_whole_s) + frac for whole, frac in pairs])
