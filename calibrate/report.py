"""The fidelity report of `calibrate validate`: Markdown, JSON, CSVs and plots.

    fidelity.md      the metric table (engine, simulator with the table, error, roofline,
                     error), the per-step error by kind, the setup, the plots
    fidelity.json    the same numbers for machines
    steps.csv        every engine step: shape, measured duration, both models' predictions
    requests.csv     every request's TTFT / TPOT / E2EL in the engine and both simulations
    latency_cdf.png  overlaid CDFs of TTFT, TPOT and E2EL
    step_latency.png per step, predicted vs measured duration, by step kind

Plots are plain matplotlib (Agg), written after the numbers, and skippable.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calibrate.validate import Fidelity
from sim.results.files.report import jsonable

_SOURCES = ("engine", "table", "roofline")


def step_errors(steps: pd.DataFrame) -> pd.DataFrame:
    """Per step kind (and all): steps, measured busy time, and each model's error on it."""
    groups = [(k, steps[steps["kind"] == k]) for k in ("prefill", "decode", "verify", "mixed")]
    rows = []
    for kind, part in [*groups, ("all", steps)]:
        if part.empty:
            continue
        row: dict[str, Any] = {"kind": kind, "steps": len(part),
                               "measured_s": part["measured_ms"].sum() / 1e3}
        for model in ("table", "roofline"):
            ape = (part[f"{model}_ms"] - part["measured_ms"]).abs() / part["measured_ms"] * 100
            row[f"{model}_median_ape_pct"] = float(ape.median())
            row[f"{model}_p90_ape_pct"] = float(ape.quantile(0.9))
            row[f"{model}_busy_error_pct"] = float(
                (part[f"{model}_ms"].sum() / part["measured_ms"].sum() - 1) * 100)
        rows.append(row)
    return pd.DataFrame(rows)


def ttft_components(requests: pd.DataFrame) -> dict[str, float]:
    """One run's TTFT taken apart (ms medians, from a RunRecorder's requests frame).

    A request either found the engine idle, so its first step started at its arrival
    and its TTFT is that step (a first step after idling), or it waited behind running
    steps (`queued_wait_ms`: arrival to its first step) and was then prefilled
    (`queued_prefill_ms`: its first step's start to its first token, chunks included).
    """
    done = requests[requests["first_token_s"].notna()]
    wait_s = done["first_scheduled_s"] - done["arrival_s"]
    idle, queued = done[wait_s <= 0], done[wait_s > 0]
    prefill_ms = (queued["first_token_s"] - queued["first_scheduled_s"]) * 1e3

    def median(values: pd.Series) -> float:
        return float(values.median()) if len(values) else math.nan

    return {"ttft_ms": median((done["first_token_s"] - done["arrival_s"]) * 1e3),
            "idle_requests": float(len(idle)),
            "idle_ttft_ms": median((idle["first_token_s"] - idle["arrival_s"]) * 1e3),
            "queued_requests": float(len(queued)),
            "queued_wait_ms": median(wait_s[wait_s > 0] * 1e3),
            "queued_prefill_ms": median(prefill_ms)}


_COMPONENTS = (("ttft_ms", "TTFT p50, all requests (ms)"),
               ("idle_requests", "requests that found the engine idle"),
               ("idle_ttft_ms", "their TTFT p50: the first step after idling (ms)"),
               ("queued_requests", "requests that waited behind running steps"),
               ("queued_wait_ms", "their wait for a first step, p50 (ms)"),
               ("queued_prefill_ms", "their first step to first token, p50 (ms)"))


def components_markdown(fidelity: Fidelity) -> str:
    """TTFT component by component, engine against the simulator with the table."""
    engine = ttft_components(fidelity.engine.recorder.requests_frame())
    table = ttft_components(fidelity.table.recorder.requests_frame())
    lines = ["| TTFT component | engine | simulator (table) |", "| --- | ---: | ---: |"]
    for key, label in _COMPONENTS:
        fmt = "{:.0f}" if key.endswith("requests") else "{:.2f}"
        cells = ["n/a" if not math.isfinite(v) else fmt.format(v)
                 for v in (engine[key], table[key])]
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def _num(value: float, unit: str) -> str:
    if not math.isfinite(value):
        return "n/a"
    return f"{value:.3f}" if unit == "req/s" else f"{value:.2f}"


def _pct(value: float) -> str:
    return "n/a" if not math.isfinite(value) else f"{value:+.1f}%"


def metrics_markdown(fidelity: Fidelity) -> str:
    """The metric table: engine, simulator with the table, its error, roofline, its error."""
    lines = ["| metric | engine | simulator (table) | error | simulator (roofline) | error |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for m in fidelity.metrics:
        lines.append(f"| {m.label} ({m.unit}) | {_num(m.engine, m.unit)} | "
                     f"{_num(m.table, m.unit)} | {_pct(m.table_error_pct)} | "
                     f"{_num(m.roofline, m.unit)} | {_pct(m.roofline_error_pct)} |")
    return "\n".join(lines)


def steps_markdown(errors: pd.DataFrame) -> str:
    lines = ["| steps | count | measured busy (s) | table: median / p90 APE, busy error | "
             "roofline: median / p90 APE, busy error |", "| --- | ---: | ---: | ---: | ---: |"]
    for r in errors.itertuples():
        lines.append(
            f"| {r.kind} | {r.steps} | {r.measured_s:.2f} | {r.table_median_ape_pct:.1f}% / "
            f"{r.table_p90_ape_pct:.1f}%, {r.table_busy_error_pct:+.1f}% | "
            f"{r.roofline_median_ape_pct:.1f}% / {r.roofline_p90_ape_pct:.1f}%, "
            f"{r.roofline_busy_error_pct:+.1f}% |")
    return "\n".join(lines)


def report_dict(fidelity: Fidelity) -> dict[str, Any]:
    """Everything the Markdown shows, as plain JSON values."""
    meta = fidelity.metadata
    return jsonable({
        "scenario": fidelity.scenario.name,
        "table": str(fidelity.table_dir),
        "device": meta.device_name,
        "table_metadata": meta.to_dict(),
        "metrics": [{"key": m.key, "label": m.label, "unit": m.unit, "engine": m.engine,
                     "table": m.table, "table_error_pct": m.table_error_pct,
                     "roofline": m.roofline, "roofline_error_pct": m.roofline_error_pct}
                    for m in fidelity.metrics],
        "steps": step_errors(fidelity.steps).to_dict(orient="records"),
        "ttft_components": {
            "engine": ttft_components(fidelity.engine.recorder.requests_frame()),
            "table": ttft_components(fidelity.table.recorder.requests_frame())},
        "info": fidelity.info,
    })


def markdown(fidelity: Fidelity, plots: bool = True) -> str:
    meta, info, scenario = fidelity.metadata, fidelity.info, fidelity.scenario
    worst = max((abs(m.table_error_pct) for m in fidelity.metrics
                 if math.isfinite(m.table_error_pct)), default=math.nan)
    lines = [
        f"# Fidelity: {scenario.name} on {meta.device_name}", "",
        f"The engine ({info.get('engine', 'engine')}, torch {info.get('torch_version')}, "
        f"{info.get('torch_threads')} thread(s)) served {fidelity.engine.summary['completed']} "
        f"requests of `{scenario.name}` on the wall clock; the simulator replayed the same "
        f"requests with the calibration table `{fidelity.table_dir.name}` "
        f"({meta.model_spec.name}, {meta.dtype}, block size {meta.block_size}, profiled "
        f"{meta.created}, commit {str(meta.engine_commit)[:12]}) and with the roofline model. "
        f"Validated at commit {str(info.get('commit', 'unknown'))[:12]} on "
        f"{meta.device_name}: a CPU table belongs to the machine that measured it.",
        *(["", f"The replay ran {info['bracketed']}, so the table averages the machine's "
              "speed around it."] if info.get("bracketed") else []),
        *(["", _speculation(info["speculation"])] if info.get("speculation") else []),
        "", f"Largest table error over these metrics: {worst:.1f}%.", "",
        metrics_markdown(fidelity), "",
        "Error = (simulator - engine) / engine. Per engine step, each model's prediction for "
        "the step's shape against its measured duration (the whole step cycle):", "",
        steps_markdown(step_errors(fidelity.steps)), "",
        "TTFT taken apart (a step after an idle wait starts at the arrival it waited for, in "
        "both worlds):", "", components_markdown(fidelity), "",
        _world(info.get("world_check")), "",
        f"Machine load (1/5/15-min averages) before the engine run "
        f"{_load(info.get('load_avg_before'))}, after {_load(info.get('load_avg_after'))}; "
        f"engine replay {info.get('engine_wall_s', math.nan):.1f} s over "
        f"{info.get('engine_steps')} steps.",
    ]
    if plots:
        lines += ["", "![latency CDFs](latency_cdf.png)", "",
                  "![step latency](step_latency.png)"]
    return "\n".join(lines) + "\n"


def _speculation(spec: dict[str, float]) -> str:
    drew = (f"each request's alpha from a Beta with the engine's pooled alpha "
            f"{spec['alpha']:.3f} as mean and its requests' spread (std "
            f"{spec['simulated_alpha_std']:.3f})" if spec.get("simulated_alpha_std")
            else f"acceptances with the engine's alpha {spec['alpha']:.3f}")
    return (f"Speculative decoding: the engine accepted {spec['acceptance_rate']:.1%} of its "
            f"drafts, {spec['tokens_per_verify']:.2f} tokens per verify"
            + (f" of {spec['drafts_per_verify']:.2f} drafts" if "drafts_per_verify" in spec
               else "")
            + f"; the simulator drew {drew}, so the comparison is of timing, not of an "
            "acceptance guess.")


def _world(check: str | None) -> str:
    if check == "exact":
        return ("The simulator fed the engine's own measured step times reproduces every "
                "request's timestamps exactly, so the errors above are the table's step "
                "errors alone.")
    return f"The simulator fed the engine's own step times: {check or 'not checked'}."


def _load(values: Any) -> str:
    return "n/a" if not values else " / ".join(f"{v:.2f}" for v in values)


def requests_frame(fidelity: Fidelity) -> pd.DataFrame:
    """request_id, then TTFT / TPOT / E2EL (ms) of each source, side by side."""
    merged = None
    for source, run in zip(_SOURCES, (fidelity.engine, fidelity.table, fidelity.roofline),
                           strict=True):
        frame = run.recorder.requests_frame()[["request_id", "ttft_ms", "tpot_ms", "e2el_ms"]]
        frame = frame.rename(columns={c: f"{c}_{source}" for c in ("ttft_ms", "tpot_ms",
                                                                   "e2el_ms")})
        merged = frame if merged is None else merged.merge(frame, on="request_id", how="outer")
    assert merged is not None
    return merged.sort_values("request_id").reset_index(drop=True)


def write_report(fidelity: Fidelity, out_dir: str | Path, plots: bool = True,
                 lands_at: Path | None = None) -> list[Path]:
    """Write the report files into `out_dir` (created); returns their paths. `lands_at`:
    where `out_dir` will lie once committed (a staged report names its table from there)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "fidelity.json", out / "fidelity.md", out / "steps.csv",
               out / "requests.csv"]
    body = report_dict(fidelity)
    body["table"] = os.path.relpath(fidelity.table_dir, (lands_at or out).resolve())  # travels
    written[0].write_text(json.dumps(body, indent=2) + "\n")
    written[1].write_text(markdown(fidelity, plots))
    fidelity.steps.round(6).to_csv(written[2], index=False, float_format="%.6g")
    requests = requests_frame(fidelity)
    requests.to_csv(written[3], index=False, float_format="%.6g")
    if plots:
        written += _plot(fidelity, requests, out)
    return written


def _plot(fidelity: Fidelity, requests: pd.DataFrame, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {"engine": ("black", "-"), "table": ("tab:blue", "--"),
              "roofline": ("tab:orange", ":")}
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, metric in zip(axes, ("ttft", "tpot", "e2el"), strict=True):
        for source in _SOURCES:
            values = np.sort(requests[f"{metric}_ms_{source}"].dropna().to_numpy())
            if values.size:
                color, line = styles[source]
                ax.step(values, np.arange(1, values.size + 1) / values.size, where="post",
                        color=color, linestyle=line, label=source)
        ax.set_xlabel(f"{metric.upper()} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{fidelity.scenario.name}: engine vs simulator")
    fig.tight_layout()
    cdf = out / "latency_cdf.png"
    fig.savefig(cdf, dpi=110)
    plt.close(fig)

    steps = fidelity.steps
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), sharex=True, sharey=True)
    colors = {"prefill": "tab:red", "decode": "tab:blue", "verify": "tab:purple",
              "mixed": "tab:green"}
    for ax, model in zip(axes, ("table", "roofline"), strict=True):
        for kind, color in colors.items():
            part = steps[steps["kind"] == kind]
            ax.scatter(part["measured_ms"], part[f"{model}_ms"], s=6, alpha=0.5, color=color,
                       label=kind)
        positive = steps[["measured_ms", "table_ms", "roofline_ms"]].to_numpy()
        positive = positive[positive > 0]
        if positive.size:
            low, high = positive.min(), positive.max()
            ax.plot([low, high], [low, high], color="black", linewidth=1, label="y = x")
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_xlabel("measured step (ms)")
        ax.set_ylabel(f"{model} prediction (ms)")
        ax.set_title(f"{model}: each engine step's shape")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    scatter = out / "step_latency.png"
    fig.savefig(scatter, dpi=110)
    plt.close(fig)
    return [cdf, scatter]
