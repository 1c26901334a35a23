"""Running `servesim plan`: candidates from capacity math, fleets simulated round by round in
parallel (cached, so a killed plan resumes), the answer and its runners-up (sim.experiments.plan).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.config.catalogue import get_hardware
from sim.config.loader import apply_overrides, validate_scenario
from sim.config.scenario import Scenario
from sim.experiments.cache import PointCache
from sim.experiments.compare_spec import rate_overrides
from sim.experiments.plan import (
    DEFAULT_TP,
    Search,
    candidates,
    cost_of,
    judge,
    judge_confident,
)
from sim.experiments.plan_layouts import dp_layouts, layout_label
from sim.experiments.runner import Backend, SweepError, Task, open_backend
from sim.experiments.sweep import override
from sim.results.files.steady import window_columns
from sim.results.stats.model_error import ModelErrorTable
from sim.results.stats.prediction import confident_upper


@dataclass(frozen=True, slots=True)
class PlanQuestion:
    """What to plan for: the base scenario's model and workload at `rate`, within SLO bounds."""

    raw: dict[str, Any]  # the base scenario as read
    source: str
    base_dir: Path
    rate: float
    gpus: tuple[str, ...] = ("h100-sxm", "h200")
    tps: tuple[int, ...] = DEFAULT_TP
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    percentile: str = "p99"
    prices: tuple[tuple[str, float], ...] = ()
    max_replicas: int = 32
    requests: int = 2000
    trace_rate: float | None = None  # a timed trace's own rate (replayed faster or slower)
    confidence: float | None = None  # the SLO must hold at it under noise + model error
    dps: tuple[int, ...] = ()  # data-parallel degrees of MoE layouts (sim.experiments.plan_layouts)
    dp_batched_tokens: int | None = None  # a DP rank's step token budget (None: the base's)

    def scenario(self, gpu: str, tp: int, replicas: int, dp: int = 1) -> Scenario:
        """The base at `rate` on `replicas` x TP `tp`, or (dp > 1) one group of dp ranks of
        tp GPUs with the experts over all dp x tp."""
        sets = [override("hardware.gpu", gpu), override("hardware.count", dp * tp),
                override("replicas", replicas), override("workload.num_requests", self.requests),
                *rate_overrides(self.rate, self.trace_rate)]
        base_dp = (self.raw.get("hardware") or {}).get("data_parallel", 1)
        if dp > 1:
            sets += [override("hardware.data_parallel", dp),
                     override("hardware.expert_parallel", dp * tp)]
            if self.dp_batched_tokens is not None:
                sets.append(override("scheduler.max_num_batched_tokens",
                                     self.dp_batched_tokens))
        elif base_dp != 1:  # a DP base planned as pure TP
            sets += [override("hardware.data_parallel", 1),
                     override("hardware.expert_parallel", 1)]
        return validate_scenario(apply_overrides(copy.deepcopy(self.raw), sets), self.source)


@dataclass(frozen=True, slots=True)
class PlanResult:
    best: dict[str, Any] | None  # the cheapest passing configuration's row
    table: pd.DataFrame  # the least passing replica count per candidate (runners-up), by cost
    tried: pd.DataFrame  # every fleet simulated
    pruned: pd.DataFrame  # candidates capacity math ruled out, and why
    reused: int
    point_best: dict[str, Any] | None = None  # with a confidence: the point estimate's pick


def _workload_shape(q: PlanQuestion) -> tuple[float, float, int]:
    """Mean prompt and output tokens, and the longest request, of the planned stream."""
    from sim.workload import make_requests

    s = q.scenario(q.gpus[0], 1 if 1 in q.tps else q.tps[0], 1)
    prompt, output = [], []
    for r in make_requests(s.workload, s.seed, q.base_dir):
        prompt.append(r.prompt_tokens)
        output.append(r.output_tokens)
    p, o = np.array(prompt), np.array(output)
    return float(p.mean()), float(o.mean()), int((p + o).max())


def _row(q: PlanQuestion, gpu: str, tp: int, replicas: int, result: dict[str, Any],
         dp: int = 1) -> dict[str, Any]:
    verdict = point = judge(result, q.ttft_ms, q.tpot_ms, q.percentile)
    uppers: dict[str, float] = {}
    if q.confidence is not None:
        from sim.results.stats.model_error import load_description

        table = load_description()
        verdict = judge_confident(result, q.ttft_ms, q.tpot_ms, q.percentile, q.confidence,
                                  table)
        uppers = confident_columns(result, q.percentile, q.confidence, table)
    prices = dict(q.prices)
    gpus = dp * tp * replicas
    row: dict[str, Any] = {"gpu": gpu, "tp": tp, "dp": dp, "replicas": replicas,
                           "layout": layout_label(tp, dp, replicas), "gpus": gpus,
                           "cost": cost_of(gpu, gpus, prices), "passes": verdict.passes,
                           "why": verdict.why, "passes_point": point.passes,
                           "hopeless": verdict.hopeless}
    row.update(window_columns(result))
    for metric in ("ttft", "tpot"):
        ci = (result.get("ci95") or {}).get(f"{q.percentile}_{metric}_ms") or {}
        for part in ("estimate", "lo", "hi"):
            value = ci.get(part)
            row[f"{q.percentile}_{metric}_ms" + ("" if part == "estimate" else f"_{part}")] = (
                math.nan if value is None else value)
        if uppers:
            row[f"{q.percentile}_{metric}_ms_upper"] = uppers[metric]
    offered = row["window_offered_rate"]
    row["shortfall"] = row["window_throughput"] / offered if offered and offered > 0 else 1.0
    return row


def confident_columns(result: dict[str, Any], percentile: str, confidence: float,
                      table: ModelErrorTable) -> dict[str, float]:
    """The real server's TTFT and TPOT percentile that a fleet stays under with probability
    `confidence` (the bound judge_confident holds to the SLOs; NaN outside the validated
    domain), so a row shows why the confident pick differs from the point one."""
    out = {}
    for metric in ("ttft", "tpot"):
        value, _ = confident_upper(result, f"{percentile}_{metric}_ms", confidence, table)
        out[metric] = math.nan if value is None else value
    return out


def run_plan(q: PlanQuestion, backend: Backend | None = None, progress: bool = True,
             cache: PointCache | None = None) -> PlanResult:
    """Capacity math, then rounds of fleet simulations until every candidate passes or
    reaches max_replicas."""
    from tqdm import tqdm

    model = q.scenario(q.gpus[0], 1 if 1 in q.tps else q.tps[0], 1).model_spec
    base = q.scenario(q.gpus[0], 1 if 1 in q.tps else q.tps[0], 1)
    mean_prompt, mean_output, longest = _workload_shape(q)
    found = candidates(model, {g: get_hardware(g) for g in q.gpus}, q.tps, q.rate, longest,
                       mean_prompt, mean_output, base.hardware.memory_utilization,
                       base.scheduler.max_num_seqs, base.scheduler.max_num_batched_tokens)
    pruned = [{"gpu": c.gpu, "tp": c.tp, "why": c.reason} for c in found if not c.fits]
    for c in found:
        if c.fits and c.min_replicas > q.max_replicas:
            pruned.append({"gpu": c.gpu, "tp": c.tp, "why": f"needs >= {c.min_replicas} "
                           f"replicas (a replica can never exceed {c.bound_rps:.3g} req/s)"})
    layouts = dp_layouts(model, {g: get_hardware(g) for g in q.gpus}, q.tps, q.dps, longest,
                         base.hardware.memory_utilization, base.scheduler.max_num_seqs,
                         base.scheduler.max_num_batched_tokens)
    pruned += [{"gpu": d.gpu, "tp": d.tp, "dp": d.dp, "why": d.reason}
               for d in layouts if not d.fits]
    search = Search({(c.gpu, c.tp): c.min_replicas for c in found
                     if c.fits and c.min_replicas <= q.max_replicas}, q.max_replicas)
    dp_rows: list[dict[str, Any]] = []
    with open_backend(backend or Backend(), cache) as runner, tqdm(
            total=0, unit="fleet", desc="plan", disable=not progress) as bar:
        while todo := search.round():
            bar.total += len(todo)
            bar.refresh()
            results = runner.run([Task(q.scenario(g, tp, r), q.base_dir) for g, tp, r in todo],
                                 bar)
            for (gpu, tp, replicas), result in zip(todo, results, strict=True):
                if "error" in result:
                    raise SweepError(f"{gpu} x{tp}, {replicas} replicas: {result['error']}")
                row = _row(q, gpu, tp, replicas, result)
                search.record(gpu, tp, replicas, row, row["passes"], row["passes_point"],
                              row["hopeless"])
        dp_rows = _run_layouts(q, [d for d in layouts if d.fits], runner, bar)
    for (gpu, tp), why in search.hopeless.items():
        pruned.append({"gpu": gpu, "tp": tp, "why": why})
    for (gpu, tp), _ in search.open.items():
        if (gpu, tp) not in search.hopeless:
            pruned.append({"gpu": gpu, "tp": tp, "why": f"no fleet of up to {q.max_replicas} "
                           "replicas passed"})
    for row in dp_rows:
        if not row["passes"]:
            pruned.append({"gpu": row["gpu"], "tp": row["tp"], "dp": row["dp"],
                           "why": f"one DP group does not pass ({row['why']}); fleets of "
                           "DP groups are not modelled"})
    tried = pd.DataFrame([*search.tried.values(), *dp_rows])
    table = _ranked(q, [search.tried[(g, tp, r)] for (g, tp), r in search.answer.items()]
                    + [r for r in dp_rows if r["passes"]])
    best = table.iloc[0].to_dict() if len(table) else None
    point = None
    if q.confidence is not None:
        ranked = _ranked(q, [search.tried[(g, tp, r)] for (g, tp), r in search.point.items()]
                         + [r for r in dp_rows if r["passes_point"]])
        point = ranked.iloc[0].to_dict() if len(ranked) else None
    return PlanResult(best, table, tried,
                      pd.DataFrame(pruned, columns=["gpu", "tp", "dp", "why"]).fillna({"dp": 1})
                      .astype({"dp": int}), runner.reused, point)


def _run_layouts(q: PlanQuestion, layouts: list[Any], runner: Any, bar: Any
                 ) -> list[dict[str, Any]]:
    """Each fitting DP layout simulated once, as one group (no replica search: see
    sim.experiments.plan_layouts)."""
    if not layouts:
        return []
    bar.total += len(layouts)
    bar.refresh()
    results = runner.run([Task(q.scenario(d.gpu, d.tp, 1, d.dp), q.base_dir)
                          for d in layouts], bar)
    rows = []
    for d, result in zip(layouts, results, strict=True):
        if "error" in result:
            raise SweepError(f"{d.gpu} {layout_label(d.tp, d.dp)}: {result['error']}")
        rows.append(_row(q, d.gpu, d.tp, 1, result, d.dp))
    return rows


def _ranked(q: PlanQuestion, rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Passing fleets, cheapest first (ties: the lower percentile TTFT)."""
    table = pd.DataFrame(rows)
    if len(table):
        table = table.sort_values(["cost", f"{q.percentile}_ttft_ms", "gpu", "tp", "dp"],
                                  kind="stable").reset_index(drop=True)
    return table
