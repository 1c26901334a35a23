"""Readers for request traces: Azure LLM 2023 CSV, Mooncake JSONL, plain CSV.

Every reader returns a `Trace` sorted by arrival (stable, so ties keep file
order) with arrivals relative to the earliest row (first arrival at 0) and
divided by `time_scale` (2.0 replays twice as fast). A trace may record a
length of 0 (e.g. a request that generated nothing); `Request` needs >= 1, so
such lengths are clamped to 1 and counted in `num_clamped`. Negative or
non-integer lengths and unparsable rows raise `TraceFormatError` naming the
file, the line and what was expected.

Mooncake's `hash_ids` name consecutive 512-token pieces of the prompt, so a
row should carry ceil(input_length / 512) of them (every row of the shipped
conversation trace does). A row that disagrees is kept as given, never
padded or cut, and counted in `num_prefix_mismatched`: consumers pair id j
with tokens [512 j, 512 (j+1)), so a missing tail is content nothing else
names and surplus ids lie past the prompt.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    from sim.text import Tokenizer

TraceFormat = Literal["azure", "mooncake", "csv", "text"]  # text: JSONL with a prompt

_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_UNIT_TOKENS = 512
_PLAIN_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
_TIMESTAMP = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?Z?")


class TraceFormatError(ValueError):
    """A trace row that cannot be read; the message says where and what was expected."""


@dataclass(frozen=True, slots=True, eq=False)
class Trace:
    """A whole trace as columns; `prefix_block_ids` only for traces that carry them."""

    source: str
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix_block_ids: tuple[tuple[int, ...], ...] | None = None
    num_clamped: int = 0
    num_prefix_mismatched: int = 0

    def __len__(self) -> int:
        return int(self.arrival_s.size)


def _fail(path: Path, line: int, expected: str, got: object) -> TraceFormatError:
    return TraceFormatError(f"{path}:{line}: expected {expected}, got {got!r}")


def _count(text: object, path: Path, line: int, column: str) -> int:
    """A non-negative integer token count; '12' and '12.0' both read as 12."""
    try:
        value = float(text) if isinstance(text, str) else text
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError
        if not math.isfinite(value) or value != int(value) or value < 0:
            raise ValueError
    except (TypeError, ValueError):
        raise _fail(path, line, f"{column} as a non-negative integer", text) from None
    return int(value)


def _seconds(text: object, path: Path, line: int, column: str) -> float:
    try:
        value = float(text) if isinstance(text, str) else text
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError
        if not math.isfinite(value):
            raise ValueError
    except (TypeError, ValueError):
        raise _fail(path, line, f"{column} as a finite number", text) from None
    return float(value)


def _azure_timestamp(text: str, path: Path, line: int) -> tuple[int, float]:
    """(whole seconds since year 1, fraction) so 7-digit fractions keep full precision."""
    match = _TIMESTAMP.fullmatch(text.strip())
    try:
        if match is None:
            raise ValueError
        year, month, day, hour, minute, second, frac = match.groups()
        days = date(int(year), int(month), int(day)).toordinal()
    except ValueError:
        raise _fail(path, line, "TIMESTAMP like 2023-11-16 18:17:03.9799600", text) from None
    whole_s = days * 86_400 + int(hour) * 3600 + int(minute) * 60 + int(second)
    return whole_s, (int(frac) / 10 ** len(frac)) if frac else 0.0


def _csv_columns(path: Path, columns: tuple[str, ...]) -> tuple[list[int], list[list[str]]]:
    """Line numbers of the non-blank data rows and the named columns, as strings."""
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = [name.strip() for name in next(reader, [])]
        missing = [name for name in columns if name not in header]
        if missing:
            raise _fail(path, 1, f"a header with columns {', '.join(columns)}", ",".join(header))
        index = [header.index(name) for name in columns]
        lines: list[int] = []
        cells: list[list[str]] = [[] for _ in columns]
        for row in reader:
            if len(row) < len(header):
                if not any(cell.strip() for cell in row):
                    continue
                raise _fail(path, reader.line_num, f"{len(header)} fields", ",".join(row))
            lines.append(reader.line_num)
            for column, i in zip(cells, index, strict=True):
                column.append(row[i])
    return lines, cells


def _counts(texts: list[str], lines: list[int], path: Path, column: str) -> np.ndarray:
    """Vectorised when every cell is a plain integer; row by row (to name the bad line) if not."""
    try:
        values = np.asarray(texts, dtype=np.str_).astype(np.int64)
        if values.size == 0 or values.min() >= 0:
            return values
    except ValueError:
        pass
    return np.asarray(
        [_count(text, path, line, column) for text, line in zip(texts, lines, strict=True)],
        dtype=np.int64,
    )


def _floats_s(texts: list[str], lines: list[int], path: Path, column: str) -> np.ndarray:
    try:
        values = np.asarray(texts, dtype=np.str_).astype(np.float64)
        if np.isfinite(values).all():
            return values
    except ValueError:
        pass
    return np.asarray(
        [_seconds(text, path, line, column) for text, line in zip(texts, lines, strict=True)],
        dtype=np.float64,
    )


def _azure_arrivals_s(stamps: list[str], lines: list[int], path: Path) -> np.ndarray:
    """Seconds since the earliest stamp, exact to the nanosecond for 7-digit fractions."""
    if all(_TIMESTAMP.fullmatch(text) for text in stamps):
        # numpy parses ISO stamps in C; the regex above guards against its leniency.
        try:
            parsed = np.asarray([text.rstrip("Z") for text in stamps]).astype("datetime64[ns]")
            return (parsed - parsed.min()).astype(np.int64) / 1e9
        except ValueError:
            pass  # e.g. month 13: the row-by-row path names the line
    pairs = [_azure_timestamp(t, path, line) for t, line in zip(stamps, lines, strict=True)]
    first_whole_s = min(whole for whole, _ in pairs)
    return np.asarray([float(whole - first_whole_s) + frac for whole, frac in pairs])


def _read_azure(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, None]:
    lines, (stamps, prompts, outputs) = _csv_columns(path, _AZURE_COLUMNS)
    if not lines:
        raise TraceFormatError(f"{path}: the trace has no rows")
    return (
        _azure_arrivals_s(stamps, lines, path),
        _counts(prompts, lines, path, "ContextTokens"),
        _counts(outputs, lines, path, "GeneratedTokens"),
        None,
    )


def _read_plain(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, None]:
    lines, (arrivals, prompts, outputs) = _csv_columns(path, _PLAIN_COLUMNS)
    return (
        _floats_s(arrivals, lines, path, "arrival_s"),
        _counts(prompts, lines, path, "prompt_tokens"),
        _counts(outputs, lines, path, "output_tokens"),
        None,
    )


def _read_mooncake(
    path: Path,
) -> tuple[list[float], list[int], list[int], list[tuple[int, ...]]]:
    arrivals: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    hashes: list[tuple[int, ...]] = []
    expected = 'a JSON object with "timestamp" (ms), "input_length", "output_length"'
    keys = {"timestamp", "input_length", "output_length"}
    for line, record in jsonl_records(path, expected, lambda r: keys <= r.keys()):
        arrivals.append(_seconds(record["timestamp"], path, line, "timestamp") / 1000.0)
        prompts.append(_count(record["input_length"], path, line, "input_length"))
        outputs.append(_count(record["output_length"], path, line, "output_length"))
        ids = record.get("hash_ids", [])
        if not isinstance(ids, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in ids
        ):
            raise _fail(path, line, "hash_ids as a list of integers", ids)
        hashes.append(tuple(ids))
    return arrivals, prompts, outputs, hashes


def jsonl_records(path: Path, expected: str, valid: Callable[[dict], bool]
                  ) -> Iterator[tuple[int, dict]]:
    """(line number, record) of each non-blank row; a row that is not a JSON object passing
    `valid` stops the read, naming the file, the line, `expected` and what was there."""
    with path.open(encoding="utf-8") as handle:
        for line, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError:
                raise _fail(path, line, expected, text.strip()[:80]) from None
            if not isinstance(record, dict) or not valid(record):
                raise _fail(path, line, expected, text.strip()[:80])
            yield line, record


def detect_format(path: Path) -> TraceFormat:
    """Guess the format from the extension and, for CSV, the header."""
    if path.suffix.lower() in (".jsonl", ".json"):
        from sim.workload.text import is_text_jsonl

        return "text" if is_text_jsonl(path) else "mooncake"
    with path.open(encoding="utf-8") as handle:
        header = handle.readline()
    return "azure" if "TIMESTAMP" in header else "csv"


def read_trace(path: Path | str, fmt: TraceFormat | None = None, time_scale: float = 1.0,
               tokenizer: Tokenizer | None = None) -> Trace:
    """Load a whole trace, sorted by arrival, first arrival at 0, sped up by `time_scale`.

    A text trace's prompts are tokenized with `tokenizer` (default: bytes).
    """
    path = Path(path)
    if not (math.isfinite(time_scale) and time_scale > 0):
        raise ValueError(f"time_scale must be finite and > 0, got {time_scale}")
    if not path.is_file():
        raise FileNotFoundError(f"trace file not found: {path}")
    fmt = fmt or detect_format(path)
    if fmt == "text":
        from sim.workload.text import read_text_trace

        return read_text_trace(path, tokenizer, time_scale)
    readers = {"azure": _read_azure, "mooncake": _read_mooncake, "csv": _read_plain}
    if fmt not in readers:
        raise ValueError(f"unknown trace format {fmt!r}; expected one of {sorted(readers)}")
    arrivals, prompts, outputs, hashes = readers[fmt](path)
    if len(arrivals) == 0:
        raise TraceFormatError(f"{path}: the trace has no rows")
    arrival_s = np.asarray(arrivals, dtype=np.float64)
    order = np.argsort(arrival_s, kind="stable")
    arrival_s = (arrival_s[order] - arrival_s[order[0]]) / time_scale
    prompt = np.asarray(prompts, dtype=np.int64)[order]
    output = np.asarray(outputs, dtype=np.int64)[order]
    num_clamped = int(np.count_nonzero(prompt == 0) + np.count_nonzero(output == 0))
    unit = MOONCAKE_UNIT_TOKENS
    mismatched = (
        0
        if hashes is None
        else sum(
            len(ids) != -(-tokens // unit) for ids, tokens in zip(hashes, prompts, strict=True)
        )
    )
    return Trace(
        source=str(path),
        arrival_s=arrival_s,
        prompt_tokens=np.maximum(prompt, 1),
        output_tokens=np.maximum(output, 1),
        prefix_block_ids=None if hashes is None else tuple(hashes[i] for i in order.tolist()),
        num_clamped=num_clamped,
        num_prefix_mismatched=mismatched,
    )
