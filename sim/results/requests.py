"""Finished and rejected requests: the rows of requests.csv, kept in memory or streamed.

Two homes for the rows. `RequestLog` keeps them as `array.array` columns (96
bytes a request) for callers that read them back as a frame (the engine, the
server, tests). `RequestCSV` writes each row to requests.csv as the request is
recorded and keeps nothing, so a run's memory follows the requests in flight,
not those done; its bytes are what `RequestLog.frame().to_csv(index=False)`
writes (floats as repr, NaN and None empty), except that integer columns joined
from elsewhere (the TTFT diagnosis) stay integers where pandas would print them
as floats once a row lacks them. Either way the caller may drop each Request
once recorded. TTFT, TPOT, E2EL and queue time use vLLM's formulas: TTFT =
first token - arrival, TPOT = (E2EL - TTFT) / (output - 1) over requests with
more than one output token, E2EL = finish - arrival.
"""

from __future__ import annotations

import csv
import math
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sim.core.request import Request, RequestState

if TYPE_CHECKING:
    import pandas as pd

_REQ_FLOAT = ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s")
_REQ_INT = ("request_id", "prompt_tokens", "output_tokens", "prefix_hit_tokens",
            "preemptions", "reason_code", "spec_drafted", "spec_accepted")
_FINISHED_CODE = -1


def _opt(x: float | None) -> float:
    return math.nan if x is None else x


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

    def _append(self, req: Request, code: int) -> None:
        c = self._columns
        c["request_id"].append(req.request_id)
        c["arrival_s"].append(req.arrival_s)
        c["first_scheduled_s"].append(_opt(req.first_scheduled_s))
        c["first_token_s"].append(_opt(req.first_token_s))
        c["finish_s"].append(_opt(req.finish_s))
        c["prompt_tokens"].append(req.prompt_tokens)
        c["output_tokens"].append(req.output_tokens)
        c["prefix_hit_tokens"].append(req.prefix_hit_tokens)
        c["preemptions"].append(req.num_preemptions)
        c["reason_code"].append(code)
        c["spec_drafted"].append(req.spec_drafted)
        c["spec_accepted"].append(req.spec_accepted)

    def record_finished(self, req: Request) -> None:
        if req.state is not RequestState.FINISHED:
            raise ValueError(f"request {req.request_id} is {req.state.value}, not finished")
        self._append(req, _FINISHED_CODE)

    def record_rejected(self, req: Request) -> None:
        reason = req.rejection_reason or "unknown"
        code = self._reason_codes.setdefault(reason, len(self._reason_codes))
        self._append(req, code)

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

    __slots__ = ("path", "_file", "_writer", "_speculation", "_extra", "_blank", "rows")

    def __init__(self, path: Path, speculation: bool, extra_columns: Sequence[str] = (),
                 extra: Callable[[int], Sequence[float | int] | None] | None = None) -> None:
        self.path = Path(path)
        self._file = open(self.path, "w", newline="")  # noqa: SIM115 - closed by close()
        self._writer = csv.writer(self._file, lineterminator="\n")
        self._speculation = speculation
        self._extra = extra
        self._blank = [""] * len(extra_columns)
        self.rows = 0
        header = ["request_id", *_REQ_FLOAT, "prompt_tokens", "output_tokens",
                  "prefix_hit_tokens", "preemptions", "ttft_ms", "tpot_ms", "e2el_ms",
                  "queue_ms"]
        if speculation:
            header += ["spec_drafted", "spec_accepted"]
        self._writer.writerow([*header, "status", "rejection_reason", *extra_columns])

    def write(self, req: Request, reason: str | None) -> None:
        """One row: `reason` None for a finished request, else why it was rejected."""
        a = req.arrival_s
        scheduled, first, finish = req.first_scheduled_s, req.first_token_s, req.finish_s
        # cells: a time as repr(float(t)) (a clock may start at the int 0), None or NaN
        # empty, as pandas writes them; inline, ~16 cells a request
        row = [str(req.request_id), repr(float(a)),
               "" if scheduled is None else repr(float(scheduled)),
               "" if first is None else repr(float(first)),
               "" if finish is None else repr(float(finish)), str(req.prompt_tokens),
               str(req.output_tokens), str(req.prefix_hit_tokens), str(req.num_preemptions)]
        if reason is None:
            ttft, e2el = first - a, finish - a  # type: ignore[operator]
            out = req.output_tokens
            latencies = (ttft * 1e3, (e2el - ttft) / max(out - 1, 1) * 1e3 if out > 1 else
                         math.nan, e2el * 1e3, (scheduled - a) * 1e3)  # type: ignore[operator]
            row += ["" if x != x else repr(x) for x in latencies]
        else:
            row += ["", "", "", ""]
        if self._speculation:
            row += [str(req.spec_drafted), str(req.spec_accepted)]
        row += ["finished", ""] if reason is None else ["rejected", reason]
        if self._extra is not None:
            values = self._extra(req.request_id)
            row += self._blank if values is None else [
                ("" if v != v else repr(v)) if isinstance(v, float) else str(v)
                for v in values]
        self._writer.writerow(row)
        self.rows += 1

    def close(self) -> None:
        self._file.close()
