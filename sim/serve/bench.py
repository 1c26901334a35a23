"""`servesim load`'s result in vLLM bench's JSON format (`vllm bench serve --save-result`).

Why: users already plot and compare vLLM benchmark files with their own
tools; a load run written the same way drops into them. The keys, their units
and their formulas are vllm.benchmarks.serve's (0.32): TTFT, TPOT = (E2EL -
TTFT) / (output - 1) over requests with more than one token, ITL every gap,
E2EL; mean, median, std and the selected percentiles in ms (numpy's linear
percentiles); throughputs over the whole run's duration; peak output tokens
in any whole second and peak requests in flight in any second. Only the
fields that vLLM keeps without `--save-detailed` are written, plus
`servesim_*` fields saying what produced the file.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import numpy as np

from sim.serve.load import Measured

DEFAULT_PERCENTILES = (99.0,)
METRICS = ("ttft", "tpot", "itl", "e2el")


def _ttft_s(m: Measured) -> float:
    return m.chunk_s[0] - m.send_s


def _stats(name: str, values_s: Sequence[float], percentiles: Sequence[float]
           ) -> dict[str, float]:
    """vLLM's mean/median/std/pNN in ms (0 when there is no value, as vLLM writes)."""
    values = np.asarray(values_s if len(values_s) else [0.0], dtype=np.float64) * 1000
    out = {f"mean_{name}_ms": float(np.mean(values)),
           f"median_{name}_ms": float(np.median(values)),
           f"std_{name}_ms": float(np.std(values))}
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        out[f"p{word}_{name}_ms"] = float(np.percentile(values, p))
    return out


def _peaks(done: Sequence[Measured]) -> tuple[float, int]:
    """Most output tokens in one whole second, most requests in flight in one second."""
    if not done:
        return 0.0, 0
    start = min(m.send_s for m in done)
    seconds = int(math.ceil(max(m.finish_s for m in done) - start)) + 1
    tokens, flying = np.zeros(seconds), np.zeros(seconds)
    for m in done:
        for t in m.chunk_s:
            tokens[int(t - start)] += 1
        flying[int(m.send_s - start):int(m.finish_s - start) + 1] += 1
    return float(tokens.max()), int(flying.max())


def bench_result(measured: Sequence[Measured], model_id: str, tokenizer_id: str,
                 request_rate: float, max_concurrency: int | None, label: str | None = None,
                 percentiles: Sequence[float] = DEFAULT_PERCENTILES,
                 now: datetime | None = None) -> dict[str, Any]:
    """One run's vLLM bench result; `measured` in the order the requests were sent."""
    done = [m for m in measured if m.error is None and m.chunk_s]
    duration_s = max((m.finish_s for m in measured), default=0.0) or math.nan
    outputs = [m.usage_completion or len(m.chunk_s) for m in done]
    inputs = sum(m.usage_prompt or m.prompt_tokens for m in done)
    tpots = [(m.finish_s - m.chunk_s[0]) / (n - 1) for m, n in zip(done, outputs, strict=True)
             if n > 1]
    itls = [b - a for m in done for a, b in zip(m.chunk_s, m.chunk_s[1:], strict=False)]
    peak_tokens, peak_requests = _peaks(done)
    result: dict[str, Any] = {
        "date": (now or datetime.now()).strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "openai", "backend": "openai", "label": label,
        "model_id": model_id, "tokenizer_id": tokenizer_id, "num_prompts": len(measured),
        "request_rate": "inf" if math.isinf(request_rate) else request_rate,
        "burstiness": 1.0, "max_concurrency": max_concurrency,
        "duration": duration_s, "completed": len(done), "failed": len(measured) - len(done),
        "total_input_tokens": inputs, "total_output_tokens": sum(outputs),
        "request_throughput": len(done) / duration_s,
        "request_goodput": None,
        "output_throughput": sum(outputs) / duration_s,
        "total_token_throughput": (inputs + sum(outputs)) / duration_s,
        "latencies": [m.finish_s - m.send_s for m in measured],
        "queue_times": [m.send_s - m.due_s for m in measured],
        "max_output_tokens_per_s": peak_tokens, "max_concurrent_requests": peak_requests,
        "rtfx": 0.0,
    }
    for name, values in (("ttft", [_ttft_s(m) for m in done]), ("tpot", tpots),
                         ("itl", itls), ("e2el", [m.finish_s - m.send_s for m in done])):
        result.update(_stats(name, values, percentiles))
    result["servesim_version_note"] = "written by servesim load in vLLM bench serve's format"
    return result
