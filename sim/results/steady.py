"""A run's steady-state figures: the measurement window, 95% intervals, and sustained or not.

Built on the per-request columns (sim.results.requests) and the ITL slices,
so it reads what both worlds record. The rules (docs/statistics.md):
- window: MSER-5 on E2E latency and on the number in the system each arrival
  finds, in arrival order, from each end (steady_state);
- intervals: batch means over the window, `num_batches` of them: time slices
  for the rates, arrival-order groups for attainment and latencies (sectioning
  for percentiles), ITL slices for ITL (intervals);
- sustained: the achieved rate's upper bound >= 0.98 x the offered rate over the
  window, and no upward Mann-Kendall trend (one-sided p < 0.01) in batch means
  of the waiting time (queue_s).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from sim.results.intervals import Interval, pooled, spread_interval
from sim.results.itl_slices import ITLSlices
from sim.results.slo import SLO, meets_slo
from sim.results.steady_state import Window, batch_means, mann_kendall, measurement_window

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


def _latency_stats(values_s: np.ndarray) -> list[float]:
    v = values_s[~np.isnan(values_s)]
    if v.size == 0:
        return [math.nan] * len(LATENCY_STATS)
    return [float(v.mean() * 1e3) if q is None else float(np.percentile(v, q) * 1e3)
            for _, q in LATENCY_STATS]


def _groups(n: int, k: int) -> list[np.ndarray]:
    return np.array_split(np.arange(n), k) if n >= k else [np.arange(n)]


def _num_batches(n: int, wanted: int) -> int:
    return max(2, min(wanted, n // 10))


def window_intervals(r: dict[str, np.ndarray], window: Window, itl: ITLSlices | None,
                     slo: SLO | None, num_batches: int = NUM_BATCHES) -> dict[str, Interval]:
    """Every headline metric over `window`, with its batch-means interval."""
    out: dict[str, Interval] = {}
    dur = window.duration_s
    inside = window.holds(r["arrival_s"])
    k = _num_batches(int(inside.sum()), num_batches)
    finish = r["finish_s"]
    edges = window.start_s + dur * np.arange(k + 1) / k
    width = dur / k

    def rate_of(times: np.ndarray) -> Interval:
        counts = np.histogram(times, bins=edges)[0]
        return spread_interval(counts / width, centre=counts.sum() / dur)

    done = r["finished"] & window.holds(np.nan_to_num(finish, nan=-math.inf))
    out["request_throughput"] = rate_of(finish[done])
    order = np.argsort(r["arrival_s"], kind="stable")
    arriving = order[inside[order]]
    if slo is not None and slo.has_bounds:
        good = meets_slo(r, slo)
        out["request_goodput"] = rate_of(finish[done & good])
        g = good[arriving].astype(np.float64)
        share = spread_interval(np.array([g[ix].mean() for ix in _groups(g.size, k)]),
                                centre=float(g.mean()) if g.size else math.nan)
        out["slo_attainment"] = share.clipped(0.0, 1.0)
    kept = arriving[r["finished"][arriving]]
    groups = _groups(kept.size, k)
    for metric in ("ttft", "tpot", "e2el", "queue"):
        col = r[f"{metric}_s"][kept]
        whole = _latency_stats(col)
        per = np.array([_latency_stats(col[ix]) for ix in groups])
        for j, (stat, _) in enumerate(LATENCY_STATS):
            out[f"{stat}_{metric}_ms"] = spread_interval(per[:, j], centre=whole[j])
    qs = [q if q is not None else 50.0 for _, q in LATENCY_STATS[1:]]
    slices = itl.inside(window.start_s, window.end_s) if itl is not None else []
    whole = (itl.stats(slices, qs) * 1e3 if slices
             else np.full(len(LATENCY_STATS), math.nan))
    per = (np.array([itl.stats([slices[i] for i in ix], qs) * 1e3
                     for ix in _groups(len(slices), min(k, len(slices)))])
           if len(slices) >= 2 else np.full((1, len(LATENCY_STATS)), math.nan))
    for j, (stat, _) in enumerate(LATENCY_STATS):
        out[f"{stat}_itl_ms"] = spread_interval(per[:, j], centre=float(whole[j]))
    return out


def upward_trend(r: dict[str, np.ndarray], window: Window,
                 num_batches: int = NUM_BATCHES) -> float:
    """Mann-Kendall's one-sided p-value of an upward trend in the window's waiting times."""
    order = np.argsort(r["arrival_s"], kind="stable")
    inside = window.holds(r["arrival_s"][order]) & r["finished"][order]
    waits = r["queue_s"][order][inside]
    return mann_kendall(batch_means(waits, _num_batches(waits.size, num_batches))).p_value


def steady_summary(r: dict[str, np.ndarray], itl: ITLSlices | None, slo: SLO | None,
                   num_batches: int = NUM_BATCHES) -> dict[str, Any]:
    """summary.json's `window`, `ci95` (batch means) and `sustained` from one run."""
    leave_s = np.where(r["finished"], r["finish_s"], r["arrival_s"])
    window = measurement_window(r["arrival_s"], r["e2el_s"], leave_s)
    if not window.kept >= 2 or not window.duration_s > 0:
        return {"window": _window_dict(window, math.nan), "ci95": {}, "sustained": False,
                "sustained_checks": {"reason": "fewer than two requests in the window"}}
    offered = (window.kept - 1) / window.duration_s
    intervals = window_intervals(r, window, itl, slo, num_batches)
    p_trend = upward_trend(r, window, num_batches)
    return {"window": _window_dict(window, offered),
            "ci95": {"method": "batch means", **{k: v.as_dict() for k, v in intervals.items()}},
            **sustained_block(intervals["request_throughput"].hi, offered, [p_trend])}


def _window_dict(window: Window, offered: float) -> dict[str, Any]:
    return {"start_s": window.start_s, "end_s": window.end_s,
            "excluded_start": window.excluded_start, "excluded_end": window.excluded_end,
            "requests": window.kept, "offered_rate": offered,
            "rule": "MSER-5 on E2E latency and on the number in the system at arrival, "
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
