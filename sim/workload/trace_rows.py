"""Cells and rows of trace files: parsing, the two content rules, and the error every reader raises.

Every message names the file and line (`path:line`), the column, what was
found and what is allowed, so a user can fix the file without reading code.

Two rules hold for every format, because a request id is its data row's index
(row 0 is the first row after any header) and a request needs at least one
prompt and one output token:
- arrivals must not go back: a row earlier than the one before it is an error
  (ties are fine); re-sorting would part request ids from trace rows;
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


class TraceFormatError(ValueError):
    """A trace row that cannot be read; the message says where and what was expected."""


def row_error(path: Path, line: int, expected: str, got: object) -> TraceFormatError:
    return TraceFormatError(f"{path}:{line}: expected {expected}, got {got!r}")


def count(text: object, path: Path, line: int, column: str) -> int:
    """A non-negative integer token count; '12' and '12.0' both read as 12."""
    try:
        value = float(text) if isinstance(text, str) else text
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError
        if not math.isfinite(value) or value != int(value) or value < 0:
            raise ValueError
    except (TypeError, ValueError):
        raise row_error(path, line, f"{column} as a non-negative integer", text) from None
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
    if texts and all(texts) and max(map(len, texts)) <= 18:
        digits = "".join(texts)
        if digits.isascii() and digits.isdigit():  # each cell 0-9s: int() reads it as numpy does
            return np.fromiter(map(int, texts), dtype=np.int64, count=len(texts))
    try:
        values = np.asarray(texts, dtype=np.str_).astype(np.int64)
        if values.size == 0 or values.min() >= 0:
            return values
    except ValueError:
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
                   path: Path, column: str) -> None:
    """Raise at the first row whose arrival is earlier than the row before it."""
    back = np.flatnonzero(np.diff(arrival_s) < 0)
    if back.size:
        i = int(back[0]) + 1
        raise TraceFormatError(
            f"{path}:{lines[i]}: {column} {cells[i]!r} is earlier than line {lines[i - 1]}'s "
            f"{cells[i - 1]!r}; arrivals must not go back (ties are fine), since request i "
            f"replays data row i: sort the rows by {column}")


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
                raise row_error(path, line, expected, text.strip()[:80]) from None
            if not isinstance(record, dict) or not valid(record):
                raise row_error(path, line, expected, text.strip()[:80])
            yield line, record
