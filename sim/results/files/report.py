"""Plain-value views of a run summary: JSON-safe values and vLLM's terminal block.

Kept apart from the recorder so workers and reports can format summaries
without pulling in the recording machinery.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from sim.results.files.report_kv import kv_move_lines


def jsonable(value: Any) -> Any:
    """Plain JSON values: NaN/inf -> None, numpy scalars -> Python numbers."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def format_summary(summary: dict[str, Any]) -> str:
    """A terminal block in the shape of vLLM's 'Serving Benchmark Result'."""
    width = 50

    def row(label: str, key: str) -> str:
        value = summary.get(key)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            text = "n/a"
        elif isinstance(value, float):
            text = f"{value:.2f}"
        else:
            text = str(value)
        return f"{label:<38}{text:>12}"

    lines = [f"{' Serving Benchmark Result ':=^{width}}",
             row("Successful requests:", "completed"),
             row("Rejected requests:", "rejected"),
             row("Benchmark duration (s):", "duration"),
             row("Total input tokens:", "total_input_tokens"),
             row("Total generated tokens:", "total_output_tokens"),
             row("Request throughput (req/s):", "request_throughput")]
    if "request_goodput" in summary:
        lines.append(row("Request goodput (req/s):", "request_goodput"))
        lines.append(row("SLO attainment:", "slo_attainment"))
    lines += [row("Output token throughput (tok/s):", "output_throughput"),
              row("Total token throughput (tok/s):", "total_token_throughput")]
    sections = (("ttft", "TTFT", "Time to First Token"),
                ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
                ("itl", "ITL", "Inter-token Latency"),
                ("e2el", "E2EL", "End-to-end Latency"))
    transient = summary.get("sustained") is False
    for key, short, title in sections:
        lines.append(f"{' ' + title + (' (transient)' if transient else '') + ' ':-^{width}}")
        for stat, label in (("mean", "Mean"), ("median", "Median"), ("p99", "P99")):
            lines.append(row(f"{label} {short} (ms):", f"{stat}_{key}_ms"))
    if summary.get("prefix_caching"):
        lines.append(f"{' Prefix cache ':-^{width}}")
        lines += [row("Prefix hit rate:", "prefix_hit_rate"),
                  row("Prefill tokens saved:", "prefill_tokens_saved"),
                  row("Cache evictions:", "cache_evictions")]
    if "spec_acceptance_rate" in summary:
        lines.append(f"{' Speculative decoding ':-^{width}}")
        lines += [row("Draft tokens per step (k):", "speculative_tokens"),
                  row("Draft acceptance rate:", "spec_acceptance_rate"),
                  row("Mean tokens per drafting step:", "mean_tokens_per_spec_step"),
                  row("Mean tokens per decode step:", "mean_tokens_per_seq_step")]
    if summary.get("total_preemptions"):
        lines.append(f"{' Preemption ':-^{width}}")
        lines += [row("Preemptions:", "total_preemptions"),
                  row("Recomputed tokens:", "recomputed_tokens"),
                  row("Swapped out (bytes):", "swapped_out_bytes"),
                  row("Swapped in (bytes):", "swapped_in_bytes")]
    if "slot_utilization" in summary:
        lines.append(f"{' Batching waste ':-^{width}}")
        lines += [row("Slot utilisation:", "slot_utilization"),
                  row("KV waste (share of pool):", "kv_waste_fraction"),
                  row("KV waste (share of held):", "kv_waste_of_held")]
    lines += _prediction_lines(summary.get("prediction_interval") or {}, width)
    lines += _replica_lines(summary.get("replicas") or (), width)
    lines += kv_move_lines(summary, width)
    lines.append("=" * width)
    if "window" in summary:
        lines.append(window_line(summary))
    return "\n".join(lines)


def window_line(summary: dict[str, Any]) -> str:
    """The measurement window and the sustained verdict in one line."""
    w = summary["window"]
    ci = summary.get("ci95", {}).get("request_throughput")
    rate = (f"; achieved {ci['estimate']:.2f} [{ci['lo']:.2f}, {ci['hi']:.2f}] of "
            f"{w['offered_rate']:.2f} req/s offered" if ci and ci.get("lo") is not None
            and w.get("offered_rate") is not None else "")
    reps = summary.get("ci95", {}).get("replications")
    rate += f" (interval over {reps} replications)" if reps else ""
    if rate and w.get("rates_end_s") is not None:  # it fell behind: the whole run's rates
        rate += (f" (achieved over {w['rates_start_s']:.1f}-{w['rates_end_s']:.1f} s, the "
                 "whole run: it fell behind)")
    verdict = "sustained" if summary.get("sustained") else "NOT sustained (figures transient)"
    start, end = w.get("start_s"), w.get("end_s")
    span = f"{start:.1f}-{end:.1f} s" if start is not None and end is not None else "n/a"
    return (f"Window {span}: {w['requests']} requests, cut {w['excluded_start']} warm-up and "
            f"{w['excluded_end']} at the end (MSER){rate}; {verdict}")


# the SLO metrics whose prediction interval the terminal block prints
PREDICTED_ROWS = (("Median TTFT (ms):", "median_ttft_ms"), ("P99 TTFT (ms):", "p99_ttft_ms"),
                  ("Mean TPOT (ms):", "mean_tpot_ms"), ("P99 TPOT (ms):", "p99_tpot_ms"),
                  ("Median E2EL (ms):", "median_e2el_ms"), ("P99 E2EL (ms):", "p99_e2el_ms"))


def _prediction_lines(block: dict[str, Any], width: int) -> list[str]:
    """A real server's SLO figures, noise and model error combined (docs/uncertainty.md);
    outside the validated domain, why there is none."""
    if not block:
        return []
    level = f"{100 * block.get('level', 0.95):.0f}%"
    lines = [f"{' Real server, ' + level + ' prediction interval ':-^{width}}"]
    if not block.get("validated"):
        reasons = "; ".join(block.get("reasons") or [])
        return [*lines, f"not validated: {reasons}"]
    for label, key in PREDICTED_ROWS:
        entry = block.get(key) or {}
        lo, hi = entry.get("lo"), entry.get("hi")
        text = "n/a" if lo is None or hi is None else f"[{lo:.1f}, {hi:.1f}]"
        lines.append(f"{label:<28}{text:>22}")
    return lines


def _replica_lines(rows: Any, width: int) -> list[str]:
    """A line per replica of a fleet (none for one replica): how the router spread the load."""
    if len(rows) < 2:
        return []

    def num(value: Any, spec: str) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "n/a"
        return format(value, spec)

    lines = [f"{' Per replica ':-^{width}}",
             f"{'#':>3} {'done':>6} {'req/s':>7} {'TTFT ms':>8} {'p99 TTFT':>9} {'TPOT ms':>8} "
             f"{'hit':>4}"]
    for r in rows:
        lines.append(f"{r['replica']:>3} {r['completed']:>6} "
                     f"{num(r.get('request_throughput'), '.2f'):>7} "
                     f"{num(r.get('mean_ttft_ms'), '.1f'):>8} "
                     f"{num(r.get('p99_ttft_ms'), '.1f'):>9} "
                     f"{num(r.get('mean_tpot_ms'), '.1f'):>8} "
                     f"{num(r.get('prefix_hit_rate'), '.0%'):>4}")
    return lines


def nothing_served(summary: Mapping[str, Any]) -> str | None:
    """Why no request finished, when none did, naming the commonest rejection reason:
    `run` exits 2 on it, and `sweep` and `compare` on any point of theirs (after writing
    their files), since such a point has no latency to report."""
    if summary.get("completed") != 0:
        return None
    reasons = summary.get("rejection_reasons") or {}
    rejected = summary.get("rejected", 0)
    if not reasons:
        return f"no request finished ({rejected} rejected)"
    reason, count = max(reasons.items(), key=lambda item: item[1])
    return (f"every request was rejected ({rejected}; {count} for: {reason}), so nothing "
            "was served: fix the workload or the limits")
