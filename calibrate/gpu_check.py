"""One prepared GPU run: profile, fit and validate two models, inside a hard time limit.

    python -m calibrate.gpu_check OUT_DIR            # an H100/H200: about 7 minutes
    python -m calibrate.gpu_check OUT_DIR --smoke    # any CPU: the same path, tiny sizes

For each model (Llama-3-8B and Qwen2.5-1.5B shapes, random weights, bf16):
`calibrate profile` on CUDA within a time budget, `calibrate fit`, then
`calibrate validate` on a 200-request replay of the Azure LLM 2023
conversation trace (builtin:azure_conv, or `--trace FILE`). Everything goes under OUT_DIR:
OUT_DIR/<model>/table (the calibration table), OUT_DIR/<model>/fidelity (the
report), OUT_DIR/summary.md and summary.json (both fidelity tables, the
device, versions and timings), and the fidelity tables are printed.

The time guard: phases get budgets from what is left of `--deadline-s`; a
validation that cannot finish in time is skipped; the deadline is checked
before every model and phase, and once it has passed the run stops there,
writes the summary so far and exits with 3. A SIGALRM at the deadline is only
the backstop for a phase that overruns its budget (repeated until it lands).
"""

from __future__ import annotations

import argparse
import gc
import json
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from calibrate.fit import fit_table, format_report  # noqa: E402
from calibrate.profile import ProfileSettings, profile_engine  # noqa: E402
from calibrate.report import metrics_markdown, report_dict, write_report  # noqa: E402
from calibrate.validate import validate  # noqa: E402
from sim.config.loader import validate_scenario  # noqa: E402
from sim.workload import make_requests  # noqa: E402

TRACE = "builtin:azure_conv"  # shipped with servesim (sim/workload/data/traces)
CPU_HOST = {"name": "cpu-host", "bf16_flops_per_s": 5.0e10, "memory_bytes": 268435456,
            "memory_bandwidth_bytes_per_s": 1.0e10,
            "interconnect_bandwidth_bytes_per_s": 1.0e10,
            "host_link_bandwidth_bytes_per_s": 1.0e10}


@dataclass(frozen=True, slots=True)
class Plan:
    """What one run does; `full()` is the GPU run, `smoke()` the same path on a CPU."""

    device: str
    models: tuple[tuple[str, float], ...]  # (model, profile budget in seconds)
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    repeats: int
    passes: int
    num_requests: int
    time_scale: float
    validate_overhead_s: float  # engine build + graph capture + the two simulations

    @staticmethod
    def full() -> Plan:
        return Plan("cuda", (("llama-3-8b", 110.0), ("qwen2.5-1.5b", 55.0)), 2048, 128, 8192,
                    5, 1, 200, 2.0, 45.0)

    @staticmethod
    def smoke() -> Plan:
        return Plan("cpu", (("tiny", 4.0),), 256, 16, 2048, 2, 1, 4, 16.0, 10.0)


class TimeUp(Exception):
    """The deadline passed."""


class Alarm:
    """The SIGALRM handler: raise TimeUp, remember that it fired, and fire again shortly.

    Python prints and drops an exception raised while a finalizer or gc callback
    runs, so one alarm may never reach `main`: it re-arms until caught, and `main`
    also reads `fired` when the work ended without seeing it.
    """

    rearm_s = 0.5

    def __init__(self) -> None:
        self.fired = False

    def __call__(self, _signum: int, _frame: Any) -> None:
        self.fired = True
        signal.setitimer(signal.ITIMER_REAL, self.rearm_s)
        raise TimeUp


class Deadline:
    """The time guard's clock: `check()` at safe points raises TimeUp once the deadline has
    passed. `clock` (seconds) is the monotonic clock, or a test's fake one."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.seconds = seconds
        self.at_s = clock() + seconds
        self.fired = False

    def left_s(self) -> float:
        return self.at_s - self.clock()

    def check(self) -> None:
        if self.left_s() <= 0:
            self.fired = True
            raise TimeUp


def find_trace(explicit: str | None) -> tuple[str, str]:
    """(workload trace path, what it is): `--trace FILE`, else the shipped Azure trace."""
    if explicit is None:
        return TRACE, f"Azure LLM 2023 conversation trace ({TRACE})"
    path = Path(explicit)
    if not path.is_file():
        raise FileNotFoundError(f"--trace: {explicit} is not a file")
    return str(path.resolve()), f"trace {path}"


def scenario_for(model: str, plan: Plan, trace: str) -> Any:
    """The validation scenario: the trace's first requests on this device, the profile's
    scheduler budgets."""
    if plan.device == "cuda":
        name = torch.cuda.get_device_name()
        base = "h200" if "H200" in name.upper() else "h100-sxm"
        memory = torch.cuda.get_device_properties(0).total_memory
        hardware: dict[str, Any] = {"gpu": {"base": base, "name": name, "memory_bytes": memory},
                                    "memory_utilization": 0.5}
    else:
        hardware = {"gpu": CPU_HOST, "memory_utilization": 0.5}
    raw = {
        "name": f"gpu_check_{model}", "seed": 0, "model": model, "hardware": hardware,
        "scheduler": {"policy": "continuous", "max_num_seqs": plan.max_num_seqs,
                      "max_num_batched_tokens": plan.max_num_batched_tokens,
                      "max_model_len": plan.max_model_len},
        "kv": {"block_size": 16},
        "engine": {"device": plan.device, "dtype": "auto", "cuda_graphs": True,
                   "sampling": {"temperature": 0.0}},
        "workload": {"trace": {"path": trace, "time_scale": plan.time_scale},
                     "num_requests": plan.num_requests},
        "slo": {"ttft_ms": 500, "tpot_ms": 50},
    }
    return validate_scenario(raw, f"gpu_check scenario for {model}")


def _free_device() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_model(model: str, budget_s: float, plan: Plan, trace: str, out: Path,
              guard: Deadline, log: dict[str, Any]) -> None:
    """Profile, fit and validate one model; fills `log` as each phase ends, and checks the
    guard before each phase starts."""
    table = out / model / "table"
    started = time.perf_counter()
    settings = ProfileSettings(model=model, device=plan.device, block_size=16,
                               max_num_batched_tokens=plan.max_num_batched_tokens,
                               max_num_seqs=plan.max_num_seqs, max_model_len=plan.max_model_len,
                               budget_s=max(1.0, budget_s), repeats=plan.repeats,
                               passes=plan.passes)
    log["phase"] = "profile"
    guard.check()
    result = profile_engine(settings, table, show_progress=True)
    _free_device()
    log["profile"] = {"points": len(result.measurements), "grid_points": result.grid_points,
                      "measure_s": result.measure_s, "setup_s": result.setup_s,
                      "device": result.metadata.device_name, "table": str(table)}
    log["phase"] = "fit"
    guard.check()
    report = fit_table(table)
    print(f"\n== {model}: fit ==\n{format_report(report)}", flush=True)
    log["fit"] = [{"kind": e.kind, "held_out": e.points, "mean_ape_pct": e.mean_ape_pct,
                   "p90_ape_pct": e.p90_ape_pct} for e in report.fit.held_out]
    scenario = scenario_for(model, plan, trace)
    span_s = max((r.arrival_s for r in make_requests(scenario.workload, scenario.seed)),
                 default=0.0)
    need_s = span_s * 1.3 + plan.validate_overhead_s
    log["phase"] = "validate"
    guard.check()
    left_s = guard.left_s()
    if need_s > left_s:
        log["validate"] = f"skipped: needs about {need_s:.0f} s, {left_s:.0f} s left"
        print(f"== {model}: validation {log['validate']}", flush=True)
        return
    fidelity = validate(scenario, None, table, show_progress=True)
    write_report(fidelity, out / model / "fidelity", plots=True)
    log["validate"] = report_dict(fidelity)
    log["table_markdown"] = metrics_markdown(fidelity)
    print(f"\n== {model}: fidelity ({fidelity.metadata.device_name}) ==\n"
          f"{log['table_markdown']}", flush=True)
    log["seconds"] = time.perf_counter() - started
    _free_device()


def write_summary(out: Path, logs: dict[str, dict[str, Any]], info: dict[str, Any]) -> Path:
    lines = [f"# GPU calibration check on {info.get('device')}", "",
             f"torch {info.get('torch')}, CUDA {info.get('cuda')}; workload: "
             f"{info.get('trace')}, {info.get('requests')} requests at time scale "
             f"{info.get('time_scale')}; {info.get('elapsed_s', 0):.0f} s in all"
             + (f"; {info['stopped']}" if info.get("stopped") else ""), ""]
    for model, log in logs.items():
        lines += [f"## {model}", ""]
        if "profile" in log:
            p = log["profile"]
            lines.append(f"Profiled {p['points']} of {p['grid_points']} shapes in "
                         f"{p['measure_s']:.0f} s (+{p['setup_s']:.0f} s setup).")
        if "fit" in log:
            held = next((e for e in log["fit"] if e["kind"] == "all"), None)
            if held:
                lines.append(f"Fit held-out error: mean {held['mean_ape_pct']:.1f}%, "
                             f"p90 {held['p90_ape_pct']:.1f}%.")
        lines += ["", log.get("table_markdown", f"Validation: {log.get('validate', 'not run')}"),
                  ""]
    path = out / "summary.md"
    path.write_text("\n".join(lines))
    slim = {m: {k: v for k, v in log.items() if k != "table_markdown"}
            for m, log in logs.items()}
    (out / "summary.json").write_text(json.dumps({"info": info, "models": slim}, indent=2,
                                                 default=str) + "\n")
    return path


def main(argv: list[str] | None = None, clock: Callable[[], float] | None = None) -> int:
    """The script; `clock` None = the monotonic clock with the SIGALRM backstop, else that
    clock alone (tests: a fake clock makes the guard's decisions independent of speed)."""
    parser = argparse.ArgumentParser(prog="python -m calibrate.gpu_check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="output directory")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes on the CPU: checks the whole path in a minute")
    parser.add_argument("--deadline-s", type=float, default=None,
                        help="hard limit for everything (default 450; smoke 240)")
    parser.add_argument("--trace", default=None,
                        help=f"a trace file to validate on (default: {TRACE})")
    args = parser.parse_args(argv)
    plan = Plan.smoke() if args.smoke else Plan.full()
    if plan.device == "cuda" and not torch.cuda.is_available():
        print(f"error: no CUDA device visible to torch {torch.__version__}; run with --smoke "
              "for the CPU path", file=sys.stderr)
        return 2
    try:
        trace, trace_note = find_trace(args.trace)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    deadline_s = args.deadline_s or (240.0 if args.smoke else 450.0)
    guard = Deadline(deadline_s, clock or time.perf_counter)
    info: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if plan.device == "cuda" else "cpu (smoke)",
        "torch": torch.__version__, "cuda": torch.version.cuda, "trace": trace_note,
        "requests": plan.num_requests, "time_scale": plan.time_scale,
        "deadline_s": deadline_s}
    logs: dict[str, dict[str, Any]] = {}
    alarm = Alarm()
    previous = signal.signal(signal.SIGALRM, alarm) if clock is None else None
    if clock is None:
        signal.setitimer(signal.ITIMER_REAL, deadline_s)
    try:
        for i, (model, budget_s) in enumerate(plan.models):
            logs[model] = {"phase": "profile"}
            guard.check()
            later = sum(b + plan.validate_overhead_s + 60 for _, b in plan.models[i + 1:])
            budget = min(budget_s, guard.left_s() - later - 90)
            run_model(model, budget, plan, trace, out, guard, logs[model])
            logs[model].pop("phase", None)
    except TimeUp:
        pass
    finally:
        if clock is None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    code = 0
    if alarm.fired or guard.fired:
        phase = next((f"{m} {log['phase']}" for m, log in reversed(logs.items())
                      if "phase" in log), "setup")
        when = "during" if alarm.fired and not guard.fired else "before"
        info["stopped"] = f"stopped by the {deadline_s:.0f} s time guard {when} {phase}"
        print(f"\n{info['stopped']}", file=sys.stderr)
        code = 3
    info["elapsed_s"] = time.perf_counter() - started
    summary = write_summary(out, logs, info)
    print(f"\nwrote {summary} ({info['elapsed_s']:.0f} s)")
    return code


if __name__ == "__main__":
    sys.exit(main())
