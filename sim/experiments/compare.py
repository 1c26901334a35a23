"""`servesim compare`: variants of one scenario on the identical request stream, over load.

The spec (see `sim.experiments.compare_spec`) gives a base scenario, variants and rates.
Every run goes through the sweep runner, so a compare parallelises on any
backend the sweep has. Each run reports a digest of the request stream it
served; the compare stops with an error if two variants at one rate served
different requests. After the load sweep, each variant's highest rate that
meets the base scenario's SLOs (attainment >= `slo_threshold`) is found by
bisection between the swept rates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sim.experiments.cache import PointCache
from sim.experiments.compare_spec import (
    Base,
    VariantSpec,
    auto_next,
    knee_midpoints,
    load_spec,
)
from sim.experiments.slo_search import slo_search
from sim.experiments.sweep import (
    Backend,
    Runner,
    SweepError,
    markdown_table,
    open_backend,
    write_table,
)
from sim.results.files.report import nothing_served
from sim.results.files.steady import window_columns

__all__ = ["CompareResult", "load_spec", "run_compare", "write_compare"]
_COPIED = ("request_throughput", "output_throughput", "median_ttft_ms", "p99_ttft_ms",
           "median_tpot_ms", "p99_tpot_ms", "median_e2el_ms", "p99_e2el_ms", "request_goodput",
           "slo_attainment", "slot_utilization", "kv_waste_fraction", "kv_waste_of_held",
           "mean_batch_size", "completed", "rejected", "total_preemptions", "prefix_hit_rate",
           "prefill_tokens_saved", "cache_evictions")
MD_COLUMNS = {"variant": "variant", "offered_rate": "offered req/s",
              "request_throughput": "req/s", "output_throughput": "out tok/s",
              "median_ttft_ms": "TTFT p50 ms", "p99_ttft_ms": "TTFT p99 ms",
              "median_tpot_ms": "TPOT p50 ms", "p99_tpot_ms": "TPOT p99 ms",
              "request_goodput": "goodput req/s", "window_throughput": "req/s (window)",
              "window_goodput": "goodput (window)",
              "window_attainment": "attainment (window)", "slot_utilization": "slot util",
              "kv_waste_of_held": "KV waste (held)", "kv_waste_fraction": "KV waste (pool)",
              "prefix_hit_rate": "prefix hit rate",
              "tokens_per_s_per_user": "tok/s/user",
              "tokens_per_s_per_gpu": "tok/s/GPU", "sustained": "sustained"}
SHORT = {"variant": "variant", "offered_rate": "rate", "request_throughput": "req/s",
         "output_throughput": "tok/s", "p99_ttft_ms": "p99 TTFT ms", "p99_tpot_ms": "p99 TPOT ms",
         "request_goodput": "goodput", "window_attainment": "attain", "sustained": "sustained",
         "slot_utilization": "slot util",
         "kv_waste_of_held": "KV waste", "prefix_hit_rate": "hit rate"}


_LATENCY_SHOWN = ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms")


def _shown(table: pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    """The named columns, less those no run measured (all NaN, e.g. hit rate w/o caching)."""
    view = table[list(columns)].copy()
    if "sustained" in table:  # an unsustained run's latencies are a transient's
        for key in (k for k in _LATENCY_SHOWN if k in columns):
            view[key] = [f"{v:.4g} transient" if not ok and v == v else v
                         for v, ok in zip(table[key], table["sustained"], strict=True)]
    view = view.rename(columns=columns)
    return view.loc[:, ~view.isna().all()]


def _num(value: Any) -> float:
    return math.nan if value is None else float(value)


def make_row(variant: str, rate: float, result: dict[str, Any], gpus: int) -> dict[str, Any]:
    """One compare row from a run's plain result dict."""
    count, span_s = result["num_arrivals"], result["arrival_span_s"]
    measured = (count - 1) / span_s if span_s > 0 else math.nan
    done, finish_span_s = result["completed"], result["finish_span_s"]
    row: dict[str, Any] = {"variant": variant, "offered_rate": rate,
                           "offered_rate_measured": measured,
                           "completion_rate": (done - 1) / finish_span_s if finish_span_s > 0
                           else math.nan}
    for key in _COPIED:
        value = result.get(key)
        row[key] = value if isinstance(value, int) else _num(value)
    mean_tpot = _num(result.get("mean_tpot_ms"))
    row["tokens_per_s_per_user"] = 1000.0 / mean_tpot if mean_tpot > 0 else math.nan
    row["gpus"] = gpus
    row["tokens_per_s_per_gpu"] = row["output_throughput"] / gpus
    row["num_requests"] = count
    row.update(window_columns(result))  # sim.results.files.steady: the verdict, the window's CIs
    row["request_stream"] = result["request_stream"]
    row["wall_s"] = result["wall_s"]
    return row


class _Session:
    """Runs (variant, rate) pairs once each, checking every rate's request stream."""

    def __init__(self, base: Base, runner: Runner, bar: Any) -> None:
        self.base, self.runner, self.bar = base, runner, bar
        # (variant, rate, requests): None = the base scenario's length
        self.rows: dict[tuple[str, float, int | None], dict[str, Any]] = {}
        self.nothing_served: list[str] = []  # runs where every request was rejected, and why

    def run(self, pairs: list[tuple[VariantSpec, float, int | None]]) -> list[dict[str, Any]]:
        keys = [(v.name, r, n) for v, r, n in pairs]
        todo = list(dict.fromkeys(k for k in keys if k not in self.rows))
        variants = {v.name: v for v, _, _ in pairs}
        if todo:
            self.bar.total = (self.bar.total or 0) + len(todo)
            self.bar.refresh()
            tasks = [self.base.task(variants[name], rate, n) for name, rate, n in todo]
            results = self.runner.run(tasks, self.bar)
            for (name, rate, n), task, result in zip(todo, tasks, results, strict=True):
                if "error" in result:
                    raise SweepError(f"variant {name!r} at {rate:g} req/s: {result['error']}")
                if (why := nothing_served(result)) is not None:
                    self.nothing_served.append(f"variant {name!r} at {rate:g} req/s: {why}")
                # a variant may change the TP degree; a fleet has replicas x TP GPUs
                dis = task.scenario.disaggregation  # or two pools of their own GPUs
                gpus = (task.scenario.hardware.count * task.scenario.replicas if dis is None
                        else dis.num_gpus(task.scenario.hardware.count))
                self.rows[(name, rate, n)] = make_row(name, rate, result, gpus)
            self._check_streams()
        return [self.rows[k] for k in keys]

    def _check_streams(self) -> None:
        seen: dict[tuple[float, int | None], tuple[str, str]] = {}
        for (name, rate, n), row in self.rows.items():
            first = seen.setdefault((rate, n), (name, row["request_stream"]))
            if first[1] != row["request_stream"]:
                raise RuntimeError(f"at {rate:g} req/s variants {first[0]!r} and {name!r} "
                                   "served different request streams")


@dataclass(frozen=True, slots=True)
class CompareResult:
    table: pd.DataFrame  # one row per variant x swept rate
    slo: pd.DataFrame | None  # one row per variant; None without SLOs in the base
    waste_rate: float
    probes: pd.DataFrame  # every run, bisection probes included
    reused: int = 0  # runs the point cache gave
    nothing_served: tuple[str, ...] = ()  # runs where every request was rejected, and why


def _load_sweep(session: _Session) -> list[float]:
    spec = session.base.spec
    variants = spec.variants
    if isinstance(spec.rates, list):
        rates = sorted(set(spec.rates))
        session.run([(v, r, None) for r in rates for v in variants])
        return rates
    history: dict[str, list[dict[str, Any]]] = {v.name: [] for v in variants}
    rate, rates = spec.auto.start, []
    while True:
        rates.append(rate)
        for v, row in zip(variants, session.run([(v, rate, None) for v in variants]),
                          strict=True):
            history[v.name].append(row)
        if not auto_next(history, spec.auto):
            break
        rate *= 2
    mids = knee_midpoints(history)
    session.run([(v, r, None) for r in mids for v in variants])
    return sorted({*rates, *mids})


def _waste_rate(table: pd.DataFrame, asked: float | None) -> float:
    """The swept rate nearest the asked one, else the highest every variant sustains,
    else the lowest."""
    if asked is not None:
        rates = table["offered_rate"].to_numpy()
        return float(rates[abs(rates - asked).argmin()])
    all_ok = table.groupby("offered_rate")["sustained"].all()
    ok = all_ok[all_ok].index
    return float(ok.max() if len(ok) else table["offered_rate"].min())


def run_compare(base: Base, backend: Backend | None = None, progress: bool = True,
                cache: PointCache | None = None) -> CompareResult:
    """The load sweep, then the SLO search; `cache` reuses and keeps finished points. The
    search runs at `base.confidence` (the spec's or --confidence; sim.experiments.slo_search),
    the base's SLO bounds already tightened by `load_spec`."""
    from tqdm import tqdm

    backend = backend or Backend()
    with open_backend(backend, cache) as runner, tqdm(total=0, unit="run", desc="compare",
                                                disable=not progress) as bar:
        session = _Session(base, runner, bar)
        rates = _load_sweep(session)
        slo = slo_search(session, rates, base.confidence)
    order = {v.name: i for i, v in enumerate(base.spec.variants)}
    swept = [row for (name, rate, n), row in sorted(
        session.rows.items(), key=lambda kv: (order[kv[0][0]], kv[0][1], kv[0][2] or 0))
             if rate in rates and n is None]
    table = pd.DataFrame(swept)
    probes = pd.DataFrame(list(session.rows.values()))
    waste_rate = _waste_rate(table, base.spec.waste_rate)
    return CompareResult(table, slo, waste_rate, probes, runner.reused,
                         tuple(session.nothing_served))


def write_compare(result: CompareResult, out_dir: Path, plots: bool = True) -> list[Path]:
    """compare.csv/.md (+ compare_slo.csv, probes.csv) and the PNG plots."""
    written = write_table(result.table, out_dir, "compare")
    md = ["# Load sweep\n", markdown_table(_shown(result.table, MD_COLUMNS)),
          "\nAll columns: compare.csv.\n"]
    if result.slo is not None:
        slo_csv = out_dir / "compare_slo.csv"
        result.slo.to_csv(slo_csv, index=False)
        written.append(slo_csv)
        md += ["\n# Highest rate meeting the SLOs\n", markdown_table(result.slo)]
    md.append(f"\nWaste bars at {result.waste_rate:g} req/s offered.\n")
    (out_dir / "compare.md").write_text("\n".join(md))
    probes_csv = out_dir / "probes.csv"
    result.probes.to_csv(probes_csv, index=False)
    written.append(probes_csv)
    if plots:
        from sim.plots.compare import write_plots

        written += write_plots(result.table, result.waste_rate, out_dir)
    return written


def format_compare(result: CompareResult) -> str:
    """Short terminal tables: the load sweep and the SLO search."""
    short = _shown(result.table, SHORT)
    text = short.to_string(index=False, float_format=lambda x: f"{x:.3g}")
    if result.slo is not None:
        text += "\n\nHighest sustained rate meeting the SLOs:\n"
        text += "\n".join(slo_line(row) for row in result.slo.to_dict("records"))
    return text


def count_text(value: Any) -> str:
    """A count as an integer with thousands separators (a pandas column with a gap holds
    counts as floats: 76800.0 is printed 76,800); 'n/a' when missing."""
    number = _num(value)
    return "n/a" if math.isnan(number) else f"{round(number):,}"


def slo_line(row: dict[str, Any]) -> str:
    """One variant's answer: the rate and its bracket, attainment with its CI, the run length."""
    name, lo, hi = row["variant"], row["max_slo_rate"], row["first_failing_rate"]
    if math.isnan(lo) and math.isnan(hi) and isinstance(row.get("note"), str):
        return f"  {name}: {row['note']}"  # not searched (e.g. not validated at a confidence)
    if math.isnan(lo):  # no rate met
        return f"  {name}: no sustained rate met the SLOs (lowest tried fails at {hi:.3g} req/s)"
    upper = "not found" if math.isnan(hi) else f"{hi:.3g}"
    # achieved and goodput are the same window's (goodput <= achieved); the offered rate
    # is the nominal one, which a window's arrivals may exceed
    text = (f"  {name}: {lo:.3g} req/s offered (boundary in [{lo:.3g}, {upper})), achieved "
            f"{row['window_throughput']:.3g} req/s, goodput {row['request_goodput']:.3g} "
            f"req/s, attainment {row['slo_attainment']:.3f} [{row['slo_attainment_lo']:.3f}, "
            f"{row['slo_attainment_hi']:.3f}], {count_text(row['requests'])} requests a run")
    return text + (f"; {row['note']}" if isinstance(row.get("note"), str) else "")
