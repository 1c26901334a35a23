"""Finished and rejected requests: the rows of requests.csv, kept in memory or streamed.

Two homes for the rows. `RequestLog` keeps them as `array.array` columns (96
bytes a request) for callers that read them back as a frame (the engine, the
server, tests). `RequestCSV` writes the rows to requests.csv as the recorder
folds each block of recorded requests (`RequestBlock`) and keeps nothing, so a
run's memory follows the requests in flight, not those done; its bytes are
what `RequestLog.frame().to_csv(index=False)` writes (floats as repr, NaN and
None empty), except that integer columns joined from elsewhere (the TTFT
diagnosis) stay integers where pandas would print them as floats once a row
lacks them. Either way the caller may drop each Request
once recorded. TTFT, TPOT, E2EL and queue time use vLLM's formulas: TTFT =
first token - arrival, TPOT = (E2EL - TTFT) / (output - 1) over requests with
more than one output token, E2EL = finish - arrival.
"""

from __future__ import annotations

import csv
import math
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sim.core.request import Request

if TYPE_CHECKING:
    import pandas as pd

_REQ_FLOAT = ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s")
_REQ_INT = ("request_id", "prompt_tokens", "output_tokens", "prefix_hit_tokens",
            "preemptions", "reason_code", "spec_drafted", "spec_accepted")
_FINISHED_CODE = -1
# what a recorded request leaves: its fields, read in C by one attrgetter call (the Request
# attribute names; "preemptions" is num_preemptions)
_FIELDS = ("request_id", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s",
           "prompt_tokens", "output_tokens", "prefix_hit_tokens", "num_preemptions")
_SPEC_FIELDS = ("spec_drafted", "spec_accepted")
BLOCK_REQUESTS = 1024  # requests a RequestBlock holds before the recorder folds them


@dataclass(frozen=True, slots=True, eq=False)
class RequestRows:
    """Recorded requests' fields as columns, in the order they were recorded (times in s,
    NaN = never); `reasons`: row -> rejection reason (the other rows finished);
    `spec_drafted` / `spec_accepted` are None where they were not read."""

    request_id: np.ndarray
    arrival_s: np.ndarray
    first_scheduled_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix_hit_tokens: np.ndarray
    preemptions: np.ndarray
    spec_drafted: np.ndarray | None
    spec_accepted: np.ndarray | None
    reasons: dict[int, str]

    def __len__(self) -> int:
        return len(self.request_id)

    @property
    def finished(self) -> np.ndarray:
        done = np.ones(len(self.request_id), dtype=bool)
        done[list(self.reasons)] = False
        return done


class RequestBlock:
    """Requests recorded but not yet folded into the recorder's batches, totals and rows.

    Why: folding one request costs several microseconds of Python (four sketch adds,
    Welford updates, a csv row); numpy over a block costs a fraction. Each request leaves
    one tuple of its fields here (an attrgetter call, in C: no reference to the Request
    is kept), at most `capacity` of them; `take` hands them over as `RequestRows`.
    `speculation`: read the draft counters too (two properties a request).
    """

    __slots__ = ("capacity", "_rows", "_reasons", "_get", "_width")

    def __init__(self, speculation: bool, capacity: int = BLOCK_REQUESTS) -> None:
        self.capacity = capacity
        self._rows: list[tuple] = []
        self._reasons: dict[int, str] = {}
        fields = (*_FIELDS, *(_SPEC_FIELDS if speculation else ()))
        self._get = attrgetter(*fields)
        self._width = len(fields)

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def full(self) -> bool:
        return len(self._rows) >= self.capacity

    def append(self, req: Request, reason: str | None = None) -> None:
        """One recorded request: `reason` None if it finished, else why it was rejected."""
        if reason is not None:
            self._reasons[len(self._rows)] = reason
        self._rows.append(self._get(req))

    def take(self) -> RequestRows:
        """The recorded requests as columns, and empty the block."""
        rows, reasons = self._rows, self._reasons
        self._rows, self._reasons = [], {}
        cols = list(zip(*rows, strict=True)) if rows else [()] * self._width
        # None (a time never reached) becomes NaN in a float array
        f = [np.array(c, dtype=np.float64) for c in cols[1:5]]
        n = [np.array(c, dtype=np.int64) for c in (cols[0], *cols[5:])]
        spec = n[5:] if len(n) > 5 else (None, None)
        return RequestRows(n[0], *f, *n[1:5], *spec, reasons)


class RequestLog:
    """Typed columns of finished/rejected requests; rejection reasons as small codes."""

    __slots__ = ("_columns", "_reason_codes")

    def __init__(self) -> None:
        self._columns: dict[str, array] = {k: array("d") for k in _REQ_FLOAT}
        self._columns.update({k: array("q") for k in _REQ_INT})
        self._reason_codes: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._columns["request_id"])

    @property
    def reasons(self) -> list[str]:
        """Rejection reasons in the order their codes were given."""
        return list(self._reason_codes)

    def extend(self, rows: RequestRows) -> None:
        """Append recorded requests (a rejected one's reason gets the next free code)."""
        codes = np.full(len(rows), _FINISHED_CODE, dtype=np.int64)
        for at, reason in rows.reasons.items():
            codes[at] = self._reason_codes.setdefault(reason, len(self._reason_codes))
        zeros = np.zeros(len(rows), dtype=np.int64)
        c = self._columns
        for name, col in (("request_id", rows.request_id), ("arrival_s", rows.arrival_s),
                          ("first_scheduled_s", rows.first_scheduled_s),
                          ("first_token_s", rows.first_token_s), ("finish_s", rows.finish_s),
                          ("prompt_tokens", rows.prompt_tokens),
                          ("output_tokens", rows.output_tokens),
                          ("prefix_hit_tokens", rows.prefix_hit_tokens),
                          ("preemptions", rows.preemptions), ("reason_code", codes),
                          ("spec_drafted", zeros if rows.spec_drafted is None
                           else rows.spec_drafted),
                          ("spec_accepted", zeros if rows.spec_accepted is None
                           else rows.spec_accepted)):
            c[name].frombytes(col.tobytes())

    def arrays(self) -> dict[str, np.ndarray]:
        """Every column as a numpy array, plus `finished` and the derived latencies (s)."""
        # np.array copies: a live buffer view would make later appends raise BufferError.
        r = {k: np.array(col, dtype=np.float64 if col.typecode == "d" else np.int64)
             for k, col in self._columns.items()}
        done = r["reason_code"] == _FINISHED_CODE
        r["finished"] = done
        r["ttft_s"] = np.where(done, r["first_token_s"] - r["arrival_s"], math.nan)
        r["e2el_s"] = np.where(done, r["finish_s"] - r["arrival_s"], math.nan)
        r["queue_s"] = np.where(done, r["first_scheduled_s"] - r["arrival_s"], math.nan)
        multi = done & (r["output_tokens"] > 1)
        denom = np.maximum(r["output_tokens"] - 1, 1)
        r["tpot_s"] = np.where(multi, (r["e2el_s"] - r["ttft_s"]) / denom, math.nan)
        return r

    def frame(self, speculation: bool, extra: pd.DataFrame | None = None) -> pd.DataFrame:
        """One row per request, latencies in ms; `extra` columns joined on request_id."""
        import pandas as pd  # only a caller that wants a frame pays for pandas

        r = self.arrays()
        names = self.reasons
        reasons = [None if c == _FINISHED_CODE else names[c] for c in r["reason_code"].tolist()]
        frame = pd.DataFrame({k: r[k] for k in ("request_id", *_REQ_FLOAT, "prompt_tokens",
                                                 "output_tokens", "prefix_hit_tokens",
                                                 "preemptions")})
        for metric in ("ttft", "tpot", "e2el", "queue"):
            frame[f"{metric}_ms"] = r[f"{metric}_s"] * 1e3
        if speculation:  # speculation on: each request's drafts and acceptances
            frame["spec_drafted"] = r["spec_drafted"]
            frame["spec_accepted"] = r["spec_accepted"]
        frame["status"] = np.where(r["finished"], "finished", "rejected")
        frame["rejection_reason"] = pd.Series(reasons, dtype=object)
        if extra is not None:
            frame = frame.merge(extra, on="request_id", how="left")
        return frame


class RequestCSV:
    """requests.csv written a row per recorded request (see the module docstring).

    `speculation` adds the draft columns; `extra_columns` are further columns
    (after `rejection_reason`) whose values `extra(request_id)` gives, or None
    for empty cells. Nothing per request stays in memory.
    """

    __slots__ = ("path", "_file", "_writer", "speculation", "_extra", "_blank", "rows")

    def __init__(self, path: Path, speculation: bool, extra_columns: Sequence[str] = (),
                 extra: Callable[[int], Sequence[float | int] | None] | None = None) -> None:
        self.path = Path(path)
        self._file = open(self.path, "w", newline="")  # noqa: SIM115 - closed by close()
        self._writer = csv.writer(self._file, lineterminator="\n")
        self.speculation = speculation
        self._extra = extra
        self._blank = [""] * len(extra_columns)
        self.rows = 0
        header = ["request_id", *_REQ_FLOAT, "prompt_tokens", "output_tokens",
                  "prefix_hit_tokens", "preemptions", "ttft_ms", "tpot_ms", "e2el_ms",
                  "queue_ms"]
        if speculation:
            header += ["spec_drafted", "spec_accepted"]
        self._writer.writerow([*header, "status", "rejection_reason", *extra_columns])

    def write_rows(self, rows: RequestRows) -> None:
        """Rows for `rows`' requests, in order, as the module docstring says: cells are
        written as pandas writes them (a time as repr(float), NaN or never empty)."""
        n = len(rows)
        if not n:
            return
        a = rows.arrival_s
        ttft, e2el, out = rows.first_token_s - a, rows.finish_s - a, rows.output_tokens
        with np.errstate(invalid="ignore"):  # NaN times give NaN latencies: empty cells
            tpot_ms = np.where(out > 1, (e2el - ttft) / np.maximum(out - 1, 1) * 1e3, math.nan)
        cols: list[Sequence[str]] = [
            _ints(rows.request_id), *(_floats(t) for t in (
                a, rows.first_scheduled_s, rows.first_token_s, rows.finish_s)),
            *(_ints(c) for c in (rows.prompt_tokens, out, rows.prefix_hit_tokens,
                                 rows.preemptions)),
            *(_floats(x) for x in (ttft * 1e3, tpot_ms, e2el * 1e3,
                                   (rows.first_scheduled_s - a) * 1e3))]
        if self.speculation:
            assert rows.spec_drafted is not None and rows.spec_accepted is not None
            cols += [_ints(rows.spec_drafted), _ints(rows.spec_accepted)]
        cols += [repeat("finished", n), repeat("", n)]
        if self._extra is not None:
            nans = (math.nan,) * len(self._blank)  # no row: empty cells
            values = [nans if v is None else v for v in map(self._extra,
                                                             rows.request_id.tolist())]
            cols += [_cells(column) for column in zip(*values, strict=True)]
        lines = list(map(",".join, zip(*cols, strict=True)))
        rejected = sorted(rows.reasons)
        done = 0
        for at in rejected:  # as a finished row, but no latencies (csv quotes the reason)
            if at > done:
                self._file.write("\n".join(lines[done:at]) + "\n")
            cells = lines[at].split(",")  # no cell holds a comma: numbers and words
            cells[9:13] = ["", "", "", ""]
            status = 13 + 2 * self.speculation
            cells[status:status + 2] = ["rejected", rows.reasons[at]]
            self._writer.writerow(cells)
            done = at + 1
        if done < n:
            self._file.write("\n".join(lines[done:]) + "\n")
        self.rows += n

    def close(self) -> None:
        self._file.close()


def _ints(column: np.ndarray) -> list[str]:
    return list(map(str, column.tolist()))


def _floats(column: np.ndarray) -> list[str]:
    """repr of each float, NaN as an empty cell."""
    cells = list(map(repr, column.tolist()))
    if "nan" in cells:
        cells = ["" if c == "nan" else c for c in cells]
    return cells


def _cells(values: Sequence[float | int]) -> list[str]:
    """Cells of joined values: repr of a float and str of an int are one repr (C-level map)
    for Python numbers; NaN empty."""
    if set(map(type, values)) <= {float, int, bool}:
        cells = list(map(repr, values))
        return ["" if c == "nan" else c for c in cells] if "nan" in cells else cells
    return [("" if v != v else repr(v)) if isinstance(v, float) else str(v) for v in values]
