"""`servesim plan`'s answer in words and files: plan.md, plan.csv (runners-up), tried.csv,
pruned.csv and plan.png."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.experiments.plan_layouts import layout_label
from sim.experiments.plan_run import PlanQuestion, PlanResult
from sim.experiments.sweep import markdown_table

_SHOWN = ("replicas", "gpus", "cost", "window_throughput", "window_throughput_lo",
          "window_throughput_hi")


def _has_dp(result: PlanResult) -> bool:
    """Whether DP layouts passed: the tables then name each row's layout, not its TP."""
    return "dp" in result.table and bool((result.table["dp"] > 1).any())


def _columns(q: PlanQuestion, result: PlanResult) -> list[str]:
    p = q.percentile
    head = ["gpu", "layout"] if _has_dp(result) else ["gpu", "tp"]
    upper = ("_upper",) if q.confidence is not None else ()  # the confident bound beside
    return [*head, *_SHOWN, *(f"{p}_{m}_ms{part}" for m in ("ttft", "tpot")
                              for part in ("", "_lo", "_hi", *upper))]


def cost_label(q: PlanQuestion) -> str:
    return "$/hour" if q.prices else "GPUs"


def answer_line(best: dict[str, Any] | None, q: PlanQuestion) -> str:
    """The answer, with its intervals, in one sentence."""
    bounds = " and ".join(f"{q.percentile} {name} <= {b:g} ms" for name, b in
                          (("TTFT", q.ttft_ms), ("TPOT", q.tpot_ms)) if b is not None)
    if best is None:
        return f"No configuration sustains {q.rate:g} req/s with {bounds}."
    p = q.percentile
    cost = f"${best['cost']:.2f}/hour" if q.prices else f"{best['gpus']} GPUs"
    return (f"Cheapest for {q.rate:g} req/s with {bounds}: {_fleet(best)} ({cost}); "
            f"achieved {best['window_throughput']:.1f} "
            f"[{best['window_throughput_lo']:.1f}, {best['window_throughput_hi']:.1f}] req/s, "
            f"{p} TTFT {best[f'{p}_ttft_ms']:.0f} [{best[f'{p}_ttft_ms_lo']:.0f}, "
            f"{best[f'{p}_ttft_ms_hi']:.0f}] ms, {p} TPOT {best[f'{p}_tpot_ms']:.1f} "
            f"[{best[f'{p}_tpot_ms_lo']:.1f}, {best[f'{p}_tpot_ms_hi']:.1f}] ms (95% CIs, "
            f"{q.requests} requests a fleet)")


def _fleet(row: dict[str, Any]) -> str:
    """`2 x h200 TP8`, or one DP group: `h200 DP8 x TP1 + EP8`."""
    dp, tp = int(row.get("dp", 1)), int(row["tp"])
    if dp > 1:
        return f"{row['gpu']} {layout_label(tp, dp)}"
    return f"{row['replicas']} x {row['gpu']} TP{tp}"


def confidence_line(result: PlanResult, q: PlanQuestion) -> str:
    """With --confidence: what a point estimate would pick, and what the confidence costs."""
    if q.confidence is None:
        return ""
    head = (f"At {q.confidence:.0%} confidence (simulation noise and the model's error against "
            "real servers, docs/uncertainty.md)")
    point = result.point_best
    if point is None:
        return f"{head}; no configuration passes even on the point estimate."
    # why the point pick is not the confident one: its row's verdict at the confidence
    why = "" if point.get("passes", True) else f"; {point['why']}"
    gpus = int(point["gpus"])
    pick = f"{_fleet(point)} ({gpus} GPU{'' if gpus == 1 else 's'}{why})"
    if result.best is None:
        return (f"{head}; no configuration is certified; the point estimate would pick "
                f"{pick}.")
    extra = int(result.best["gpus"]) - int(point["gpus"])
    return (f"{head}; the point estimate would pick {pick}: the confidence costs "
            f"{extra} GPU{'' if extra == 1 else 's'}"
            + (f" (${result.best['cost'] - point['cost']:.2f}/hour)" if q.prices else "")
            + ".")


def format_plan(result: PlanResult, q: PlanQuestion) -> str:
    lines = [answer_line(result.best, q)]
    if q.confidence is not None:
        lines.append(confidence_line(result, q))
    if len(result.table):
        kind = "layout" if _has_dp(result) else "TP"
        lines += ["", f"Runners-up (cheapest passing fleet per GPU and {kind}):",
                  result.table[_columns(q, result)].to_string(index=False,
                                                      float_format=lambda x: f"{x:.3g}")]
    if len(result.pruned):
        lines += ["", "Ruled out:"]
        lines += [f"  {r.gpu} {layout_label(r.tp, r.dp) if r.dp > 1 else f'TP{r.tp}'}: {r.why}"
                  for r in result.pruned.itertuples()]
    return "\n".join(lines)


def write_plan(result: PlanResult, q: PlanQuestion, out_dir: Path, plots: bool = True
               ) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "plan.csv", out_dir / "tried.csv", out_dir / "pruned.csv",
             out_dir / "plan.md"]
    result.table.to_csv(paths[0], index=False)
    result.tried.to_csv(paths[1], index=False)
    result.pruned.to_csv(paths[2], index=False)
    md = [f"# servesim plan: {q.rate:g} req/s\n", answer_line(result.best, q) + "\n"]
    if q.confidence is not None:
        md.append(confidence_line(result, q) + "\n")
    if len(result.table):
        md += ["## Runners-up\n", markdown_table(result.table[_columns(q, result)])]
    if len(result.pruned):
        md += ["## Ruled out\n", markdown_table(result.pruned)]
    paths[3].write_text("\n".join(md))
    if plots:
        from sim.plots.plan import plot_plan

        paths.append(plot_plan(result.table, cost_label(q), q.percentile, out_dir / "plan.png",
                               q.ttft_ms, q.tpot_ms))
    return paths
