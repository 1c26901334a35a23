"""Compare specs: the validated YAML, its base scenario, and the load-search rules.

A compare spec names a base scenario (a file, relative to the spec, or an
inline mapping), variants (each a set of `--set`-style overrides) and the
offered rates (a list, or `auto`). Variants may not touch `seed` or
`workload`, so at each rate every variant serves the same requests. The
search rules (saturation, knees, SLO bisection) are pure functions of run
rows so they can be tested on constructed cases.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sim.config.loader import apply_overrides, read_scenario_raw, validate_scenario
from sim.config.scenario import DEFAULT_WORKLOAD, NAME_PATTERN, Scenario
from sim.config.yaml_input import ScenarioError, read_yaml
from sim.experiments.slo_confidence import resolve, tighten
from sim.experiments.sweep import SweepError, Task, override
from sim.results.stats.prediction import check_confidence

SUSTAIN_RATIO = 0.9  # achieved >= 90% of the offered rate = sustained
_FORBIDDEN = ("seed", "workload")  # would change the request stream


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class VariantSpec(_Strict):
    name: str = Field(min_length=1)
    overrides: dict[str, Any] = Field(default_factory=dict, alias="set")

    @model_validator(mode="after")
    def _same_stream(self) -> VariantSpec:
        bad = [k for k in self.overrides if k.split(".")[0] in _FORBIDDEN]
        if bad:
            raise ValueError(f"variant {self.name!r} sets {', '.join(bad)}: variants must "
                             "serve the same requests, so seed and workload are the base's")
        return self


class AutoSpec(_Strict):
    """Doubling from `start` until every variant saturates, then midpoints at each knee."""

    start: float = Field(1.0, gt=0, allow_inf_nan=False)
    max_rate: float = Field(1024.0, gt=0, allow_inf_nan=False)
    min_gain: float = Field(1.1, gt=1.0, description="doubling the rate must grow throughput "
                            "by this factor, else the variant is saturated")


class CompareSpec(_Strict):
    name: str | None = None
    base: str | None = None
    scenario: dict[str, Any] | None = None
    variants: list[VariantSpec] = Field(min_length=1)
    rates: list[float] | Literal["auto"] = "auto"
    auto: AutoSpec = AutoSpec()
    slo_threshold: float = Field(0.9, gt=0.0, le=1.0, description="SLO met = attainment >= this")
    bisect_steps: int = Field(4, ge=0, le=20)
    ci_half_width: float = Field(
        0.02, gt=0.0, le=0.5, description="the SLO search lengthens runs at the boundary until "
        "the 95% CI of SLO attainment is this wide each side (0.02 = +-2 points)")
    rate_ci_half_width: float = Field(
        0.05, gt=0.0, le=1.0, description="and until the achieved rate's 95% CI is this share "
        "of it each side, so the sustained verdict at the boundary rests on a narrow interval")
    request_budget: int = Field(
        200_000, ge=0, description="requests the longer runs may simulate, per variant; "
        "when spent, the search reports the wider interval and says so")
    confidence: float | None = Field(
        None, description="the SLO search's rates must meet the SLOs at this probability "
        "(e.g. 0.95) under simulation noise and the model's error against real servers "
        "(docs/uncertainty.md); `servesim compare --confidence` overrides it")
    waste_rate: float | None = Field(None, gt=0, description="rate of the waste bars")
    out: str | None = None

    @field_validator("confidence", mode="before")
    @classmethod
    def _confidence(cls, value: Any) -> float | None:
        """--confidence's check, on the value as written (`true` is not 1.0)."""
        return check_confidence(value, "confidence")

    @model_validator(mode="after")
    def _check(self) -> CompareSpec:
        if self.name is not None and not NAME_PATTERN.fullmatch(self.name):
            raise ValueError(f"name {self.name!r} must be a plain directory name (it names "
                             "results/compare_<name>/): up to 100 letters, digits, '.', '_' "
                             "or '-', not starting with '.'")
        if (self.base is None) == (self.scenario is None):
            raise ValueError("give exactly one of 'base' (a scenario file) or 'scenario'")
        names = [v.name for v in self.variants]
        if len(set(names)) != len(names):
            raise ValueError(f"variant names must be unique, got {names}")
        if isinstance(self.rates, list) and (not self.rates or min(self.rates) <= 0):
            raise ValueError("rates must be a non-empty list of rates > 0, or 'auto'")
        return self


@dataclass(frozen=True, slots=True)
class Base:
    """The loaded spec: its base scenario, and how an offered rate becomes overrides."""

    spec: CompareSpec
    source: str
    base_dir: Path
    raw: dict[str, Any]
    trace_rate: float | None  # a trace's own arrival rate at time_scale 1; None = synthetic
    confidence: float | None = None  # the SLO search's (the spec's, or --confidence)
    confidence_note: str = ""  # the SLO bounds the confidence tightened, in words

    def scenario(self, variant: VariantSpec, rate: float,
                 num_requests: int | None = None) -> Scenario:
        """`variant` at `rate`; `num_requests` lengthens (or shortens) the request stream."""
        sets = [override(k, v) for k, v in variant.overrides.items()]
        sets += rate_overrides(rate, self.trace_rate)
        if num_requests is not None:
            sets.append(override("workload.num_requests", num_requests))
        return _validate(self.raw, sets, self.source)

    def task(self, variant: VariantSpec, rate: float, num_requests: int | None = None) -> Task:
        return Task(self.scenario(variant, rate, num_requests), self.base_dir)


def rate_overrides(rate: float, trace_rate: float | None) -> list[str]:
    """Synthetic: set the arrival rate; trace: speed the replay up to `rate`."""
    if trace_rate is None:
        return [override("workload.arrivals.rate", rate)]
    return [override("workload.trace.time_scale", rate / trace_rate)]


def _validate(raw: dict[str, Any], sets: list[str], source: str) -> Scenario:
    """As `load_scenario`, for a mapping already in memory."""
    return validate_scenario(apply_overrides(copy.deepcopy(raw), sets), source)


def load_spec(path: str | Path, sets: Sequence[str] = (), confidence: float | None = None
              ) -> Base:
    """Read and validate a compare spec and its base; every problem is a SweepError.
    `sets`: `--set KEY=VALUE` overrides of the base scenario, as `servesim run` takes them;
    one that a variant or the offered rate would override again is refused, naming it.
    `confidence`: --confidence, over the spec's `confidence:`; either tightens the base's
    SLO bounds here (sim.experiments.slo_confidence)."""
    path = Path(path)
    try:
        raw_spec = read_yaml(path, "compare")
    except ScenarioError as err:
        raise SweepError(str(err)) from None
    if not isinstance(raw_spec, dict):
        got = "an empty file" if raw_spec is None else type(raw_spec).__name__
        raise SweepError(f"{path}: a compare spec must be a mapping of base (or scenario), "
                         f"variants and rates, got {got}")
    if "variants" not in raw_spec and set(raw_spec) <= set(Scenario.model_fields):
        raise SweepError(f"{path}: this is a scenario (it has no variants), not a compare "
                         f"spec; run it with `servesim run {path}`, or compare variants of it "
                         "with a spec of `base:`, `variants:` and `rates:` (see "
                         "scenarios/batching_policies.yaml)")
    try:
        spec = CompareSpec.model_validate(raw_spec)
    except ValidationError as err:
        raise SweepError(_spec_errors(err, path)) from None
    spec_dir = path.resolve().parent
    try:
        if spec.base is not None:
            base_path = spec_dir / spec.base
            raw, source = read_scenario_raw(base_path), str(base_path)
            base_dir = base_path.resolve().parent
        else:
            raw, base_dir = copy.deepcopy(spec.scenario or {}), spec_dir
            source = f"{path}: scenario"
        raw.setdefault("workload", copy.deepcopy(DEFAULT_WORKLOAD))
        if isinstance(raw["workload"].get("trace"), str):  # `trace: FILE`: time_scale goes in
            raw["workload"]["trace"] = {"path": raw["workload"]["trace"]}
        _check_sets(sets, spec)
        raw = apply_overrides(raw, sets)
        try:
            level, note = resolve(spec.confidence, confidence, str(path)), ""
            if level is not None:
                raw, note = tighten(raw, level, [(v.name, k) for v in spec.variants
                                                 for k in v.overrides])
        except ValueError as err:
            raise SweepError(str(err)) from None
        scenario = _validate(raw, [], source)
        # a trace without arrival times runs at workload.arrivals: its rate is what varies
        timed_trace = scenario.workload.trace is not None and scenario.workload.arrivals is None
        trace_rate = _trace_rate(raw, base_dir, source) if timed_trace else None
        base = Base(spec, source, base_dir, raw, trace_rate, level, note)
        rate = spec.rates[0] if isinstance(spec.rates, list) else spec.auto.start
        for variant in spec.variants:  # a bad override fails now, not mid-sweep
            base.scenario(variant, rate)
    except ScenarioError as err:
        raise SweepError(str(err)) from None
    return base


RATE_KEYS = ("workload.arrivals.rate", "workload.trace.time_scale")


def _check_sets(sets: Sequence[str], spec: CompareSpec) -> None:
    """A `--set` the compare would override again is an error, not silently lost."""
    for item in sets:
        key = item.partition("=")[0].strip()
        if key in RATE_KEYS:
            raise SweepError(f"--set {key}: the compare sets it from each offered rate "
                             "(`rates:`); change the rates instead")
        for variant in spec.variants:
            if key in variant.overrides:
                raise SweepError(f"--set {key}: variant {variant.name!r} sets it too; a "
                                 "--set may name only fields no variant sets")


def _trace_rate(raw: dict[str, Any], base_dir: Path, source: str) -> float:
    """A trace's mean arrival rate at time_scale 1: (arrivals - 1) / span."""
    from sim.experiments.sweep import stream_digest

    scenario = _validate(raw, [override("workload.trace.time_scale", 1.0)], source)
    try:
        _, count, span_s = stream_digest(scenario, base_dir)
    except (ValueError, FileNotFoundError) as err:
        raise ScenarioError(f"{source}: {err}") from None
    if count < 2 or span_s <= 0:
        raise ScenarioError(f"{source}: the trace needs two arrivals at different times "
                            "to have a rate")
    return (count - 1) / span_s


def _spec_errors(err: ValidationError, path: Path) -> str:
    problems = []
    for e in err.errors(include_url=False):
        loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith(("list[", "literal[")))
        msg = e["msg"].removeprefix("Value error, ").removeprefix(f"{loc}: ")
        if e["type"] == "extra_forbidden":
            msg = f"unknown key; allowed: {', '.join(CompareSpec.model_fields)}"
        problems.append(f"{loc or '(top level)'}: {msg}")
    return f"{path}: " + "; ".join(dict.fromkeys(problems))


@dataclass(frozen=True, slots=True)
class Bracket:
    """The highest rate known to meet the SLOs and the lowest known to miss them."""

    lo: float | None
    hi: float | None

    def probe(self) -> float:
        if self.lo is None:
            return self.hi / 2  # type: ignore[operator]
        return self.lo * 2 if self.hi is None else (self.lo + self.hi) / 2


def bracket(outcomes: list[tuple[float, bool]]) -> Bracket:
    """From (rate, met) pairs: lo = the highest met rate below the lowest missed one."""
    missed = [r for r, ok in outcomes if not ok]
    hi = min(missed) if missed else None
    met = [r for r, ok in outcomes if ok and (hi is None or r < hi)]
    return Bracket(max(met) if met else None, hi)


def bisect_max_rate(brackets: dict[str, Bracket], steps: int,
                    evaluate: Callable[[dict[str, float]], dict[str, bool]]
                    ) -> dict[str, Bracket]:
    """`steps` rounds; each probes every variant once (one parallel batch per round)."""
    for _ in range(steps):
        probes = {name: b.probe() for name, b in brackets.items()}
        met = evaluate(probes)
        brackets = {name: Bracket(probes[name], b.hi) if met[name] else Bracket(b.lo, probes[name])
                    for name, b in brackets.items()}
    return brackets


def is_sustained(row: dict[str, Any]) -> bool:
    """Completions keep pace with arrivals: completion rate >= 90% of the arrival rate.

    Both are (count - 1) / span, of finish times and of arrival times. vLLM's
    request_throughput (completed / (last finish - first arrival)) would do for
    long runs, but its drain tail (the last request's latency) makes a short
    run look saturated at any load; the completion span has no such tail.
    """
    achieved, offered = row.get("completion_rate"), row.get("offered_rate_measured")
    if achieved is None or offered is None or not (math.isfinite(offered)
                                                   and math.isfinite(achieved)):
        return False
    return achieved >= SUSTAIN_RATIO * offered


def auto_next(history: dict[str, list[dict[str, Any]]], auto: AutoSpec) -> bool:
    """Keep doubling? Only while some variant is not yet saturated and below max_rate.

    A variant saturates at its last rate when it no longer sustains it, or when
    doubling the rate raised its achieved throughput by less than `min_gain`.
    """
    for rows in history.values():
        last = rows[-1]
        grew = len(rows) < 2 or last["completion_rate"] >= auto.min_gain * rows[-2][
            "completion_rate"]
        if is_sustained(last) and grew and last["offered_rate"] * 2 <= auto.max_rate:
            return True
    return False


def knee_midpoints(history: dict[str, list[dict[str, Any]]]) -> list[float]:
    """Per variant, sqrt(lo * hi) between its last sustained and first unsustained rate."""
    mids = set()
    for rows in history.values():
        for below, above in zip(rows, rows[1:], strict=False):
            if is_sustained(below) and not is_sustained(above):
                mids.add(math.sqrt(below["offered_rate"] * above["offered_rate"]))
                break
    return sorted(mids)
