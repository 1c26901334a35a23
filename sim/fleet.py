"""Per-replica views of a fleet run: summary rows, replicas.csv, the load-balance plot.

The fleet summary (all requests pooled) stays the main one; these rows say
how the router spread the work. Per-replica throughputs divide by the
fleet's duration, not the replica's own span, so they add up to the fleet's
and an idle-at-the-end replica is not flattered by a short span.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from sim.metrics import RunRecorder

# copied from each replica's own summary, in this order (absent keys are skipped)
REPLICA_FIELDS = ("completed", "rejected", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                  "p99_tpot_ms", "total_input_tokens", "prefix_hit_rate", "prefill_tokens_saved",
                  "cache_evictions", "total_preemptions", "mean_batch_size",
                  "max_kv_blocks_used", "num_steps")


def replica_row(index: int, summary: dict[str, Any], fleet_duration_s: float,
                num_requests: int) -> dict[str, Any]:
    """One replica's row: its share of the requests and its own latency, batch and KV figures."""
    routed = summary["completed"] + summary["rejected"]
    row: dict[str, Any] = {"replica": index, "requests": routed,
                           "share": routed / num_requests if num_requests else math.nan}
    row.update({k: summary[k] for k in REPLICA_FIELDS if k in summary})
    ok = fleet_duration_s > 0
    row["request_throughput"] = summary["completed"] / fleet_duration_s if ok else math.nan
    row["output_throughput"] = (summary["total_output_tokens"] / fleet_duration_s if ok
                                else math.nan)
    return row


def replica_rows(summaries: Sequence[dict[str, Any]], fleet_summary: dict[str, Any]
                 ) -> list[dict[str, Any]]:
    """A row per replica from each replica's own summary, throughputs over the fleet's span."""
    total = fleet_summary["completed"] + fleet_summary["rejected"]
    return [replica_row(i, summary, fleet_summary["duration"], total)
            for i, summary in enumerate(summaries)]


def write_fleet_outputs(out_dir: Path, recorders: Sequence[RunRecorder],
                        rows: Sequence[dict[str, Any]], plots: bool = True) -> list[Path]:
    """replicas.csv and load_balance.png; nothing for a single replica (the run's files say it)."""
    if len(recorders) < 2:
        return []
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "replicas.csv"
    pd.DataFrame(list(rows)).to_csv(csv_path, index=False)
    written = [csv_path]
    if plots:
        from sim.plots import plot_load_balance  # lazy: matplotlib only when plotting

        series = [rec.steps_frame() for rec in recorders]
        written.append(plot_load_balance(series, out_dir / "load_balance.png"))
    return written

