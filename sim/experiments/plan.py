"""`servesim plan`: the cheapest deployment (GPU type x tensor parallelism x replicas) that
sustains a rate within the SLOs.

Capacity math prunes, simulation decides. For every GPU type and TP degree:
- it must fit: the degree must split the model's heads, and the weights plus
  activations must leave KV room for one longest request (sim.config.costs);
- a replica's rate is bounded above by two floors that no step can beat: its
  decode steps at the largest batch that fits cannot be faster than reading
  the weights and that batch's KV from HBM once a step, and its GPUs cannot
  exceed their peak FLOP/s on the request's prefill and decode FLOPs. Fewer
  replicas than target / bound can never sustain the rate and are not run.

Then a fleet of r replicas (from that least r up) is simulated at the target
rate, all candidates in parallel, one replica count per candidate per round,
until it is sustained with the SLO percentile (p99 by default) of TTFT and
TPOT within the bounds over the measurement window, or `max_replicas`. The
answer is the cheapest passing configuration (GPU count, or $/hour with
prices), ties broken by the lower p99 TTFT, with its intervals.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sim.config.costs import (
    activation_reserve_bytes,
    decode_step_floor_s,
    flops_per_token,
    max_concurrency,
)
from sim.config.hardware import HardwareSpec
from sim.config.specs import ModelSpec, check_tp
from sim.results.stats.model_error import ModelErrorTable
from sim.results.stats.prediction import confident_upper

DEFAULT_TP = (1, 2, 4, 8)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One GPU type and TP degree, and what capacity math says of it."""

    gpu: str
    tp: int
    fits: bool
    reason: str | None  # why it does not fit
    bound_rps: float  # a replica's rate can never exceed this
    min_replicas: int  # the fewest replicas that could sustain the target


def replica_bound_rps(model: ModelSpec, hw: HardwareSpec, tp: int, mean_prompt: float,
                      mean_output: float, memory_utilization: float,
                      max_num_seqs: int, max_num_batched_tokens: int) -> float:
    """An upper bound on one replica's request rate (see the module docstring)."""
    context = max(int(mean_prompt + mean_output / 2), 1)
    reserve = activation_reserve_bytes(model, max_num_batched_tokens, max_num_seqs, tp)
    batch = min(max_concurrency(model, hw, context, tp, memory_utilization,
                                activation_reserve=reserve), max_num_seqs)
    if batch < 1:
        return 0.0
    decode_tokens_per_s = batch / decode_step_floor_s(model, hw, batch, context, tp)
    flops_per_request = (mean_prompt + mean_output) * flops_per_token(model, context, tp)
    return min(decode_tokens_per_s / max(mean_output, 1.0),
               hw.bf16_flops_per_s / flops_per_request)


def candidates(model: ModelSpec, gpus: Mapping[str, HardwareSpec], tps: Sequence[int],
               rate: float, longest_tokens: int, mean_prompt: float, mean_output: float,
               memory_utilization: float = 0.9,
               max_num_seqs: int = 256, max_num_batched_tokens: int = 8192
               ) -> list[Candidate]:
    """Every GPU x TP with whether it fits and the fewest replicas that could sustain `rate`."""
    out = []
    for name, hw in gpus.items():
        for tp in tps:
            try:
                check_tp(model, tp)
            except ValueError as err:
                out.append(Candidate(name, tp, False, str(err), 0.0, 0))
                continue
            reserve = activation_reserve_bytes(model, max_num_batched_tokens, max_num_seqs, tp)
            room = max_concurrency(model, hw, longest_tokens, tp, memory_utilization,
                                   activation_reserve=reserve)
            if room < 1:
                out.append(Candidate(name, tp, False, f"no KV room for one {longest_tokens}-"
                                     "token request beside the weights", 0.0, 0))
                continue
            bound = replica_bound_rps(model, hw, tp, mean_prompt, mean_output,
                                      memory_utilization, max_num_seqs,
                                      max_num_batched_tokens)
            out.append(Candidate(name, tp, True, None, bound, max(1, math.ceil(rate / bound))))
    return out


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a simulated fleet passes, from its summary's window and intervals; `hopeless`:
    no replica count can pass (the candidate lies outside what the model error covers)."""

    passes: bool
    why: str
    hopeless: bool = False


def judge(summary: Mapping[str, Any], ttft_ms: float | None, tpot_ms: float | None,
          percentile: str = "p99") -> Verdict:
    """Sustained, and the window's percentile of TTFT and TPOT within the bounds."""
    if not summary.get("sustained"):
        return Verdict(False, "not sustained")
    ci = summary.get("ci95") or {}
    for metric, bound in (("ttft", ttft_ms), ("tpot", tpot_ms)):
        if bound is None:
            continue
        value = (ci.get(f"{percentile}_{metric}_ms") or {}).get("estimate")
        if value is None or value > bound:
            shown = "n/a" if value is None else f"{value:.4g}"
            return Verdict(False, f"{percentile} {metric.upper()} {shown} ms > {bound:g} ms")
    return Verdict(True, "sustained within the SLOs")


def judge_confident(summary: Mapping[str, Any], ttft_ms: float | None, tpot_ms: float | None,
                    percentile: str, confidence: float, table: ModelErrorTable) -> Verdict:
    """Sustained, and the real server's percentile of TTFT and TPOT within the bounds with
    probability `confidence`: the one-sided upper bound of noise and model error together
    (sim.results.stats.prediction). Outside the validated domain it cannot pass."""
    if not summary.get("sustained"):
        return Verdict(False, "not sustained")
    for metric, bound in (("ttft", ttft_ms), ("tpot", tpot_ms)):
        if bound is None:
            continue
        value, why = confident_upper(summary, f"{percentile}_{metric}_ms", confidence, table)
        if value is None:
            return Verdict(False, why, hopeless=why.startswith("not validated"))
        if value > bound:
            return Verdict(False, f"{percentile} {metric.upper()} at {confidence:.0%} "
                           f"confidence {value:.4g} ms > {bound:g} ms")
    return Verdict(True, f"within the SLOs at {confidence:.0%} confidence")


def cost_of(gpu: str, gpus: int, prices: Mapping[str, float]) -> float:
    """GPU count, or $/hour when every GPU type has a price."""
    return gpus * prices[gpu] if prices else float(gpus)


@dataclass(slots=True)
class Search:
    """Replica counts to try per candidate, one per round, upward from the capacity bound."""

    open: dict[tuple[str, int], int]  # (gpu, tp) -> the next replica count to simulate
    max_replicas: int
    tried: dict[tuple[str, int, int], dict[str, Any]] = field(default_factory=dict)
    answer: dict[tuple[str, int], int] = field(default_factory=dict)  # least passing r
    point: dict[tuple[str, int], int] = field(default_factory=dict)  # least r, point estimate
    hopeless: dict[tuple[str, int], str] = field(default_factory=dict)  # can never pass: why

    def round(self) -> list[tuple[str, int, int]]:
        return [(g, tp, r) for (g, tp), r in self.open.items() if r <= self.max_replicas]

    def record(self, gpu: str, tp: int, replicas: int, row: dict[str, Any],
               passed: bool, point_passed: bool | None = None, hopeless: bool = False
               ) -> None:
        """`passed` the verdict searched for; `point_passed` the point estimate's (a
        confident search goes on past it; None: the same as `passed`); `hopeless`: no count
        can pass, so the candidate closes once the point answer is known."""
        self.tried[(gpu, tp, replicas)] = row
        key = (gpu, tp)
        if (passed if point_passed is None else point_passed) and key not in self.point:
            self.point[key] = replicas
        if hopeless:
            self.hopeless[key] = str(row.get("why", ""))
        if passed or (hopeless and key in self.point):
            if passed:
                self.answer[key] = replicas
            del self.open[key]
        else:  # the shortfall says how far to jump: achieved / target of a saturated fleet
            ratio = row.get("shortfall", 1.0)
            step = max(1, math.ceil(replicas * (1 / ratio - 1))) if 0 < ratio < 1 else 1
            self.open[(gpu, tp)] = replicas + min(step, max(1, replicas))
