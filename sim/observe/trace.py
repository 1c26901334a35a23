"""Per-request tracing in the simulator: the observer hook, the wait clock, timelines.

The world calls a replica's observer at each accepted arrival and once per
step, just before the step runs (its duration is known by then). Per-step
work is O(1) unless a traced request is in flight, so tracing N requests
costs nothing measurable at batch sizes in the hundreds; nothing per token
or per step is stored for untraced requests.

A request's timeline is a sequence of contiguous, non-overlapping segments
from its arrival to its finish: waiting (`queue`, `batch_fill` while the
server idles, `kv_wait` while admission is blocked on KV blocks, `preempted`
until re-admission), then one segment per step while admitted (`prefill`
chunk, `recompute` of KV dropped by preemption, `decode`, or `stalled`: in
the running set but given no tokens that step), plus two instants,
`first_token` and `finish`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from sim.core.plan import StepPlan
from sim.core.request import Request
from sim.core.schedulers.base import Scheduler

if TYPE_CHECKING:
    import pandas as pd

WAIT_KINDS = ("queue", "batch_fill", "kv_wait", "preempted")
RUN_KINDS = ("prefill", "recompute", "decode", "stalled")
MARK_KINDS = ("first_token", "finish")
TIMELINE_COLUMNS = ("request_id", "kind", "start_s", "end_s", "new_tokens", "context_tokens",
                    "emits")


class StepObserver(Protocol):
    """What a replica tells an observer; both calls must stay cheap (hot loop)."""

    def on_arrival(self, request: Request, now_s: float) -> None:
        """`request` was accepted by the scheduler at `now_s`."""
        ...

    def on_step(self, start_s: float, duration_s: float, plan: StepPlan) -> None:
        """`plan` was scheduled at `start_s` and will run for `duration_s`."""
        ...

    @property
    def takes_decode_runs(self) -> bool:
        """True: decode runs may come as on_decode_steps; False: the replica runs step by step."""
        ...

    def on_decode_steps(self, start_s: np.ndarray, duration_s: np.ndarray,
                        kv_blocked: bool) -> None:
        """Steps of a decode run (sim.core.decode_run), as on_step would have seen them one by
        one; the replica calls it before any on_arrival that falls after their start."""
        ...


class WaitClock:
    """Cumulative seconds a replica sat idle, and had admission blocked on KV blocks.

    Why clocks: a waiting request's share of each is the clock's difference
    between its arrival and its admission, O(1) per request however long the
    queue. A step counts as KV-blocked when it preempted, or when its scheduler
    says it held requests back for lack of KV (`Scheduler.kv_blocked`: the
    continuous scheduler stopped admitting for lack of blocks; request-level
    batching runs a batch that launched short on a full pool, requests waiting).
    """

    __slots__ = ("_scheduler", "idle_s", "kv_s", "start_s", "duration_s", "end_s", "kv_step")

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler
        self.idle_s = 0.0  # both clocks as read at start_s
        self.kv_s = 0.0
        self.start_s = self.duration_s = self.end_s = 0.0
        self.kv_step = False  # the current step is KV-blocked

    def on_step(self, start_s: float, duration_s: float, plan: StepPlan) -> None:
        if self.kv_step:
            self.kv_s += self.duration_s
        if start_s > self.end_s:
            self.idle_s += start_s - self.end_s
        self.start_s, self.duration_s, self.end_s = start_s, duration_s, start_s + duration_s
        self.kv_step = bool(plan.preempted_ids) or self._scheduler.kv_blocked

    def on_decode_steps(self, start_s: np.ndarray, duration_s: np.ndarray,
                        kv_blocked: bool) -> None:
        """on_step for each step of a decode run (none preempts; kv_blocked throughout).

        The steps run back to back (each starts at the float its predecessor ends at),
        so only the first can follow idle time, and the KV clock adds the durations
        one by one (np.cumsum adds in order: the same floats as on_step's loop)."""
        if not len(start_s):
            return
        first = float(start_s[0])
        if self.kv_step:
            self.kv_s += self.duration_s
        if first > self.end_s:
            self.idle_s += first - self.end_s
        if kv_blocked and len(duration_s) > 1:
            self.kv_s = float(np.cumsum(np.concatenate(((self.kv_s,), duration_s[:-1])))[-1])
        start, duration = float(start_s[-1]), float(duration_s[-1])
        self.start_s, self.duration_s, self.end_s = start, duration, start + duration
        self.kv_step = kv_blocked

    def at(self, t_s: float) -> tuple[float, float]:
        """(idle, KV-blocked) readings at `t_s`, which is at or after the current step's start."""
        if t_s >= self.end_s:
            kv = self.kv_s + (self.duration_s if self.kv_step else 0.0)
            return self.idle_s + (t_s - self.end_s), kv
        return self.idle_s, self.kv_s + ((t_s - self.start_s) if self.kv_step else 0.0)


def choose_requests(request_ids: Sequence[int], n: int) -> frozenset[int]:
    """`n` ids spread evenly over the arrival order (first and last included); deterministic."""
    if n < 0:
        raise ValueError(f"the number of requests to trace must be >= 0, got {n}")
    count = len(request_ids)
    if n >= count:
        return frozenset(request_ids)
    if n == 1:
        return frozenset((request_ids[count // 2],))
    return frozenset(request_ids[round(k * (count - 1) / (n - 1))] for k in range(n))


@dataclass(slots=True, eq=False)
class _Traced:
    request: Request
    t_s: float  # end of the last segment recorded
    waiting: str | None = "queue"  # "queue" before admission, "preempted" after; None: running
    computed_max: int = 0  # most tokens it has had in KV: below this a prefill recomputes
    rows: list[list] = field(default_factory=list)


class RequestTracer:
    """Timelines of the traced requests of one replica (see the module docstring)."""

    __slots__ = ("clock", "traced", "_live", "_rows")

    def __init__(self, clock: WaitClock, traced: frozenset[int]) -> None:
        self.clock = clock
        self.traced = traced
        self._live: dict[int, _Traced] = {}
        self._rows: list[list] = []

    def on_arrival(self, request: Request, now_s: float) -> None:
        if request.request_id not in self.traced:
            return
        t = self._live[request.request_id] = _Traced(request, now_s)
        clock = self.clock
        if now_s < clock.end_s:  # arrived during a step: waits for it to end
            self._add(t, "kv_wait" if clock.kv_step else "queue", now_s, clock.end_s)

    def on_step(self, start_s: float, duration_s: float, plan: StepPlan) -> None:
        if not self._live:
            return
        end_s = start_s + duration_s
        ids = plan.request_ids
        for rid, t in list(self._live.items()):
            if t.request.finish_s is not None:  # finished in an earlier step
                self._close(rid, t)
                continue
            if rid in plan.preempted_ids:
                t.waiting = "preempted"
            try:
                i = ids.index(rid)
            except ValueError:
                i = -1
            if t.waiting is not None:
                if start_s > t.t_s:  # no step ran in between: the server idled
                    self._add(t, "batch_fill" if t.waiting == "queue" else t.waiting, t.t_s,
                              start_s)
                if i < 0:
                    kind = t.waiting
                    if kind == "queue" and self.clock.kv_step:
                        kind = "kv_wait"
                    self._add(t, kind, start_s, end_s)
                    continue
                t.waiting = None
            if i < 0:
                self._add(t, "stalled", start_s, end_s)
                continue
            new, context = plan.num_new_tokens[i], plan.context_tokens[i]
            if not plan.is_prefill[i]:
                kind = "decode"
            else:
                kind = "recompute" if context < t.computed_max else "prefill"
            t.computed_max = max(t.computed_max, context + new)
            self._add(t, kind, start_s, end_s, new, context, plan.emits_token[i])

    @staticmethod
    def _add(t: _Traced, kind: str, start_s: float, end_s: float, new: int = 0,
             context: int = 0, emits: bool = False) -> None:
        rows = t.rows
        if kind in WAIT_KINDS and rows and rows[-1][1] == kind and rows[-1][3] == start_s:
            rows[-1][3] = end_s  # one waiting stretch, however many steps it spans
        else:
            rows.append([t.request.request_id, kind, start_s, end_s, new, context, emits])
        t.t_s = end_s

    def _close(self, rid: int, t: _Traced) -> None:
        req = t.request
        self._rows.extend(t.rows)
        for kind, at_s in (("first_token", req.first_token_s), ("finish", req.finish_s)):
            if at_s is not None:
                self._rows.append([rid, kind, at_s, at_s, 0, 0, False])
        del self._live[rid]

    def frame(self) -> pd.DataFrame:
        """Every traced request's segments and instants (requests still running: so far)."""
        for rid, t in list(self._live.items()):
            if t.request.finish_s is not None:
                self._close(rid, t)
        rows = self._rows + [row for t in self._live.values() for row in t.rows]
        return timeline_frame(rows)


def timeline_frame(rows: Sequence[Sequence]) -> pd.DataFrame:
    """Rows of TIMELINE_COLUMNS as a frame ordered by request, then time (instants last)."""
    import pandas as pd  # only a traced run pays for pandas

    frame = pd.DataFrame(list(rows), columns=list(TIMELINE_COLUMNS))
    frame = frame.astype({"request_id": "int64", "kind": "object", "start_s": "float64",
                          "end_s": "float64", "new_tokens": "int64", "context_tokens": "int64",
                          "emits": "bool"})
    instant = frame["kind"].isin(MARK_KINDS)
    order = frame.assign(_instant=instant).sort_values(
        ["request_id", "start_s", "_instant"], kind="stable").index
    return frame.loc[order].reset_index(drop=True)


def read_timeline(path: Path) -> pd.DataFrame:
    """A timeline.csv back as written; FileNotFoundError / ValueError name the problem."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no timeline here; run with `servesim run SCENARIO "
                                "--timeline N` to trace N requests")
    import pandas as pd

    frame = pd.read_csv(path)
    missing = [c for c in TIMELINE_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"{path}: not a servesim timeline (missing {', '.join(missing)})")
    return timeline_frame(frame[list(TIMELINE_COLUMNS)].itertuples(index=False))
