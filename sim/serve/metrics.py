"""`/metrics`: what the server knows, as Prometheus text in vLLM v1's families.

Why vLLM's families, names, labels and buckets: gateways, routers, autoscalers
and dashboards that scrape a vLLM server (num_requests_waiting for load,
kv_cache_usage_perc for KV-aware routing, the latency histograms for SLOs)
scrape servesim unchanged. tests/test_serve_metrics.py diffs them against the
families vLLM 0.32's PrometheusStatLogger registers
(tests/fixtures/vllm_metric_families_0.32.0.json). Every series carries
`model_name` and `engine`, as vLLM's do.

When each is counted follows vLLM's stat loggers: prompt tokens and prefix-cache
lookups when a request's first token comes out; per-request histograms and
`request_success` when it finishes (length or stop). A request whose client
went away is not counted there: vLLM's frontend drops an aborted request's
state without recording it (output_processor.abort_requests), so only the
tokens it got (TTFT, inter-token gaps, generation tokens) are in the metrics.
Families that servesim has nothing for (multimodal, external KV transfer,
admission limits) are served at 0, as an idle vLLM serves them. Latencies are
on the server's clock: a token's time is the end of the step that emitted it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

from sim.core.plan import StepPlan
from sim.core.request import Request

TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                  5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                     60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
N_BUCKETS = (1, 2, 5, 10, 20)
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


def token_buckets(max_model_len: int) -> tuple[int, ...]:
    """vLLM's request-token buckets: 1, 2, 5, 10, 20, 50... up to the context."""
    out, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_model_len:
                return tuple(out)
            out.append(mantissa * scale)
        scale *= 10


@dataclass(slots=True)
class Histogram:
    """Cumulative buckets, sum and count, as Prometheus reads them."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.bounds, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out, running = [], 0
        for bound, n in zip(self.bounds, self.counts, strict=True):
            running += n
            out.append(f'{name}_bucket{{{labels},le="{float(bound)}"}} {running}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}')
        out.append(f"{name}_sum{{{labels}}} {float(self.total)}")
        out.append(f"{name}_count{{{labels}}} {self.count}")
        return out


def escape(value: object) -> str:
    """A label value as the exposition format quotes it."""
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@dataclass(frozen=True, slots=True)
class Gauges:
    """What a scrape reads from the scheduler and pool at that instant."""

    running: int
    waiting: int
    kv_usage: float
    cache_info: dict[str, str]  # vllm:cache_config_info's labels


def _hists(max_model_len: int) -> dict[str, Histogram]:
    tokens = token_buckets(max_model_len)
    return {
        "vllm:request_prompt_tokens": Histogram(tokens),
        "vllm:request_generation_tokens": Histogram(tokens),
        "vllm:iteration_tokens_total": Histogram(ITERATION_TOKEN_BUCKETS),
        "vllm:request_max_num_generation_tokens": Histogram(tokens),
        "vllm:request_params_n": Histogram(N_BUCKETS),
        "vllm:request_params_max_tokens": Histogram(tokens),
        "vllm:time_to_first_token_seconds": Histogram(TTFT_BUCKETS_S),
        "vllm:inter_token_latency_seconds": Histogram(ITL_BUCKETS_S),
        "vllm:request_time_per_output_token_seconds": Histogram(ITL_BUCKETS_S),
        "vllm:e2e_request_latency_seconds": Histogram(REQUEST_BUCKETS_S),
        "vllm:request_queue_time_seconds": Histogram(REQUEST_BUCKETS_S),
        "vllm:request_inference_time_seconds": Histogram(REQUEST_BUCKETS_S),
        "vllm:request_prefill_time_seconds": Histogram(REQUEST_BUCKETS_S),
        "vllm:request_decode_time_seconds": Histogram(REQUEST_BUCKETS_S),
        "vllm:request_num_preemptions": Histogram(PREEMPTION_BUCKETS),
        "vllm:request_prefill_kv_computed_tokens": Histogram(tokens),
    }


@dataclass(slots=True)
class ServeMetrics:
    """Counters and histograms the loop updates; gauges are read at scrape."""

    max_model_len: int = 8192
    engine: int = 0
    counters: dict[str, float] = field(default_factory=dict)
    success: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))
    hists: dict[str, Histogram] = field(default_factory=dict)
    _last_token_s: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.hists = _hists(self.max_model_len)

    def _add(self, name: str, amount: float) -> None:
        self.counters[name] = self.counters.get(name, 0) + amount

    def _observe(self, name: str, value: float) -> None:
        self.hists[name].observe(value)

    def on_step(self, plan: StepPlan, iteration_tokens: int) -> None:
        """One step: its preemptions, and the tokens it computed as vLLM counts them (whole
        prompts, less their cached part, of requests that got their first token, plus the
        tokens it emitted)."""
        self._add("vllm:num_preemptions", len(plan.preempted_ids))
        if iteration_tokens:
            self._observe("vllm:iteration_tokens_total", iteration_tokens)

    def on_token(self, request: Request, time_s: float, first: bool) -> None:
        rid = request.request_id
        self._add("vllm:generation_tokens", 1)
        if first:
            cached = request.prefix_hit_tokens
            self._observe("vllm:time_to_first_token_seconds", time_s - request.arrival_s)
            self._add("vllm:prompt_tokens", request.prompt_tokens)
            self._add("vllm:prefix_cache_queries", request.prompt_tokens)
            self._add("vllm:prefix_cache_hits", cached)
            self._add("vllm:prompt_tokens_cached", cached)
            self._add("local_compute", request.prompt_tokens - cached)
            self._add("local_cache_hit", cached)
        else:
            self._observe("vllm:inter_token_latency_seconds",
                          time_s - self._last_token_s.get(rid, time_s))
        self._last_token_s[rid] = time_s

    def on_ended(self, request_id: int) -> None:
        self._last_token_s.pop(request_id, None)

    def on_finished(self, request: Request, reason: str, generated: int,
                    max_tokens: int | None) -> None:
        """A request that finished (length or stop): vLLM's per-request histograms."""
        self.success[reason] += 1
        last_s = request.finish_s if request.finish_s is not None else request.arrival_s
        scheduled_s = request.first_scheduled_s if request.first_scheduled_s is not None \
            else request.arrival_s
        first_s = request.first_token_s if request.first_token_s is not None else last_s
        decode_s = last_s - first_s
        self._observe("vllm:e2e_request_latency_seconds", last_s - request.arrival_s)
        self._observe("vllm:request_queue_time_seconds", scheduled_s - request.arrival_s)
        self._observe("vllm:request_prefill_time_seconds", first_s - scheduled_s)
        self._observe("vllm:request_decode_time_seconds", decode_s)
        self._observe("vllm:request_inference_time_seconds", last_s - scheduled_s)
        self._observe("vllm:request_time_per_output_token_seconds",
                      decode_s / (generated - 1) if generated > 1 else 0.0)
        self._observe("vllm:request_num_preemptions", request.num_preemptions)
        self._observe("vllm:request_prefill_kv_computed_tokens",
                      request.prompt_tokens - max(request.prefix_hit_tokens, 0))
        self._observe("vllm:request_prompt_tokens", request.prompt_tokens)
        self._observe("vllm:request_generation_tokens", generated)
        self._observe("vllm:request_params_max_tokens",
                      max_tokens if max_tokens is not None else request.output_tokens)

    def on_parent_finished(self, n: int, max_generated: int) -> None:
        """The last of a request's n choices finished (vLLM's ParentRequest)."""
        self._observe("vllm:request_params_n", n)
        self._observe("vllm:request_max_num_generation_tokens", max_generated)

    def text(self, model: str, gauges: Gauges) -> str:
        """The exposition text (format 0.0.4)."""
        base = f'model_name="{escape(model)}",engine="{self.engine}"'
        lines: list[str] = []

        def family(name: str, kind: str, help_text: str,
                   samples: Iterable[tuple[str, float]]) -> None:
            lines.extend((f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"))
            suffix = "_total" if kind == "counter" else ""
            for extra, value in samples:
                lines.append(f"{name}{suffix}{{{base}{extra}}} {float(value)}")

        def counter(name: str, help_text: str) -> None:
            family(name, "counter", help_text, [("", self.counters.get(name, 0))])

        family("vllm:num_requests_running", "gauge", "Number of requests in model execution "
               "batches.", [("", gauges.running)])
        family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be "
               "processed.", [("", gauges.waiting)])
        family("vllm:num_requests_waiting_by_reason", "gauge", "Waiting requests by reason.",
               [(',reason="capacity"', gauges.waiting), (',reason="deferred"', 0)])
        family("vllm:engine_sleep_state", "gauge", "Engine sleep state (servesim never sleeps).",
               [(',sleep_state="awake"', 1), (',sleep_state="weights_offloaded"', 0),
                (',sleep_state="discard_all"', 0)])
        family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
               [("", gauges.kv_usage)])
        info = "".join(f',{k}="{escape(v)}"' for k, v in sorted(gauges.cache_info.items()))
        lines.extend(("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
                      "# TYPE vllm:cache_config_info gauge",
                      f'vllm:cache_config_info{{engine="{self.engine}"{info}}} 1.0'))
        for name, help_text in (
                ("vllm:prefix_cache_queries", "Prefix cache queries, in tokens."),
                ("vllm:prefix_cache_hits", "Prefix cache hits, in tokens."),
                ("vllm:external_prefix_cache_queries", "External prefix cache queries (none)."),
                ("vllm:external_prefix_cache_hits", "External prefix cache hits (none)."),
                ("vllm:mm_cache_queries", "Multi-modal cache queries (none)."),
                ("vllm:mm_cache_hits", "Multi-modal cache hits (none)."),
                ("vllm:num_preemptions", "Cumulative number of preemption from the engine."),
                ("vllm:prompt_tokens", "Number of prefill tokens processed."),
                ("vllm:prompt_tokens_cached", "Number of cached prompt tokens."),
                ("vllm:generation_tokens", "Number of generation tokens processed."),
                ("vllm:estimated_flops_per_gpu", "Estimated floating point operations per GPU "
                                                 "(not estimated by servesim: 0)."),
                ("vllm:estimated_read_bytes_per_gpu", "Estimated bytes read per GPU (0)."),
                ("vllm:estimated_write_bytes_per_gpu", "Estimated bytes written per GPU (0).")):
            counter(name, help_text)
        family("vllm:prompt_tokens_by_source", "counter", "Number of prompt tokens by source.",
               [(',source="local_compute"', self.counters.get("local_compute", 0)),
                (',source="local_cache_hit"', self.counters.get("local_cache_hit", 0)),
                (',source="external_kv_transfer"', 0)])
        family("vllm:prompt_tokens_cached_by_source", "counter", "Cached prompt tokens by "
               "source.", [(',source="device"', self.counters.get("local_cache_hit", 0))] +
               [(f',source="{s}"', 0) for s in ("host", "p2p", "disk", "external_unspecified")])
        family("vllm:request_success", "counter", "Count of successfully processed requests.",
               [(f',finished_reason="{r}"', self.success[r]) for r in FINISH_REASONS])
        lines.extend(("# HELP vllm:admission_rejections Admission attempts rejected by a queue "
                      "limit (servesim has none).", "# TYPE vllm:admission_rejections counter"))
        for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
            lines.append(f'vllm:admission_rejections_total{{model_name="{escape(model)}",'
                         f'reason="{reason}"}} 0.0')
        for name, hist in self.hists.items():
            lines.extend((f"# HELP {name} Histogram of {name[5:]}.", f"# TYPE {name} histogram"))
            lines.extend(hist.lines(name, base))
        return "\n".join(lines) + "\n"
