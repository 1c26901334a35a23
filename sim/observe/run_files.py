"""A finished run's requests.csv read back for `servesim explain`, checked row by row.

Why checked: requests.csv is a file a user may have edited, renamed a column of,
cut short or overwritten, and pandas reads all of those without a word (a short
last row becomes NaNs, an empty file an exception). Every problem here is one
DiagnosisError naming the file and, where there is one, the line.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import TYPE_CHECKING

from sim.observe.diagnose import TTFT_PARTS

if TYPE_CHECKING:
    import pandas as pd

# The columns explain reads; the rest of requests.csv is ignored.
NEEDED = ("request_id", "status", "ttft_ms", "prompt_tokens", "output_tokens",
          "prefix_hit_tokens", "preemptions", "rejection_reason", "prefix_saved_ms",
          "mean_others_in_prefill", "queue_ahead", "running_at_arrival", "prefill_steps",
          *TTFT_PARTS)
STATUSES = ("finished", "rejected")
_TEXT = ("status", "rejection_reason")


class DiagnosisError(ValueError):
    """A user mistake (no such run, request or column): printed as one line."""


def _cell(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit - 3] + "...")


def read_requests(path: Path, expected_rows: int | None = None) -> pd.DataFrame:
    """requests.csv as a frame of NEEDED columns; a missing column, a short or malformed row,
    an unknown status or fewer rows than the run's summary counts is an error naming the line.
    """
    import pandas as pd

    try:
        with path.open(newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle))
    except UnicodeDecodeError as err:
        raise DiagnosisError(f"{path}: not a text file (byte at offset {err.start} is not "
                             "UTF-8); it is not a requests.csv servesim wrote") from None
    except (OSError, csv.Error) as err:
        raise DiagnosisError(f"{path}: cannot read: {getattr(err, 'strerror', None) or err}"
                             ) from None
    if not rows:
        raise DiagnosisError(f"{path}: the file is empty; re-run the scenario to write it")
    header = [name.strip() for name in rows[0]]
    missing = [name for name in NEEDED if name not in header]
    if missing:
        raise DiagnosisError(f"{path}:1: the header lacks {', '.join(missing[:4])}"
                             f"{' and more' if len(missing) > 4 else ''}; explain reads "
                             "requests.csv as `servesim run` writes it (re-run the scenario)")
    index = {name: header.index(name) for name in NEEDED}
    for line, row in enumerate(rows[1:], start=2):
        _check_row(path, line, row, len(header), index)
    count = len(rows) - 1
    if expected_rows is not None and count != expected_rows:
        raise DiagnosisError(f"{path}: {count} request rows, but the run's summary.json counts "
                             f"{expected_rows} (completed + rejected): the file is truncated "
                             "or from another run; re-run the scenario")
    del rows  # checked: pandas reads the columns again, in C
    return pd.read_csv(path, usecols=list(NEEDED), dtype={name: str for name in _TEXT})


def _check_row(path: Path, line: int, row: list[str], width: int, index: dict[str, int]
               ) -> None:
    if len(row) != width:
        raise DiagnosisError(f"{path}:{line}: {len(row)} fields where the header has {width}: "
                             "the row is cut short or malformed (re-run the scenario)")
    status = row[index["status"]]
    if status not in STATUSES:
        raise DiagnosisError(f"{path}:{line}: status {_cell(status)} is not one of "
                             f"{', '.join(STATUSES)}")
    numbers = ("request_id", "prompt_tokens", "output_tokens") if status != "finished" else \
        [n for n in NEEDED if n not in _TEXT]
    for name in numbers:
        text = row[index[name]]
        try:
            ok = math.isfinite(float(text))
        except ValueError:
            ok = False
        if not ok:
            raise DiagnosisError(f"{path}:{line}: {name} {_cell(text)} is not a finite number "
                                 f"(a {status} request has one)")
