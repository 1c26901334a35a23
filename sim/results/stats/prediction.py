"""Prediction intervals: where a real server's figure should fall, noise and model error together.

A run's `ci95` says where the simulator's own figure would settle with more
simulation; it says nothing of how far the simulator is from a real server.
The model error (sim.results.stats.model_error: a normal law on ln(predicted /
true) per metric, fitted on held-out real runs) says that. They add on the log
scale: the truth is estimate x exp(-bias +- q x sqrt(scale_model^2 + se_noise^2)),
se_noise the ci95's standard error relative to the estimate (delta method), q
Student's t on the smaller of the two parts' degrees of freedom (conservative:
Welch-Satterthwaite's pooled degrees would make the interval narrower than a
noisy run's own ci95 when the model error is small).

Outside what the validation runs cover (VALIDATED_* below; docs/uncertainty.md)
there is no interval: the block says "not validated" and why, never a number
that would pretend. A run the simulator calls unsustained gets none either.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from sim.results.stats.model_error import MetricError, ModelErrorTable, Residual
from sim.results.stats.student_t import t_ppf

LEVEL = 0.95
VALIDATED_GPUS = ("h100-sxm",)
VALIDATED_POLICIES = ("continuous",)
VALIDATED_LATENCY_MODELS = ("roofline",)
MAX_CONTEXT_TOKENS = 4096  # mean prompt + output; the runs' requests are ~820 tokens
METHOD = ("log scale: estimate x exp(-bias +- t x sqrt(model_scale^2 + noise_se^2)), noise_se "
          "= ci95 standard error / estimate, t on the smaller of the two degrees of freedom")
# a summary figure -> the measured metric whose law it takes, and whether that law is the
# same statistic (False) or the nearest one measured (True: a proxy)
COUNTERPART: Mapping[str, tuple[str, bool]] = {
    "mean_ttft_ms": ("ttft_mean", False), "median_ttft_ms": ("ttft_p50", False),
    "p90_ttft_ms": ("ttft_p99", True), "p99_ttft_ms": ("ttft_p99", False),
    "mean_tpot_ms": ("tpot", False), "median_tpot_ms": ("tpot", True),
    "p90_tpot_ms": ("tpot", True), "p99_tpot_ms": ("tpot", True), "mean_itl_ms": ("tpot", True),
    "mean_e2el_ms": ("e2e_mean", False), "median_e2el_ms": ("e2e_p50", False),
    "p90_e2el_ms": ("e2e_mean", True), "p99_e2el_ms": ("e2e_mean", True),
    "request_throughput": ("output_tok_s", True),
}


@dataclass(frozen=True, slots=True)
class Domain:
    """What of a scenario decides whether the validation runs speak for it."""

    gpu: str
    tp: int
    occupancy: float  # mean running batch / max_num_seqs (the load regime)
    expert_parallel: int = 1
    data_parallel: int = 1
    disaggregated: bool = False  # prefill/decode pools
    speculative_tokens: int = 0
    mean_context_tokens: float = 0.0
    scheduler_policy: str = "continuous"
    latency_model: str = "roofline"
    sustained: bool = True


def outside(d: Domain) -> list[str]:
    """Why the validation runs do not cover `d` (empty: they do)."""
    reasons = []
    if d.gpu not in VALIDATED_GPUS:
        reasons.append(f"GPU {d.gpu} (validated on {', '.join(VALIDATED_GPUS)} only)")
    if d.expert_parallel > 1:
        reasons.append("expert parallelism (MoE validated under tensor parallel only)")
    if d.data_parallel > 1:
        reasons.append("data-parallel ranks")
    if d.disaggregated:
        reasons.append("prefill/decode disaggregation")
    if d.speculative_tokens:
        reasons.append("speculative decoding")
    if d.mean_context_tokens > MAX_CONTEXT_TOKENS:
        reasons.append(f"mean context {d.mean_context_tokens:.0f} tokens > "
                       f"{MAX_CONTEXT_TOKENS}")
    if d.scheduler_policy not in VALIDATED_POLICIES:
        reasons.append(f"scheduler {d.scheduler_policy}")
    if d.latency_model not in VALIDATED_LATENCY_MODELS:
        reasons.append(f"latency model {d.latency_model} (validated: roofline)")
    if not d.sustained:
        reasons.append("the simulated run is not sustained (its figures are transient)")
    return reasons


def _combined(estimate: float, half_width: float, n: int, law: MetricError, d: Domain
              ) -> tuple[float, float, float] | None:
    """(bias, total log scale, dof), or None where the noise is unknown."""
    if not (estimate > 0 and math.isfinite(half_width)) or n < 2:
        return None
    noise_se = half_width / t_ppf(0.5 + LEVEL / 2, n - 1) / estimate
    bias, model_scale = law.law(d.tp, d.occupancy)
    var_m, var_n = model_scale ** 2, noise_se ** 2
    return bias, math.sqrt(var_m + var_n), min(law.dof, n - 1)


def interval(estimate: float, half_width: float, n: int, law: MetricError, d: Domain,
             level: float = LEVEL) -> tuple[float, float] | None:
    """The two-sided `level` prediction interval of the true figure (None: unknown noise)."""
    c = _combined(estimate, half_width, n, law, d)
    if c is None:
        return None
    bias, scale, dof = c
    q = t_ppf(0.5 + level / 2, dof) * scale
    return estimate * math.exp(-bias - q), estimate * math.exp(-bias + q)


def upper(estimate: float, half_width: float, n: int, law: MetricError, d: Domain,
          confidence: float) -> float | None:
    """The value the true figure stays under with probability `confidence` (one-sided)."""
    c = _combined(estimate, half_width, n, law, d)
    if c is None:
        return None
    bias, scale, dof = c
    return estimate * math.exp(-bias + t_ppf(confidence, dof) * scale)


def prediction_block(ci95: Mapping[str, Any], d: Domain, table: ModelErrorTable,
                     level: float = LEVEL) -> dict[str, Any]:
    """summary.json's `prediction_interval`: one entry per ci95 figure, with the method, the
    domain and why not validated where it is not (then lo and hi are None)."""
    reasons = outside(d)
    out: dict[str, Any] = {"level": level, "method": METHOD, "validated": not reasons,
                           "reasons": reasons, "domain": asdict(d),
                           "model_error": {"date": table.provenance.get("date"),
                                           "fit": table.provenance.get("fit"),
                                           "method": table.method}}
    for key, ci in ci95.items():
        if not isinstance(ci, Mapping):
            continue
        metric, proxy = COUNTERPART.get(key, (None, False))
        law = table.metrics.get(metric) if metric else None
        bounds = None
        if law is not None and not reasons:
            bounds = interval(_f(ci.get("estimate")), _f(ci.get("half_width")),
                              int(ci.get("n") or 0), law, d, level)
        out[key] = {"estimate": ci.get("estimate"),
                    "lo": None if bounds is None else bounds[0],
                    "hi": None if bounds is None else bounds[1],
                    "validated_by": metric if law is not None else None, "proxy": proxy}
    return out


def check_confidence(value: float | None, field: str) -> float | None:
    """The one check of a confidence, whether a compare spec's `confidence:` or `--confidence`
    states it (`field` names which): a one-sided probability in [0.5, 1). Below 0.5 the
    "upper bound" would sit under the estimate; 1 has no finite bound. ValueError otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.5 <= value < 1:
        raise ValueError(f"{field}: a probability in [0.5, 1), e.g. 0.95; got {value!r}")
    return float(value)


def confident_upper(summary: Mapping[str, Any], key: str, confidence: float,
                    table: ModelErrorTable) -> tuple[float | None, str]:
    """The `confidence` upper bound of a summary figure's true value, or None and why not."""
    block = summary.get("prediction_interval") or {}
    if not block:
        return None, "no prediction_interval in the summary"
    if not block.get("validated"):
        return None, "not validated: " + "; ".join(block.get("reasons") or [])
    metric = COUNTERPART.get(key, (None, False))[0]
    law = table.metrics.get(metric) if metric else None
    ci = (summary.get("ci95") or {}).get(key) or {}
    if law is None:
        return None, f"{key}: no model-error law"
    value = upper(_f(ci.get("estimate")), _f(ci.get("half_width")), int(ci.get("n") or 0),
                  law, Domain(**block["domain"]), confidence)
    return value, "" if value is not None else f"{key}: no noise estimate"


# an SLO bound -> the summary figure whose law scales it: attainment at the default 0.9
# threshold is decided near the 90th percentile of each latency
SLO_FIGURES = {"ttft_ms": "p90_ttft_ms", "tpot_ms": "p90_tpot_ms", "e2el_ms": "p90_e2el_ms"}


def slo_factor(table: ModelErrorTable, figure: str, confidence: float) -> float:
    """How much larger than simulated a real server's `figure` may be at `confidence`: the
    one-sided upper quantile of exp(-log error), the largest over the law's regimes (a
    search does not know its run's regime beforehand). NaN: no law for the figure."""
    metric = COUNTERPART.get(figure, (None, False))[0]
    law = table.metrics.get(metric) if metric else None
    if law is None:
        return math.nan
    q = t_ppf(confidence, law.dof)
    scale_of = {k: math.sqrt(law.scale_between ** 2 * (1 + 1 / r.models)
                             + law.scale_within ** 2) for k, r in law.regimes.items()}
    return max(math.exp(-r.mean_log + q * scale_of[k]) for k, r in law.regimes.items())


def tightened_slo(slo: Mapping[str, float | None], confidence: float, table: ModelErrorTable
                  ) -> dict[str, float | None]:
    """SLO bounds divided by their figure's `slo_factor`: a run whose requests meet these
    meets the given ones on a real server with probability `confidence` (a common
    multiplicative error scales every request's latency alike)."""
    return {k: (None if v is None else v / slo_factor(table, SLO_FIGURES[k], confidence))
            for k, v in slo.items() if k in SLO_FIGURES}


def coverage_of(law: MetricError | None, r: Residual, metric: str, level: float
                ) -> bool | None:
    """Whether `law`'s `level` interval, around the simulator's prediction for held-out stage
    `r`, holds the measured value: |ln(pred/measured) - bias| <= t x scale. The real runs
    have no simulation noise to add (a fixed workload: every seed gives the same figures).
    None where no interval is issued: the simulated run is unsustained (a transient), or
    there is no law (too few models)."""
    if law is None or not r.sustained:
        return None
    bias, scale = law.law(r.tp, r.occupancy)
    return abs(r.log_errors[metric] - bias) <= t_ppf(0.5 + level / 2, law.dof) * scale


def _f(value: Any) -> float:
    return math.nan if value is None else float(value)
