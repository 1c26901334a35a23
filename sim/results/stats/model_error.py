"""The model's own error against real servers, per metric: a fitted law on the log error.

A residual is ln(predicted / measured) for one held-out stage of the real runs
(calibrate.model_error derives them; docs/uncertainty.md). The law fitted here is
normal on that log error (a log-normal ratio) with models as the unit: a bias per
regime (the mean of its models' mean errors), a scale between models and one
within a model. A new model's stage then errs by bias +- sqrt(between^2 (1 +
1/models) + within^2) x Student's t on models - regimes degrees of freedom (the
prediction of one new draw, paid for the small sample). Models, not stages, are
the unit because a model's stages share most of their error, and a user's model
is one the fit never saw: counting 8 correlated stages as 8 draws undercovers.
Fitted, not empirical: with 4 models an empirical 95% quantile does not exist.

A regime split is kept only where the data separate it at SPLIT_ALPHA, models as
the unit (split_p_value). The splits tried are fixed beforehand: tensor parallel 1
against more than 1 (the all-reduce and the kernels' tp fit), and light load
against near saturation (the simulator's mean running batch below or above
LOAD_SPLIT of max_num_seqs). Stages the simulator calls unsustained are not
fitted: a transient gets no interval.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sim.results.stats.student_t import t_cdf

DESCRIPTION_FILE = Path(__file__).resolve().parent / "data" / "model_error.json"
# the real runs' measured figures (calibrate.real_runs.METRIC_NAMES) a law is fitted for
DESCRIBED = ("ttft_mean", "ttft_p50", "ttft_p99", "tpot", "e2e_mean", "e2e_p50",
             "output_tok_s")
LOAD_SPLIT = 0.5  # near saturation: mean running batch >= this share of max_num_seqs
SPLIT_ALPHA = 0.05
MIN_MODELS = 3  # fewer models with a sustained stage: no law (not validated)
METHOD = ("log error ln(predicted/measured) on held-out (leave-one-model-out) stages, normal "
          "per regime with a pooled scale; a new stage's error: Student t on the pooled "
          "degrees of freedom x scale x sqrt(1 + 1/n_regime)")

SPLITS: Mapping[str, Callable[[int, float], str]] = {
    "tp": lambda tp, occupancy: "tp1" if tp == 1 else "tp>1",
    "load": lambda tp, occupancy: "light" if occupancy < LOAD_SPLIT else "near_saturation",
}


@dataclass(frozen=True, slots=True)
class Residual:
    """One held-out stage: what it was, the simulator's verdicts, its log errors by metric."""

    stage: str
    model: str
    tp: int
    rate_req_s: float
    sustained: bool  # the simulator's own verdict on its run
    occupancy: float  # simulated mean running batch / max_num_seqs
    log_errors: Mapping[str, float]  # metric -> ln(predicted / measured)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "log_errors": dict(self.log_errors)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Residual:
        return cls(**{**d, "log_errors": dict(d["log_errors"])})


@dataclass(frozen=True, slots=True)
class Regime:
    models: int
    stages: int
    mean_log: float  # the mean over its models of each model's mean ln(predicted / measured)


@dataclass(frozen=True, slots=True)
class MetricError:
    """One metric's fitted law: the split (None: pooled), each regime's bias, the scales."""

    metric: str
    split: str | None
    regimes: Mapping[str, Regime]
    scale_between: float  # spread of the models' mean log errors around their regime's
    scale_within: float  # spread of a model's stages around that model's mean
    dof: int  # models - regimes: what the between scale rests on
    split_p_values: Mapping[str, float]  # each split tried: its t test's p (NaN: untestable)

    def regime_of(self, tp: int, occupancy: float) -> str:
        return "all" if self.split is None else SPLITS[self.split](tp, occupancy)

    def law(self, tp: int, occupancy: float) -> tuple[float, float]:
        """(bias, scale) of the log error of a stage of a model the fit never saw, in its
        regime: the regime's mean and sqrt(between^2 (1 + 1/models) + within^2)."""
        r = self.regimes[self.regime_of(tp, occupancy)]
        return r.mean_log, math.sqrt(self.scale_between ** 2 * (1 + 1 / r.models)
                                     + self.scale_within ** 2)

    def summary_line(self) -> str:
        parts = ", ".join(f"{k}: {r.models} models, {r.stages} stages, bias {r.mean_log:+.3f}"
                          for k, r in self.regimes.items())
        tried = ", ".join(f"{k} p={p:.2g}" for k, p in self.split_p_values.items())
        return (f"split {self.split or 'none'} ({parts}); scale between models "
                f"{self.scale_between:.3f}, within {self.scale_within:.3f}, {self.dof} dof; "
                f"splits tried: {tried}")

    def as_dict(self) -> dict[str, Any]:
        return {"split": self.split, "scale_between": self.scale_between,
                "scale_within": self.scale_within, "dof": self.dof,
                "regimes": {k: asdict(r) for k, r in self.regimes.items()},
                "split_p_values": {k: (None if math.isnan(p) else p)
                                   for k, p in self.split_p_values.items()}}

    @classmethod
    def from_dict(cls, metric: str, d: Mapping[str, Any]) -> MetricError:
        return cls(metric, d["split"], {k: Regime(**r) for k, r in d["regimes"].items()},
                   float(d["scale_between"]), float(d["scale_within"]), int(d["dof"]),
                   {k: math.nan if p is None else float(p)
                    for k, p in d["split_p_values"].items()})


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _t_test(diffs: Sequence[float], a: Sequence[float] = ()) -> float:
    """Two-sided p: one-sample t on `diffs` (paired), or two-sample pooled t of diffs vs a."""
    if a:
        n1, n2 = len(diffs), len(a)
        dof = n1 + n2 - 2
        if min(n1, n2) < 2:
            return math.nan
        ss = sum((x - _mean(diffs)) ** 2 for x in diffs) + sum((x - _mean(a)) ** 2 for x in a)
        se = math.sqrt(ss / dof * (1 / n1 + 1 / n2))
        gap = _mean(diffs) - _mean(a)
    else:
        dof = len(diffs) - 1
        if dof < 2:
            return math.nan
        se = math.sqrt(sum((x - _mean(diffs)) ** 2 for x in diffs) / dof / len(diffs))
        gap = _mean(diffs)
    return 2 * (1 - t_cdf(abs(gap) / se, dof)) if se > 0 else math.nan


def split_p_value(used: Sequence[Residual], metric: str, key: Callable[[int, float], str]
                  ) -> float:
    """Whether `key`'s two regimes differ, models as the unit: a split constant within each
    model (tp) by the two-sample t test on the models' means; one that varies within a model
    (load) by the paired t test on each model's regime difference. NaN: untestable."""
    cells: dict[str, dict[str, list[float]]] = {}
    for r in used:
        cells.setdefault(r.model, {}).setdefault(key(r.tp, r.occupancy), []).append(
            r.log_errors[metric])
    names = sorted({k for m in cells.values() for k in m})
    if len(names) != 2:
        return math.nan
    if all(len(m) == 1 for m in cells.values()):  # between models
        groups = [[_mean(g) for m in cells.values() for k, g in m.items() if k == name]
                  for name in names]
        return _t_test(groups[0], groups[1])
    pairs = [_mean(m[names[0]]) - _mean(m[names[1]]) for m in cells.values() if len(m) == 2]
    return _t_test(pairs)


def describe(residuals: Sequence[Residual], metric: str) -> MetricError | None:
    """`metric`'s law from the sustained `residuals`, models as the unit of sampling (the
    fit is judged on models it never saw); None with fewer than MIN_MODELS models."""
    used = [r for r in residuals
            if r.sustained and math.isfinite(r.log_errors.get(metric, math.nan))]
    if len({r.model for r in used}) < MIN_MODELS:
        return None
    p_values = {name: split_p_value(used, metric, key) for name, key in SPLITS.items()}
    significant = {k: p for k, p in p_values.items() if p < SPLIT_ALPHA}
    split = min(significant, key=lambda k: significant[k]) if significant else None
    key = SPLITS[split] if split else (lambda tp, occupancy: "all")
    cells: dict[tuple[str, str], list[float]] = {}
    for r in used:
        cells.setdefault((key(r.tp, r.occupancy), r.model), []).append(r.log_errors[metric])
    within_ss = sum(sum((x - _mean(g)) ** 2 for x in g) for g in cells.values())
    within_dof = sum(len(g) - 1 for g in cells.values())
    regimes, between_ss = {}, 0.0
    for name in sorted({k for k, _ in cells}):
        means = [_mean(g) for (k, _), g in cells.items() if k == name]
        centre = _mean(means)
        between_ss += sum((m - centre) ** 2 for m in means)
        regimes[name] = Regime(len(means), sum(len(g) for (k, _), g in cells.items()
                                               if k == name), centre)
    dof = len(cells) - len(regimes)
    if dof < 1:
        return None
    return MetricError(metric, split, regimes, math.sqrt(between_ss / dof),
                       math.sqrt(within_ss / within_dof) if within_dof else 0.0, dof, p_values)


def description_dict(description: Mapping[str, MetricError | None],
                     provenance: Mapping[str, Any]) -> dict[str, Any]:
    """The shipped file's content: method, provenance, the split rule, each metric's law."""
    return {"version": 1, "method": METHOD, "provenance": dict(provenance),
            "load_split": LOAD_SPLIT, "split_alpha": SPLIT_ALPHA,
            "metrics": {m: d.as_dict() for m, d in description.items() if d is not None}}


@dataclass(frozen=True, slots=True)
class ModelErrorTable:
    """The shipped description: each metric's law, with where it came from."""

    metrics: Mapping[str, MetricError]
    provenance: Mapping[str, Any]
    method: str


def load_description(path: Path = DESCRIPTION_FILE) -> ModelErrorTable:
    """The shipped description (written by `python -m calibrate.model_error`)."""
    d = json.loads(path.read_text())
    return ModelErrorTable({m: MetricError.from_dict(m, v) for m, v in d["metrics"].items()},
                           d["provenance"], d["method"])
