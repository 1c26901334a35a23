"""`/metrics`: what the server knows, as Prometheus text under vLLM's metric names.

Why vLLM's names: gateways, routers and autoscalers that scrape a vLLM server
(num_requests_waiting for load, kv_cache_usage_perc for KV-aware routing) can
scrape servesim unchanged. Latencies are on the server's clock: a token's time
is the end of the step that emitted it, the time its chunk is released.
Histogram buckets are vLLM's.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from sim.core.plan import StepPlan
from sim.core.request import Request

TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                  5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


@dataclass(slots=True)
class Histogram:
    """Cumulative buckets, sum and count, as Prometheus reads them."""

    bounds_s: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    sum_s: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.bounds_s)

    def observe(self, value_s: float) -> None:
        i = bisect.bisect_left(self.bounds_s, value_s)
        if i < len(self.counts):
            self.counts[i] += 1
        self.sum_s += value_s
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out, running = [], 0
        for bound, n in zip(self.bounds_s, self.counts, strict=True):
            running += n
            out.append(f'{name}_bucket{{{labels},le="{bound}"}} {running}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}')
        out.append(f"{name}_sum{{{labels}}} {self.sum_s}")
        out.append(f"{name}_count{{{labels}}} {self.count}")
        return out


@dataclass(slots=True)
class ServeMetrics:
    """Counters and histograms the loop updates; gauges are read from the scheduler at scrape."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    finished: int = 0
    aborted: int = 0
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS_S))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS_S))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS_S))
    _last_token_s: dict[int, float] = field(default_factory=dict)

    def on_step(self, plan: StepPlan) -> None:
        self.preemptions += len(plan.preempted_ids)

    def on_token(self, request_id: int, time_s: float, arrival_s: float, first: bool) -> None:
        self.generation_tokens += 1
        if first:
            self.ttft.observe(time_s - arrival_s)
        else:
            self.itl.observe(time_s - self._last_token_s.get(request_id, time_s))
        self._last_token_s[request_id] = time_s

    def on_aborted(self, request_id: int) -> None:
        self._last_token_s.pop(request_id, None)
        self.aborted += 1

    def on_finished(self, request: Request) -> None:
        self._last_token_s.pop(request.request_id, None)
        self.finished += 1
        self.prompt_tokens += request.prompt_tokens
        self.prefix_queries += request.prompt_tokens
        self.prefix_hits += request.prefix_hit_tokens
        if request.finish_s is not None:
            self.e2e.observe(request.finish_s - request.arrival_s)

    def text(self, model: str, running: int, waiting: int, kv_usage: float) -> str:
        """The exposition text (format 0.0.4)."""
        labels = f'model_name="{model}"'
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, value: float) -> None:
            lines.extend((f"# HELP {name} {help_text}", f"# TYPE {name} {kind}",
                          f"{name}{{{labels}}} {value}"))

        metric("vllm:num_requests_running", "gauge", "Requests in model execution batches.",
               running)
        metric("vllm:num_requests_waiting", "gauge", "Requests waiting to be processed.", waiting)
        metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
               kv_usage)
        metric("vllm:gpu_cache_usage_perc", "gauge", "GPU KV-cache usage (the older name).",
               kv_usage)
        metric("vllm:num_preemptions_total", "counter", "Cumulative preemptions.",
               self.preemptions)
        metric("vllm:prompt_tokens_total", "counter", "Prefill tokens processed.",
               self.prompt_tokens)
        metric("vllm:generation_tokens_total", "counter", "Generation tokens processed.",
               self.generation_tokens)
        metric("vllm:prefix_cache_queries_total", "counter",
               "Prefix-cache queries, in tokens.", self.prefix_queries)
        metric("vllm:prefix_cache_hits_total", "counter", "Prefix-cache hits, in tokens.",
               self.prefix_hits)
        lines.extend(("# HELP vllm:request_success_total Finished requests.",
                      "# TYPE vllm:request_success_total counter",
                      f'vllm:request_success_total{{{labels},finished_reason="length"}} '
                      f"{self.finished}",
                      f'vllm:request_success_total{{{labels},finished_reason="abort"}} '
                      f"{self.aborted}"))
        for name, hist, help_text in (
                ("vllm:time_to_first_token_seconds", self.ttft, "Time to first token."),
                ("vllm:inter_token_latency_seconds", self.itl, "Inter-token latency."),
                ("vllm:time_per_output_token_seconds", self.itl,
                 "Time per output token (the inter-token gaps)."),
                ("vllm:e2e_request_latency_seconds", self.e2e, "End-to-end request latency.")):
            lines.extend((f"# HELP {name} {help_text}", f"# TYPE {name} histogram"))
            lines.extend(hist.lines(name, labels))
        return "\n".join(lines) + "\n"
