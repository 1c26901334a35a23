"""A run's steady-state figures: the measurement window, 95% intervals, and sustained or not.

Built on the requests' time batches (sim.results.record.batches: one `BatchSeries`
taken when the run is over) and the ITL slices, so it reads what both worlds record,
in memory bounded however many requests ran. The rules (docs/statistics.md):
- window: MSER on the batches' mean E2E latency (weighted by their finished
  requests) and their time-average number in the system, from each end; the
  cut drops whole batches (steady_state.weighted_mser_cut);
- intervals: batch means over the window's batches in `num_batches` contiguous
  groups: each group's finishes for the rates, arrivals for attainment, merged
  sketches for latencies (sectioning for percentiles), ITL slices for ITL
  (intervals);
- sustained: the achieved rate's upper bound >= 0.98 x the offered rate over the
  window, and no upward Mann-Kendall trend (one-sided p < 0.01) in the groups'
  mean waiting time (queue).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.results.record.batches import Batch, BatchSeries
from sim.results.record.itl_slices import ITLSlices
from sim.results.stats.intervals import Interval, pooled, spread_interval
from sim.results.stats.latency_samples import Latency, Moments
from sim.results.stats.sketch import QuantileSketch
from sim.results.stats.steady_state import Window, mann_kendall, weighted_mser_cut

NUM_BATCHES = 20
KEEP_UP = 0.98  # the achieved rate's upper bound must reach this share of the offered rate
TREND_ALPHA = 0.01
LATENCY_STATS = (("mean", None), ("median", 50.0), ("p90", 90.0), ("p99", 99.0))
LATENCIES = ("ttft", "tpot", "itl", "e2el", "queue")  # queue: arrival to first scheduled
RATES = ("request_throughput", "request_goodput", "slo_attainment")


def ci_keys(with_slo: bool) -> list[str]:
    """The ci95 block's metric names (the summary's own names)."""
    rates = list(RATES) if with_slo else ["request_throughput"]
    return rates + [f"{s}_{m}_ms" for m in LATENCIES for s, _ in LATENCY_STATS]


def _latency_stats(latency: Latency) -> list[float]:
    """[mean, median, p90, p99] in ms: the mean exact, the percentiles the sketch's."""
    if not latency.moments.count:
        return [math.nan] * len(LATENCY_STATS)
    pct = latency.sketch.quantiles([q / 100.0 for _, q in LATENCY_STATS[1:]])
    return [latency.moments.mean * 1e3, *(float(x) * 1e3 for x in pct)]


def _num_batches(n: int, wanted: int) -> int:
    return max(2, min(wanted, n // 10))


@dataclass(frozen=True, slots=True)
class BatchWindow:
    """The window as whole time batches [lo, hi) of a `BatchSeries`, and its clipped span."""

    window: Window
    lo: int
    hi: int


def _kept_batches(series: np.ndarray, weights: np.ndarray) -> tuple[int, int]:
    """MSER from the start, then on what is left from the end: the kept batches [lo, hi)."""
    head = weighted_mser_cut(series, weights)
    tail = weighted_mser_cut(series[head:][::-1], weights[head:][::-1])
    return head, series.size - tail


def batch_window(batches: BatchSeries) -> BatchWindow:
    """MSER on the batches' mean E2E latency (weighted by finished requests) and their mean
    number in the system, from the start and then from the end; the later start and the
    earlier end of the two win, as whole batches (docs/statistics.md). The window's span
    is clipped to the first and last arrival; too little kept: the whole run."""
    rows = batches.rows
    first_s, last_s = batches.first_arrival_s, batches.last_arrival_s
    if not rows or not math.isfinite(first_s):
        return BatchWindow(Window(math.nan, math.nan, 0, 0, 0), 0, 0)
    w = batches.width_s
    first, last = int(first_s / w), min(int(last_s / w), len(rows) - 1)
    part = rows[first: last + 1]
    e2el = np.array([b.latency["e2el"].moments.mean if "e2el" in b.latency else math.nan
                     for b in part])
    done = np.array([b.latency["e2el"].moments.count if "e2el" in b.latency else 0
                     for b in part], dtype=np.float64)
    spans = [_kept_batches(e2el, done),
             _kept_batches(batches.in_system[first: last + 1], np.ones(len(part)))]
    lo, hi = max(s[0] for s in spans), min(s[1] for s in spans)
    arrived = np.array([b.arrived for b in part])
    if hi - lo < 1 or arrived[lo:hi].sum() < 2:
        lo, hi = 0, len(part)
    start_s, end_s = max((first + lo) * w, first_s), min((first + hi) * w, last_s)
    window = Window(start_s, end_s, int(arrived[:lo].sum()), int(arrived[hi:].sum()),
                    int(arrived[lo:hi].sum()))
    return BatchWindow(window, first + lo, first + hi)


def window_intervals(batches: BatchSeries, where: BatchWindow, itl: ITLSlices | None,
                     num_batches: int = NUM_BATCHES) -> dict[str, Interval]:
    """Every headline metric over the window, with its batch-means interval: the window's
    time batches in `k` contiguous groups, each group's sketches merged."""
    window = where.window
    rows = batches.rows[where.lo: where.hi]
    k = min(_num_batches(window.kept, num_batches), len(rows))
    groups = [[rows[i] for i in ix] for ix in np.array_split(np.arange(len(rows)), k)]
    out = _rates(rows, where.lo, window.start_s, window.end_s, batches, k)
    if batches.with_slo:
        good = np.array([sum(b.good for b in g) for g in groups], dtype=np.float64)
        arrived = np.array([sum(b.arrived for b in g) for g in groups], dtype=np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            share = spread_interval(good / arrived, centre=good.sum() / arrived.sum()
                                    if arrived.sum() else math.nan)
        out["slo_attainment"] = share.clipped(0.0, 1.0)
    for metric in ("ttft", "tpot", "e2el", "queue"):
        parts = [Latency.merged(b.latency[metric] for b in g if metric in b.latency)
                 for g in groups]
        whole = _latency_stats(_whole(parts, rows, metric))
        per = np.array([_latency_stats(part) for part in parts])
        for j, (stat, _) in enumerate(LATENCY_STATS):
            out[f"{stat}_{metric}_ms"] = spread_interval(per[:, j], centre=whole[j]
                                                         ).clipped(0.0, math.inf)
    qs = [q if q is not None else 50.0 for _, q in LATENCY_STATS[1:]]
    slices = itl.inside(window.start_s, window.end_s) if itl is not None else []
    whole_itl = (itl.stats(slices, qs) * 1e3 if slices
                 else np.full(len(LATENCY_STATS), math.nan))
    per_itl = (np.array([itl.stats([slices[i] for i in ix], qs) * 1e3
                         for ix in _groups(len(slices), min(k, len(slices)))])
               if len(slices) >= 2 else np.full((1, len(LATENCY_STATS)), math.nan))
    for j, (stat, _) in enumerate(LATENCY_STATS):
        out[f"{stat}_itl_ms"] = spread_interval(per_itl[:, j], centre=float(whole_itl[j])
                                                ).clipped(0.0, math.inf)
    return out


def _rates(rows: Sequence[Batch], lo: int, start_s: float, end_s: float,
           batches: BatchSeries, k: int) -> dict[str, Interval]:
    """Throughput (and goodput, with an SLO) over [start_s, end_s]: the finishes in `rows`
    (batches `lo`... of `batches`) over the span, with batch means over `k` contiguous
    groups. Both rates count the same finishes over the same span, so goodput <= throughput,
    and an interval is cut at 0 (a rate is never negative, as a share never leaves [0, 1])."""
    index = np.array_split(np.arange(len(rows)), k)
    groups = [[rows[i] for i in ix] for ix in index]
    starts = [max((lo + int(ix[0])) * batches.width_s, start_s) for ix in index]
    durations = np.array([*starts[1:], end_s]) - np.array(starts)
    span_s = end_s - start_s

    def rate_of(field: str) -> Interval:
        counts = np.array([sum(getattr(b, field) for b in g) for g in groups], np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            per = np.where(durations > 0, counts / durations, math.nan)
        return spread_interval(per, centre=counts.sum() / span_s if span_s > 0 else math.nan
                               ).clipped(0.0, math.inf)

    out = {"request_throughput": rate_of("done_here")}
    if batches.with_slo:
        out["request_goodput"] = rate_of("good_here")
    return out


def backlog_rates(batches: BatchSeries, num_batches: int = NUM_BATCHES
                  ) -> tuple[dict[str, Interval], float] | None:
    """An overloaded run's rates over the whole run, first arrival to last finish, and
    that end; None when nothing finished.

    Such a run has no steady state for a window to find, and the window ends at the last
    arrival while the server goes on working off its backlog: a batch server whose batches
    outlast the arrivals finishes only a batch or two inside it (static batching at
    32 req/s: about 1 req/s there, against the 3 req/s it serves). From the window's start
    to the last finish would count the drain's burst of finishes without the fill's lull
    (continuous batching: 26 req/s against 20); the whole run keeps both, as the
    whole-run rate in the table does, now with its interval."""
    done = [i for i, b in enumerate(batches.rows) if b.done_here]
    if not done or not math.isfinite(batches.first_arrival_s):
        return None
    lo = int(batches.first_arrival_s / batches.width_s)
    rows = batches.rows[lo: done[-1] + 1]
    end_s = (done[-1] + 1) * batches.width_s
    k = min(_num_batches(sum(b.done_here for b in rows), num_batches), len(rows))
    return _rates(rows, lo, batches.first_arrival_s, end_s, batches, k), end_s


def _whole(parts: Sequence[Latency], rows: Sequence[Batch], metric: str) -> Latency:
    """`metric` over all `rows`, from their groups' `parts`: the parts' sketches merged (a
    merge adds counts, so this is the rows' own merged sketch, in one merge per group
    rather than per row) and the rows' moments merged row by row, as `Latency.merged` over
    all the rows would (float for float: a merge of means is not associative)."""
    out = Latency()
    out.sketch = QuantileSketch.merged(part.sketch for part in parts)
    out.moments = _moments(rows, metric)
    return out


def _groups(n: int, k: int) -> list[np.ndarray]:
    return np.array_split(np.arange(n), k) if n >= k else [np.arange(n)]


def upward_trend(batches: BatchSeries, where: BatchWindow,
                 num_batches: int = NUM_BATCHES) -> float:
    """Mann-Kendall's one-sided p-value of an upward trend in the window's waiting times:
    the mean wait of each of `k` contiguous groups of its batches."""
    rows = batches.rows[where.lo: where.hi]
    k = min(_num_batches(where.window.kept, num_batches), len(rows))
    means = [_moments([rows[i] for i in ix], "queue")
             for ix in np.array_split(np.arange(len(rows)), k)]
    return mann_kendall(np.array([m.mean for m in means if m.count])).p_value


def _moments(rows: Sequence[Batch], metric: str) -> Moments:
    """`metric`'s moments over `rows`, merged in row order as `Latency.merged` merges them
    (the same floats), without merging the sketches too."""
    out = Moments()
    for row in rows:
        if metric in row.latency:
            out.update(row.latency[metric].moments)
    return out


def steady_summary(batches: BatchSeries, itl: ITLSlices | None,
                   num_batches: int = NUM_BATCHES) -> dict[str, Any]:
    """summary.json's `window`, `ci95` (batch means) and `sustained` from one run's batches
    (their SLO, if any, gives goodput and attainment)."""
    where = batch_window(batches)
    window = where.window
    if not window.kept >= 2 or not window.duration_s > 0:
        return {"window": _window_dict(window, math.nan), "ci95": {}, "sustained": False,
                "sustained_checks": {"reason": "fewer than two requests in the window"}}
    offered = (window.kept - 1) / window.duration_s
    intervals = window_intervals(batches, where, itl, num_batches)
    p_trend = upward_trend(batches, where, num_batches)
    achieved_hi = intervals["request_throughput"].hi
    out = {"window": _window_dict(window, offered)}
    backlog = backlog_rates(batches, num_batches) if achieved_hi < KEEP_UP * offered \
        else None
    if backlog is not None:  # it did not keep up: its rates are the whole run's
        intervals.update(backlog[0])
        out["window"]["rates_start_s"] = batches.first_arrival_s
        out["window"]["rates_end_s"] = backlog[1]
    return {**out,
            "ci95": {"method": "batch means", **{k: v.as_dict() for k, v in intervals.items()}},
            **sustained_block(achieved_hi, offered, [p_trend])}


def _window_dict(window: Window, offered: float) -> dict[str, Any]:
    return {"start_s": window.start_s, "end_s": window.end_s,
            "excluded_start": window.excluded_start, "excluded_end": window.excluded_end,
            "requests": window.kept, "offered_rate": offered,
            "rule": "MSER on time batches' mean E2E latency and number in the system, "
                    "from the start and from the end"}


def sustained_block(achieved_hi: float, offered: float, trend_p: Sequence[float]
                    ) -> dict[str, Any]:
    """sustained: the achieved rate keeps up and no run's waits trend upward (with several
    runs, Bonferroni: each is tested at TREND_ALPHA / runs)."""
    keeps_up = bool(achieved_hi >= KEEP_UP * offered)
    trend = any(p < TREND_ALPHA / max(len(trend_p), 1) for p in trend_p)
    return {"sustained": keeps_up and not trend,
            "sustained_checks": {"achieved_rate_hi": achieved_hi, "offered_rate": offered,
                                 "keeps_up": keeps_up, "ratio": KEEP_UP,
                                 "trend_test": "Mann-Kendall on waiting-time batch means",
                                 "trend_p_values": list(trend_p), "trend_alpha": TREND_ALPHA,
                                 "upward_trend": trend}}


def pool_replications(summaries: Sequence[dict[str, Any]], seeds: Sequence[int]
                      ) -> dict[str, Any]:
    """`ci95` and `sustained` across independent replications (each a run's summary)."""
    keys = [k for k in summaries[0].get("ci95", {}) if k != "method"]
    ci: dict[str, Any] = {"method": "independent replications", "replications": len(summaries),
                          "seeds": list(seeds)}
    for key in keys:
        ests = [Interval(_f(s["ci95"].get(key, {}).get("estimate")), 0.0, 1) for s in summaries]
        ci[key] = pooled(ests).as_dict()
    offered = float(np.mean([_f(s["window"]["offered_rate"]) for s in summaries]))
    hi = _f(ci.get("request_throughput", {}).get("hi"))
    trend = [p for s in summaries for p in s.get("sustained_checks", {}).get("trend_p_values",
                                                                              [0.0])]
    return {"ci95": ci, **sustained_block(hi, offered, trend)}


# table columns of the window's estimates and their 95% intervals (compare and sweep rows)
WINDOW_COLUMNS = {"request_throughput": "window_throughput",
                  "request_goodput": "window_goodput", "slo_attainment": "window_attainment",
                  "p99_ttft_ms": "window_p99_ttft_ms", "p99_tpot_ms": "window_p99_tpot_ms"}


def window_columns(summary: dict[str, Any]) -> dict[str, Any]:
    """A run summary's verdict and window estimates as flat table cells (NaN if absent)."""
    ci = summary.get("ci95") or {}
    row: dict[str, Any] = {"sustained": bool(summary.get("sustained", False)),
                           "window_offered_rate": _f((summary.get("window") or {}).get(
                               "offered_rate"))}
    for key, column in WINDOW_COLUMNS.items():
        interval = ci.get(key) or {}
        row[column] = _f(interval.get("estimate"))
        row[f"{column}_lo"], row[f"{column}_hi"] = _f(interval.get("lo")), _f(interval.get("hi"))
    return row


def _f(value: Any) -> float:
    return math.nan if value is None else float(value)
