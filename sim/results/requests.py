"""Finished and rejected requests as typed columns: the rows of requests.csv, 96 bytes each.

The recorder sits in the simulator's hot loop, so requests are kept as
`array.array` columns rather than one object per request; the caller may drop
each Request once recorded. TTFT, TPOT, E2EL and queue time are derived when
read, with vLLM's formulas: TTFT = first token - arrival, TPOT = (E2EL - TTFT) /
(output - 1) over requests with more than one output token, E2EL = finish - arrival.
"""

from __future__ import annotations

import math
from array import array

import numpy as np
import pandas as pd

from sim.core.request import Request, RequestState

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
