"""A live server's measured run against the simulator: the fidelity report of `servesim load
--compare`.

The simulator replays what the client actually sent: each request at the
instant it was sent, with the prompt and output token counts the server
reported, through the scenario's scheduler and latency model. The report is
the engine's (calibrate validate) in form: fidelity.md with the metric table,
fidelity.json, requests.csv side by side, latency_cdf.png.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sim.assemble import build_latency, build_replica, kv_budget, synchronous
from sim.config.scenario import Scenario
from sim.core.request import Request
from sim.latency.draft import with_draft
from sim.plots.serve import plot_measured_vs_simulated
from sim.results.files.fidelity import METRICS, relative_error_pct
from sim.results.files.report import jsonable
from sim.results.files.summary import run_summary
from sim.results.record.recorder import RunRecorder
from sim.serve.load import Measured
from sim.world.fleet import simulate


@dataclass(frozen=True, slots=True)
class LoadFidelity:
    """Measured (client side) and simulated summaries and requests of one load run."""

    scenario: Scenario
    target: str
    measured: dict[str, Any]
    simulated: dict[str, Any]
    requests: pd.DataFrame  # request_id, {ttft,tpot,e2el}_ms_{measured,simulated}

    def rows(self) -> list[dict[str, Any]]:
        return [{"key": key, "label": label, "unit": unit,
                 "measured": self.measured.get(key, math.nan),
                 "simulated": self.simulated.get(key, math.nan),
                 "error_pct": relative_error_pct(self.simulated.get(key, math.nan),
                                                 self.measured.get(key, math.nan))}
                for key, label, unit in METRICS]


def replayed_requests(measured: Sequence[Measured], workload: Sequence[Request]
                      ) -> list[Request]:
    """What the server was sent, as the simulator's requests: sent instants, served counts."""
    by_id = {r.request_id: r for r in workload}
    out = []
    for m in sorted(measured, key=lambda m: m.send_s):
        if m.error is not None or not m.chunk_s:
            continue
        original = by_id[m.request_id]
        prompt = m.usage_prompt or m.prompt_tokens
        ids = original.prompt_token_ids if original.prompt_token_ids is not None and \
            len(original.prompt_token_ids) == prompt else None
        out.append(Request(m.request_id, m.send_s, prompt,
                           max(1, m.usage_completion or len(m.chunk_s)), ids))
    return out


def simulate_measured(scenario: Scenario, requests: Sequence[Request],
                      base_dir: Path | None = None) -> dict[str, Any]:
    """The scenario's one replica serving exactly `requests`, stepped synchronously as
    `servesim serve` steps it; its summary."""
    scenario = synchronous(scenario)
    budget = kv_budget(scenario)
    parts = build_replica(scenario, budget)
    latency = with_draft(scenario, build_latency(scenario, base_dir))
    recorder = RunRecorder()
    simulate(requests, parts.scheduler, latency, recorder, links=parts.links)
    return run_summary(scenario, budget, recorder, [parts], latency.name, 0.0, [recorder]) | {
        "_requests": recorder.requests_frame()}


def compare(scenario: Scenario, target: str, measured_summary: dict[str, Any],
            measured_requests: pd.DataFrame, replayed: Sequence[Request],
            base_dir: Path | None = None) -> LoadFidelity:
    simulated = simulate_measured(scenario, replayed, base_dir)
    sim_frame = simulated.pop("_requests")
    cols = ["request_id", "ttft_ms", "tpot_ms", "e2el_ms"]
    merged = measured_requests[cols].merge(sim_frame[cols], on="request_id", how="outer",
                                           suffixes=("_measured", "_simulated"))
    return LoadFidelity(scenario, target, measured_summary, simulated,
                        merged.sort_values("request_id").reset_index(drop=True))


def _num(value: float, unit: str) -> str:
    if not math.isfinite(value):
        return "n/a"
    return f"{value:.2f}" if unit != "ms" else f"{value:.1f}"


def markdown(fidelity: LoadFidelity, plots: bool = True) -> str:
    rows = fidelity.rows()
    worst = max((abs(r["error_pct"]) for r in rows if math.isfinite(r["error_pct"])),
                default=math.nan)
    lines = [f"# Fidelity: {fidelity.scenario.name} against {fidelity.target}", "",
             f"`servesim load` sent {fidelity.measured.get('completed', 0)} requests of "
             f"`{fidelity.scenario.name}` to {fidelity.target} and measured them on the "
             "client; the simulator replayed the same requests (sent instants, served token "
             f"counts) with its {fidelity.simulated.get('latency_model')} latency model.", "",
             f"Largest error over these metrics: {worst:.1f}%.", "",
             "| metric | measured | simulated | error |", "| --- | ---: | ---: | ---: |"]
    for r in rows:
        err = "n/a" if not math.isfinite(r["error_pct"]) else f"{r['error_pct']:+.1f}%"
        lines.append(f"| {r['label']} ({r['unit']}) | {_num(r['measured'], r['unit'])} | "
                     f"{_num(r['simulated'], r['unit'])} | {err} |")
    lines += ["", "Error = (simulator - measured) / measured. The client's TTFT includes the "
                  "network and HTTP time the simulator does not model."]
    if plots:
        lines += ["", "![latency CDFs](latency_cdf.png)"]
    return "\n".join(lines) + "\n"


def write_report(fidelity: LoadFidelity, out_dir: Path, plots: bool = True) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "fidelity.json", out / "fidelity.md", out / "fidelity_requests.csv"]
    written[0].write_text(json.dumps(jsonable({
        "scenario": fidelity.scenario.name, "target": fidelity.target,
        "metrics": fidelity.rows()}), indent=2) + "\n")
    written[1].write_text(markdown(fidelity, plots))
    fidelity.requests.to_csv(written[2], index=False, float_format="%.6g")
    if plots:
        written.append(plot_measured_vs_simulated(
            fidelity.requests, out / "latency_cdf.png",
            f"{fidelity.scenario.name}: measured on {fidelity.target} vs simulated"))
    return written
