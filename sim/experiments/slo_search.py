"""The highest rate meeting the SLOs: sustained rates only, runs lengthened at the boundary.

Why: a short run at an overloaded rate can "meet" the SLOs while its queue
grows (its first requests never meet the queue the later ones will). So a
rate meets the SLOs only if its run is sustained (sim.results.files.steady) and the
window's SLO attainment is >= the spec's `slo_threshold`; and every rate the
search decides on is rerun with twice the requests (same seed: the same
stream, extended) while its attainment interval is wider than
`ci_half_width` each side, until the interval is narrow enough or the
variant's `request_budget` (requests simulated by the longer runs) would be
exceeded, which the result then says. The achieved rate's interval must also
be within `rate_ci_half_width` of it, so the sustained verdict at the boundary
is not a wide interval's benefit of the doubt. A rate that fails when lengthened moves
the bracket down. The reported rate comes with its interval: the boundary
lies between `max_slo_rate` (met) and `first_failing_rate` (missed).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from sim.experiments.compare_spec import Bracket, VariantSpec, bisect_max_rate, bracket


def _num(value: Any) -> float:
    return math.nan if value is None else float(value)


class Lengthening:
    """Evaluates probes for the bisection, lengthening each run as the spec asks."""

    def __init__(self, session: Any, variants: dict[str, VariantSpec], base_n: int | None,
                 confidence: float | None = None) -> None:
        spec = session.base.spec
        self.session, self.variants, self.base_n = session, variants, base_n
        self.confidence = confidence  # set: attainment's lower bound must reach the threshold
        self.threshold, self.target = spec.slo_threshold, spec.ci_half_width
        self.rate_target = spec.rate_ci_half_width
        self.budget = spec.request_budget
        self.spent = dict.fromkeys(variants, 0)
        self.final: dict[tuple[str, float], dict[str, Any]] = {}
        self.notes: dict[str, dict[str, None]] = {n: {} for n in variants}

    def met(self, row: dict[str, Any]) -> bool:
        attainment = row["window_attainment" if self.confidence is None
                         else "window_attainment_lo"]
        return bool(row["sustained"]) and _num(attainment) >= self.threshold

    def base_met(self, name: str, rate: float) -> bool:
        return self.met(self.session.rows[(name, rate, None)])

    def _half_width(self, row: dict[str, Any]) -> float:
        hw = _num(row["window_attainment_hi"]) - _num(row["window_attainment"])
        return math.inf if math.isnan(hw) else hw

    def _too_wide(self, row: dict[str, Any]) -> bool:
        """Attainment's interval wider than the target or, where the run would be accepted,
        the achieved rate's (relative): a clear miss needs no narrow rate."""
        if self._half_width(row) > self.target:
            return True
        if not self.met(row):
            return False
        rate, hi = _num(row["window_throughput"]), _num(row["window_throughput_hi"])
        return not (rate > 0 and (hi - rate) / rate <= self.rate_target)

    def _next_length(self, name: str, row: dict[str, Any], length: int) -> int | None:
        """The next run length for a sustained, too-wide row; None (with a note) if none."""
        if self.base_n is None:
            self.notes[name]["workload limited by duration: runs not lengthened"] = None
            return None
        if row["num_requests"] < length:
            self.notes[name]["the trace ran out: runs not lengthened further"] = None
            return None
        if self.spent[name] + 2 * length > self.budget:
            self.notes[name][f"request budget ({self.budget}) spent before the CIs reached "
                             f"+-{self.target:g} (attainment), +-{self.rate_target:.0%} "
                             "(achieved rate)"] = None
            return None
        return 2 * length

    def evaluate(self, probes: dict[str, float]) -> dict[str, bool]:
        """Run each variant at its probe rate, lengthening while the interval is too wide."""
        pairs = [(self.variants[n], r, None) for n, r in probes.items()]
        rows = dict(zip(probes, self.session.run(pairs), strict=True))
        lengths = dict.fromkeys(probes, self.base_n or 0)
        while True:
            longer = {}
            for name, row in rows.items():
                if row["sustained"] and self._too_wide(row):
                    length = self._next_length(name, row, lengths[name])
                    if length is not None:
                        longer[name] = length
            if not longer:
                break
            got = self.session.run([(self.variants[n], probes[n], k) for n, k in longer.items()])
            for (name, length), row in zip(longer.items(), got, strict=True):
                self.spent[name] += length
                lengths[name], rows[name] = length, row
        for name, row in rows.items():
            self.final[(name, probes[name])] = row
        return {name: self.met(row) for name, row in rows.items()}

    def confirm(self, brackets: dict[str, Bracket], rates: list[float]) -> dict[str, Bracket]:
        """Lengthen each bracket's met rate; one that fails then moves the bracket down."""
        brackets = dict(brackets)
        pending = [n for n, b in brackets.items() if b.lo is not None]
        while pending:
            met = self.evaluate({n: brackets[n].lo for n in pending})  # type: ignore[misc]
            again = []
            for name in pending:
                lo = brackets[name].lo
                if met[name]:
                    continue
                below = [r for r in rates if r < lo and self.base_met(name, r)]  # type: ignore
                brackets[name] = Bracket(max(below) if below else None, lo)
                if below:
                    again.append(name)
            pending = again
        return brackets

    def row(self, name: str, b: Bracket) -> dict[str, Any]:
        """The variant's answer: the rate, its bracket, attainment and goodput with CIs."""
        found = self.final.get((name, b.lo)) if b.lo is not None else None
        if found is None and b.lo is not None:
            found = self.session.rows.get((name, b.lo, None))
        found = found or {}
        gpus = found.get("gpus", 1)
        goodput = _num(found.get("window_goodput"))
        return {"variant": name, "max_slo_rate": _num(b.lo), "first_failing_rate": _num(b.hi),
                "slo_attainment": _num(found.get("window_attainment")),
                "slo_attainment_lo": _num(found.get("window_attainment_lo")),
                "slo_attainment_hi": _num(found.get("window_attainment_hi")),
                "window_throughput": _num(found.get("window_throughput")),
                "request_goodput": goodput,
                "request_goodput_lo": _num(found.get("window_goodput_lo")),
                "request_goodput_hi": _num(found.get("window_goodput_hi")),
                "goodput_per_gpu": goodput / gpus,
                "tokens_per_s_per_gpu": _num(found.get("tokens_per_s_per_gpu")),
                "requests": found.get("num_requests"),
                "ci_target_met": bool(found) and not self._too_wide(found),
                "requests_spent": self.spent[name],
                "note": "; ".join(self.notes[name]) or None}


def slo_search(session: Any, rates: list[float], confidence: float | None = None
               ) -> pd.DataFrame | None:
    """Each variant's highest sustained rate meeting the base scenario's SLOs (see above).

    `confidence`: the SLO bounds the runs were given are already tightened by the model
    error (sim.results.stats.prediction.tightened_slo); a rate then also needs its
    attainment's lower bound at the threshold, and a variant outside the validated
    domain gets no rate, its note saying why (docs/uncertainty.md)."""
    base = session.base
    scenario = base.scenario(VariantSpec(name="base"), rates[0])
    slo = scenario.slo
    if slo is None or all(b is None for b in (slo.ttft_ms, slo.tpot_ms, slo.e2el_ms)):
        return None
    variants = {v.name: v for v in base.spec.variants}
    unvalidated: dict[str, list[str]] = {}
    if confidence is not None:
        from sim.results.files.predicted import static_reasons

        unvalidated = {n: why for n, v in variants.items()
                       if (why := static_reasons(base.scenario(v, rates[0])))}
    search = Lengthening(session, variants, scenario.workload.num_requests, confidence)
    searched = [n for n in variants if n not in unvalidated]
    start = {n: bracket([(r, search.base_met(n, r)) for r in rates]) for n in searched}
    start = search.confirm(start, rates)
    found = bisect_max_rate(start, base.spec.bisect_steps, search.evaluate)
    rows = {n: search.row(n, b) for n, b in found.items()}
    for name, why in unvalidated.items():
        rows[name] = {**search.row(name, Bracket(None, None)),
                      "note": f"not validated at {confidence:.0%} confidence: {'; '.join(why)}"}
    return pd.DataFrame([rows[n] for n in variants])
