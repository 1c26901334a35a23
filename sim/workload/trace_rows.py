"""Cells and rows of trace files: parsing, the two content rules, and the error every reader raises.

Every message names the file and line (`path:line`), the column, what was
found and what is allowed, so a user can fix the file without reading code.

Two rules hold for every format, because a request id is its data row's index
(row 0 is the first row after any header) and a request needs at least one
prompt and one output token:
- arrivals must not go back: a row earlier than the one before it is an error
  (ties are fine); re-sorting would part request ids from trace rows; arrival seconds
  are >= 0 (date-times are read relative to the earliest), and a trace spans at most
  MAX_SPAN_S of simulated time;
- a token count is an integer 0..MAX_TRACE_TOKENS (10**30 only overflowed later);
- a length of 0 (e.g. a request that failed or generated nothing) is read as 1,
  with one warning per column that counts the rows and names the first.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from sim.config.checks import MAX_SPAN_S, MAX_TRACE_TOKENS, shown


class TraceFormatError(ValueError):
    """A trace row that cannot be read; the message says where and what was expected."""


def row_error(path: Path, line: int, expected: str, got: object) -> TraceFormatError:
    """The cell is echoed to at most 60 characters: a 5,000-digit number is no 5 KB line."""
    return TraceFormatError(f"{path}:{line}: expected {expected}, got {shown(got)}")


def count(text: object, path: Path, line: int, column: str) -> int:
    """A non-negative integer token count, at most MAX_TRACE_TOKENS; '12' and '12.0' both
    read as 12."""
    expected = f"{column} as a non-negative integer"
    try:
        value = float(text) if isinstance(text, str) else text
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError
        if not -1 < value < math.inf or value != int(value):  # also NaN
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise row_error(path, line, expected, text) from None
    if value > MAX_TRACE_TOKENS:
        raise row_error(path, line, f"{expected} of at most {MAX_TRACE_TOKENS:,} tokens", text)
    return int(value)


def seconds(text: object, path: Path, line: int, column: str) -> float:
    try:
        value = float(text) if isinstance(text, str) else text
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError
        if not math.isfinite(value):
            raise ValueError
    except (TypeError, ValueError):
        raise row_error(path, line, f"{column} as a finite number", text) from None
    return float(value)


def counts(texts: Sequence[str], lines: Sequence[int], path: Path, column: str) -> np.ndarray:
    """Vectorised when every cell is a plain integer; row by row (to name the bad line) if not."""
    if texts and all(texts) and max(map(len, texts)) <= 8:  # below 10**8: always in range
        digits = "".join(texts)
        if digits.isascii() and digits.isdigit():  # each cell 0-9s: int() reads it as numpy does
            return np.fromiter(map(int, texts), dtype=np.int64, count=len(texts))
    try:
        values = np.asarray(texts, dtype=np.str_).astype(np.int64)
        if values.size == 0 or (values.min() >= 0 and values.max() <= MAX_TRACE_TOKENS):
            return values
    except (ValueError, OverflowError):
        pass
    return np.asarray(
        [count(text, path, line, column) for text, line in zip(texts, lines, strict=True)],
        dtype=np.int64,
    )


def at_least_one(values: np.ndarray, lines: Sequence[int], path: Path, column: str
                 ) -> np.ndarray:
    """Lengths with each 0 read as 1, and one warning saying how many and where the first is."""
    zeros = np.flatnonzero(values == 0)
    if zeros.size == 0:
        return values
    warnings.warn(f"{path}: {zeros.size} rows have {column} 0 (first at line "
                  f"{lines[int(zeros[0])]}); each is read as 1 token, the least a request has",
                  stacklevel=2)
    return np.maximum(values, 1)


def check_arrivals(arrival_s: np.ndarray, lines: Sequence[int], cells: Sequence[object],
                   path: Path, column: str, time_scale: float = 1.0) -> None:
    """Raise at the first row whose arrival is below 0 or earlier than the row before it,
    and when the trace spans more simulated time than servesim runs (MAX_SPAN_S, after
    `time_scale`). Date-times arrive here as seconds since the earliest, never below 0."""
    if arrival_s.size and arrival_s.min() < 0:
        i = int(np.flatnonzero(arrival_s < 0)[0])
        raise TraceFormatError(
            f"{path}:{lines[i]}: {column} {shown(cells[i], 30)} is negative; arrivals are "
            "seconds since the trace's start, >= 0 (servesim replays them relative to the "
            "first row)")
    back = np.flatnonzero(np.diff(arrival_s) < 0)
    if back.size:
        i = int(back[0]) + 1
        raise TraceFormatError(
            f"{path}:{lines[i]}: {column} {shown(cells[i], 30)} is earlier than line "
            f"{lines[i - 1]}'s {shown(cells[i - 1], 30)}; arrivals must not go back (ties are "
            f"fine), since request i replays data row i: sort the rows by {column}")
    span_s = float(arrival_s[-1] - arrival_s[0]) / time_scale if arrival_s.size else 0.0
    if not span_s <= MAX_SPAN_S:
        raise TraceFormatError(
            f"{path}:{lines[-1]}: {column} {shown(cells[-1], 30)} puts the trace's span at "
            f"{span_s:.3g} s (after time_scale {time_scale:g}), longer than servesim "
            f"simulates (at most {MAX_SPAN_S:.0e} s, about 3 years)")


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
            except (ValueError, RecursionError):  # also a 5,000-digit number
                raise row_error(path, line, expected, text.strip()) from None
            if not isinstance(record, dict) or not valid(record):
                raise row_error(path, line, expected, text.strip())
            yield line, record
