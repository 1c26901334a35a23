"""The TTFT diagnosis in plain words: `servesim explain RUN_DIR`.

sim.observe.diagnose splits each request's TTFT into parts that sum to it;
this module reads those columns back from requests.csv and says, for a
request or a whole run, which part dominated and why, in the terms of the
batching policy that ran (request-level batching waits for batches,
continuous batching for step budgets and KV blocks).
"""

from __future__ import annotations

import pandas as pd

from sim.observe.diagnose import TTFT_PARTS
from sim.observe.run_files import DiagnosisError

PART_LABELS = {
    "ttft_queue_ms": "queueing for admission",
    "ttft_batch_fill_ms": "waiting for a batch to fill",
    "ttft_kv_wait_ms": "waiting for KV blocks",
    "ttft_prefill_ms": "its own prefill compute",
    "ttft_shared_ms": "others' work in its steps",
    "ttft_preempt_ms": "preemption + recompute",
    "ttft_frontend_ms": "API server, tokenizer, output lag and stream",
}
REQUEST_LEVEL = ("static", "dynamic")


def dominant_cause(row: pd.Series) -> str:
    """The TTFT part (a TTFT_PARTS name) that took the most time."""
    return max(TTFT_PARTS, key=lambda name: float(row[name]))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def cause_sentence(row: pd.Series, cause: str, policy: str) -> str:
    """One sentence naming `cause` for this request, with its size and share of the TTFT."""
    ms = float(row[cause])
    ttft = float(row["ttft_ms"])
    share = f"{ms:.1f} ms ({100 * ms / ttft:.0f}% of its TTFT)" if ttft > 0 else f"{ms:.1f} ms"
    ahead, running = int(row["queue_ahead"]), int(row["running_at_arrival"])
    steps = int(row["prefill_steps"])
    others = float(row["mean_others_in_prefill"])
    batching = policy in REQUEST_LEVEL
    if cause == "ttft_queue_ms" and batching:
        return (f"waited {share} for the running batch to finish, with "
                f"{_plural(ahead, 'request')} queued ahead of it: {policy} batching admits "
                "requests only between batches")
    if cause == "ttft_queue_ms":
        return (f"waited {share} in the queue behind {_plural(ahead, 'request')} while "
                f"{running} ran: admission happens between steps, and each step's token "
                "budget and batch seats go to running and earlier requests first")
    if cause == "ttft_batch_fill_ms":
        trigger = ("or its oldest request has waited max_wait" if policy == "dynamic"
                   else "or arrivals end")
        return (f"waited {share} with the server idle for its batch to fill: {policy} "
                f"batching launches a batch only when it is full {trigger}")
    if cause == "ttft_kv_wait_ms":
        return (f"waited {share} for free KV-cache blocks: admission stopped because the KV "
                f"cache was full ({_plural(ahead, 'request')} queued ahead of it)")
    if cause == "ttft_prefill_ms":
        computed = int(row["prompt_tokens"]) - int(row["prefix_hit_tokens"])
        return (f"spent {share} computing its own prompt: {computed} uncached tokens in "
                f"{_plural(steps, 'step')}")
    if cause == "ttft_shared_ms" and batching:
        return (f"spent {share} on the rest of its batch's prefill: about {others:.0f} other "
                "prompts computed in the same step, padded to the longest")
    if cause == "ttft_shared_ms":
        return (f"spent {share} on other sequences' work in its {_plural(steps, 'prefill step')}"
                f" (about {others:.0f} others per step): chunked prefill interleaves its prompt "
                "with their decodes and prefills")
    return (f"lost {share} to preemption ({_plural(int(row['preemptions']), 'time')} in all): "
            "waiting to be re-admitted, then recomputing whatever KV was dropped")


def explain_request(row: pd.Series, policy: str = "continuous") -> str:
    """The dominant cause in plain words, then every part of the TTFT (ms and share)."""
    ttft = float(row["ttft_ms"])
    lines = [f"request {int(row['request_id'])}: TTFT {ttft:.1f} ms (prompt "
             f"{int(row['prompt_tokens'])} tokens, {int(row['prefix_hit_tokens'])} from the "
             f"prefix cache; {int(row['output_tokens'])} output tokens)",
             f"  request {int(row['request_id'])} "
             f"{cause_sentence(row, dominant_cause(row), policy)}."]
    for name in TTFT_PARTS:
        ms = float(row[name])
        pct = 100 * ms / ttft if ttft > 0 else 0.0
        lines.append(f"    {PART_LABELS[name]:<30} {ms:10.1f} ms {pct:6.1f}%")
    lines.append(f"    {'prefix cache saved (not summed)':<30} "
                 f"{float(row['prefix_saved_ms']):10.1f} ms")
    return "\n".join(lines)


def run_breakdown(frame: pd.DataFrame) -> pd.Series:
    """Share of all finished requests' TTFT that each part took (sums to 1)."""
    done = frame.dropna(subset=["ttft_ms", *TTFT_PARTS])
    total = float(done["ttft_ms"].sum())
    return pd.Series({name: float(done[name].sum()) / total if total > 0 else 0.0
                      for name in TTFT_PARTS})


def explain_run(frame: pd.DataFrame, policy: str = "continuous", slowest: int = 3,
                request_id: int | None = None, p99_ttft_ms: float | None = None) -> str:
    """`request_id`'s explanation, or the run's TTFT breakdown and its `slowest` requests.

    `p99_ttft_ms` is the run's own figure (summary.json): `servesim run` estimates a
    client's percentile as the engine's plus the front end at the mean prompt, so
    explain prints that one rather than a second estimate from the rows that disagrees
    in the last digits; without it the rows' own 99th percentile is shown.
    """
    missing = [c for c in TTFT_PARTS if c not in frame.columns]
    if missing:
        raise DiagnosisError(f"requests have no TTFT diagnosis columns ({', '.join(missing)}); "
                             "re-run the scenario with this version of servesim")
    done = frame[frame["status"] == "finished"].dropna(subset=list(TTFT_PARTS))
    if request_id is not None:
        match = frame[frame["request_id"] == request_id]
        if match.empty:
            raise DiagnosisError(f"--request: no request {request_id} in this run (ids "
                                 f"{int(frame['request_id'].min())}.."
                                 f"{int(frame['request_id'].max())})")
        if match.iloc[0]["status"] != "finished":
            raise DiagnosisError(f"--request: request {request_id} was rejected "
                                 f"({match.iloc[0]['rejection_reason']}): it has no TTFT")
        return explain_request(match.iloc[0], policy)
    if slowest < 1:
        raise DiagnosisError(f"--slowest: must be >= 1, got {slowest}")
    if done.empty:
        return "no finished requests: nothing to explain"
    shares = run_breakdown(done)
    p99 = float(done["ttft_ms"].quantile(0.99)) if p99_ttft_ms is None else p99_ttft_ms
    parts = ", ".join(f"{PART_LABELS[n]} {100 * s:.0f}%" for n, s in
                      shares.sort_values(ascending=False).items() if s >= 0.005)
    head = (f"{len(done)} finished requests, {policy} batching: mean TTFT "
            f"{done['ttft_ms'].mean():.1f} ms, p99 {p99:.1f} ms; "
            f"the TTFT went to {parts}")
    worst = done.nlargest(slowest, "ttft_ms")
    return "\n\n".join([head, *(explain_request(row, policy) for _, row in worst.iterrows())])
