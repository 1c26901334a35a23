"""`servesim plan`'s answer in words and files: plan.md, plan.csv (runners-up), tried.csv,
pruned.csv and plan.png."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.experiments.plan_run import PlanQuestion, PlanResult
from sim.experiments.sweep import markdown_table

_SHOWN = ("gpu", "tp", "replicas", "gpus", "cost", "window_throughput", "window_throughput_lo",
          "window_throughput_hi")


def _columns(q: PlanQuestion) -> list[str]:
    p = q.percentile
    return [*_SHOWN, f"{p}_ttft_ms", f"{p}_ttft_ms_lo", f"{p}_ttft_ms_hi", f"{p}_tpot_ms",
            f"{p}_tpot_ms_lo", f"{p}_tpot_ms_hi"]


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
    return (f"Cheapest for {q.rate:g} req/s with {bounds}: {best['replicas']} x {best['gpu']} "
            f"TP{best['tp']} ({cost}); achieved {best['window_throughput']:.1f} "
            f"[{best['window_throughput_lo']:.1f}, {best['window_throughput_hi']:.1f}] req/s, "
            f"{p} TTFT {best[f'{p}_ttft_ms']:.0f} [{best[f'{p}_ttft_ms_lo']:.0f}, "
            f"{best[f'{p}_ttft_ms_hi']:.0f}] ms, {p} TPOT {best[f'{p}_tpot_ms']:.1f} "
            f"[{best[f'{p}_tpot_ms_lo']:.1f}, {best[f'{p}_tpot_ms_hi']:.1f}] ms (95% CIs, "
            f"{q.requests} requests a fleet)")


def format_plan(result: PlanResult, q: PlanQuestion) -> str:
    lines = [answer_line(result.best, q)]
    if len(result.table):
        lines += ["", "Runners-up (cheapest passing fleet per GPU and TP):",
                  result.table[_columns(q)].to_string(index=False,
                                                      float_format=lambda x: f"{x:.3g}")]
    if len(result.pruned):
        lines += ["", "Ruled out:"]
        lines += [f"  {r.gpu} TP{r.tp}: {r.why}" for r in result.pruned.itertuples()]
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
    if len(result.table):
        md += ["## Runners-up\n", markdown_table(result.table[_columns(q)])]
    if len(result.pruned):
        md += ["## Ruled out\n", markdown_table(result.pruned)]
    paths[3].write_text("\n".join(md))
    if plots:
        from sim.plots.plan import plot_plan

        paths.append(plot_plan(result.table, cost_label(q), q.percentile, out_dir / "plan.png"))
    return paths
