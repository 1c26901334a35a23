"""One prepared GPU run: correctness, speed against measured floors, then calibration.

    python -m calibrate.gpu.check OUT --smoke   # 45 s on a GPU (tiny sizes); any CPU in CI
    python -m calibrate.gpu.check OUT           # an H100/H200: capped at 7 minutes
    python -m calibrate.gpu.report OUT REPORT   # afterwards, where the simulator runs

It needs torch and the project only: no simpy, no pydantic (a bare GPU image
has neither). In order, each phase writing its results as it ends:

1. correctness (calibrate/gpu/correct.py): the attention kernel in bf16 against
   a dense reference; CUDA-graph decode against eager on the same inputs
   (identical greedy tokens); exactly one host wait per engine step (torch's
   sync debug mode); a decode step's allocation against its live KV.
2. floors and speed (calibrate/gpu/speed.py): copy bandwidth and bf16 matmul
   rate, then Llama-3-8B decode at batch 1/8/64/256 x 512/4k context (and 64 x
   2k), prefill of 512/2k/8k tokens, each against its floor and the targets;
   the same greedy batch through transformers' `generate` as a ratio.
3. calibration, per model (Llama-3-8B, Qwen2.5-1.5B): `calibrate profile`
   within a budget, `calibrate fit`, then the engine's replay of its committed
   plan (calibrate/gpu/plans/, 200 Azure-conversation requests) recorded as
   JSON. The simulator's side of the fidelity report runs afterwards,
   elsewhere, from these files (calibrate/gpu/report.py).

Under OUT: results.json and summary.md (rewritten after every phase) and one
<model>.tar.gz per model (table + engine record, rewritten as each part ends),
so a stop keeps what was done and OUT stays within a few files.

The time guard: phases get budgets from what is left of the deadline; a replay
that cannot finish in time is skipped; the deadline is checked before every
phase, and once it has passed the run stops there, writes what it has and
exits with 3. A SIGALRM at the deadline is only the backstop for a phase
that overruns (repeated until it lands).
"""

from __future__ import annotations

import argparse
import gc
import io
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from calibrate.fit import fit_table, format_report  # noqa: E402
from calibrate.gpu.guard import Alarm, Deadline, Plan, TimeUp  # noqa: E402
from calibrate.gpu.phases import correctness, speed  # noqa: E402
from calibrate.gpu.plain_replay import run_plan, write_record  # noqa: E402
from calibrate.gpu.plan import PLAN_DIR, load_plan  # noqa: E402
from calibrate.gpu.summary import write_summary  # noqa: E402
from calibrate.profile.rig import git_commit  # noqa: E402
from calibrate.profile.run import ProfileSettings, profile_engine  # noqa: E402

GIB = 2**30


def _free_device() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def environment(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                            "python": sys.version.split()[0], "commit": git_commit()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info |= {"device": props.name, "multiprocessors": props.multi_processor_count,
                 "memory_GiB": props.total_memory / GIB}
        try:
            done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,"
                                   "clocks.max.mem", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=10, check=False)
            info["nvidia_smi"] = done.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
        try:
            import triton

            info["triton"] = triton.__version__
        except ImportError:
            info["triton"] = None
    else:
        info["device"] = "cpu"
    return info


def _phase(results: dict[str, Any], name: str, work: Callable[[], Any]) -> None:
    """Run one phase: its result, or its error, goes into `results[name]`."""
    started = time.perf_counter()
    try:
        results[name] = work()
    except TimeUp:
        raise
    except Exception as err:  # noqa: BLE001 - a failed check is a result; the run goes on
        partial = results.get(name) if isinstance(results.get(name), dict) else {}
        results[name] = {**partial, "error": f"{type(err).__name__}: {err}",
                         "traceback": traceback.format_exc(limit=6)}
        print(f"== {name}: FAILED {err}", file=sys.stderr, flush=True)
    if isinstance(results[name], dict):
        results[name]["seconds"] = time.perf_counter() - started
    _free_device()


def _pack(out: Path, model: str, work: Path) -> None:
    """Rewrite OUT/<model>.tar.gz from `work` (atomically: a stop keeps the last one)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(work, arcname=model)
    partial = out / f".{model}.tar.gz.partial"
    partial.write_bytes(buffer.getvalue())
    partial.replace(out / f"{model}.tar.gz")


def calibrate_model(model: str, budget_s: float, plan: Plan, out: Path, plan_dir: Path,
                    guard: Deadline, log: dict[str, Any]) -> None:
    """Profile, fit and replay one model; fills `log` and the model's archive as each part
    ends, and checks the guard before each part starts."""
    work = Path(tempfile.mkdtemp(prefix=f"gpu_check_{model}_"))
    table = work / "table"
    replay = load_plan(model, plan_dir)
    (work / "plan.json").write_text(replay.to_json())
    settings = ProfileSettings(model=model, device=plan.device, block_size=replay.block_size,
                               max_num_batched_tokens=plan.max_num_batched_tokens,
                               max_num_seqs=plan.max_num_seqs, max_model_len=plan.max_model_len,
                               budget_s=max(1.0, budget_s), repeats=plan.repeats, passes=1)
    log["phase"] = "profile"
    guard.check()
    result = profile_engine(settings, table, show_progress=True)
    _free_device()
    log["profile"] = {"points": len(result.measurements), "grid_points": result.grid_points,
                      "measure_s": result.measure_s, "setup_s": result.setup_s,
                      "device": result.metadata.device_name}
    _pack(out, model, work)
    log["phase"] = "fit"
    guard.check()
    report = fit_table(table)
    print(f"\n== {model}: fit ==\n{format_report(report)}", flush=True)
    log["fit"] = [{"kind": e.kind, "held_out": e.points, "mean_ape_pct": e.mean_ape_pct,
                   "p90_ape_pct": e.p90_ape_pct} for e in report.fit.held_out]
    _pack(out, model, work)
    log["phase"] = "replay"
    guard.check()
    span_s = max((r[1] for r in replay.requests), default=0.0)
    need_s = span_s * 1.3 + plan.replay_overhead_s
    left_s = guard.left_s()
    if need_s > left_s:
        log["replay"] = f"skipped: needs about {need_s:.0f} s, {left_s:.0f} s left"
        print(f"== {model}: replay {log['replay']}", flush=True)
        return
    record = run_plan(replay, torch.device(plan.device))
    write_record(record, work / "record.json")
    _free_device()
    log["replay"] = {"steps": len(record.steps), "requests": len(record.requests["request_id"]),
                     **record.info}
    _pack(out, model, work)


def main(argv: list[str] | None = None, clock: Callable[[], float] | None = None) -> int:
    """The script; `clock` None = the monotonic clock with the SIGALRM backstop, else that
    clock alone (tests: a fake clock makes the guard's decisions independent of speed)."""
    parser = argparse.ArgumentParser(prog="python -m calibrate.gpu.check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="output directory")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes on this machine's device (45 s on a GPU; CPU in CI)")
    parser.add_argument("--deadline-s", type=float, default=None,
                        help="hard limit for everything (default 420; smoke 45 on a GPU, "
                             "240 on a CPU)")
    parser.add_argument("--plans", default=str(PLAN_DIR),
                        help="directory of replay plans (default: calibrate/gpu/plans)")
    args = parser.parse_args(argv)
    device_name = "cuda" if torch.cuda.is_available() else "cpu"
    plan = Plan.tiny(device_name) if args.smoke else Plan.full()
    if plan.device == "cuda" and not torch.cuda.is_available():
        print(f"error: no CUDA device visible to torch {torch.__version__}; run with --smoke "
              "for the CPU path", file=sys.stderr)
        return 2
    plan_dir = Path(args.plans)
    missing = [m for m, _ in plan.models if not (plan_dir / f"{m}.json").is_file()]
    if missing:
        print(f"error: --plans: {plan_dir} has no replay plan for {', '.join(missing)}; "
              "python -m calibrate.gpu.plan writes them", file=sys.stderr)
        return 2
    if args.deadline_s is not None and not args.deadline_s > 0:
        print(f"error: --deadline-s must be seconds > 0, got {args.deadline_s}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(plan.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    started = time.perf_counter()
    deadline_s = args.deadline_s or plan.deadline_s
    guard = Deadline(deadline_s, clock or time.perf_counter)
    from gpu_engine.attention import attention_backend

    backend = attention_backend(device)
    results: dict[str, Any] = {"info": {**environment(device), "smoke": plan.smoke,
                                        "deadline_s": deadline_s, "dtype": str(dtype)},
                               "models": {}}
    alarm = Alarm()
    previous = signal.signal(signal.SIGALRM, alarm) if clock is None else None
    if clock is None:
        signal.setitimer(signal.ITIMER_REAL, deadline_s)

    def save() -> None:
        results["info"]["elapsed_s"] = time.perf_counter() - started
        write_summary(out, results)

    try:
        save()
        guard.check()
        _phase(results, "correctness", lambda: correctness(plan, device, dtype, backend))
        save()
        guard.check()
        _phase(results, "speed", lambda: speed(plan, device, dtype, results, guard))
        save()
        for i, (model, budget_s) in enumerate(plan.models):
            log: dict[str, Any] = {"phase": "profile"}
            results["models"][model] = log
            guard.check()
            later = sum(b + plan.replay_overhead_s + 45 for _, b in plan.models[i + 1:])
            budget = min(budget_s, guard.left_s() - later - 60)
            try:
                calibrate_model(model, budget, plan, out, plan_dir, guard, log)
            except TimeUp:
                raise
            except Exception as err:  # noqa: BLE001 - recorded; the next model still runs
                log["error"] = f"{type(err).__name__}: {err}"
                log["traceback"] = traceback.format_exc(limit=6)
                print(f"== {model}: FAILED {err}", file=sys.stderr, flush=True)
            log.pop("phase", None)
            save()
    except TimeUp:
        pass
    finally:
        if clock is None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    code = 0
    if alarm.fired or guard.fired:
        phase = next((f"{m} {log['phase']}" for m, log in reversed(results["models"].items())
                      if "phase" in log), "correctness or speed")
        when = "during" if alarm.fired and not guard.fired else "before"
        results["info"]["stopped"] = f"stopped by the {deadline_s:.0f} s time guard {when} {phase}"
        print(f"\n{results['info']['stopped']}", file=sys.stderr)
        code = 3
    save()
    print((out / "summary.md").read_text(), flush=True)
    print(f"wrote {out} ({results['info']['elapsed_s']:.0f} s)")
    return code


if __name__ == "__main__":
    sys.exit(main())
