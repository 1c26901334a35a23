"""The simulator's half of the GPU check: fidelity reports from what the GPU recorded.

    python -m calibrate.gpu.report OUT REPORT_DIR

OUT is what `python -m calibrate.gpu.check` left (results.json, summary.md,
<model>.tar.gz). For each model this unpacks the table and the engine's
recorded replay into REPORT_DIR/<model>/, rebuilds the replay's scenario
(refusing a plan that no longer equals what the scenario gives), feeds the
engine's own step times to the simulator, which must put every request on the
engine's timestamps (the world check: the engine's metrics are then those of
that resimulation), and compares the table's and the roofline's simulations
with the engine as `calibrate validate` does. It writes
REPORT_DIR/<model>/fidelity/, and REPORT_DIR/results.json and summary.md: the
GPU's results with the fidelity tables added.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
from pathlib import Path
from typing import Any

from calibrate.gpu.plain_replay import EngineRecord, ReplayPlan, plan_from_scenario, read_record
from calibrate.gpu.summary import write_summary
from calibrate.recorded import resimulate_setup
from calibrate.report import metrics_markdown, report_dict, write_report
from calibrate.validate import EngineReplay, Fidelity, compare


class ReportError(ValueError):
    """What the GPU left cannot be reported on (a user-facing message)."""


def engine_replay(scenario: Any, record: EngineRecord) -> EngineReplay:
    """The engine's run rebuilt from its recorded steps: the simulator on those step times,
    checked to put every request where the engine did."""
    from sim.assemble import kv_budget
    from sim.results.files.run import RunResult
    from sim.results.files.summary import run_summary

    setup = resimulate_setup(scenario, None, record.steps)
    recorder = setup.recorder
    frame = recorder.requests_frame()
    again = {c: frame[c].tolist() for c in frame.columns}
    if json.loads(json.dumps(again)) != record.requests:
        raise ReportError("the simulator on the engine's own step times did not reproduce the "
                          "engine's requests: the engine and the simulator disagree")
    budget = kv_budget(scenario)
    name = f"engine({record.info.get('device')}, recorded)"
    wall_s = float(record.info.get("engine_wall_s", 0.0))
    summary = run_summary(scenario, budget, recorder, [setup], name, wall_s)
    result = RunResult(scenario, summary, recorder, budget, setup.kv.num_usable_blocks,
                       name, wall_s, (recorder,))
    return EngineReplay(result, record.steps, dict(record.info))


def report_model(archive: Path, report_dir: Path) -> tuple[str, Fidelity | None, str]:
    """(model, its fidelity or None, what happened) for one <model>.tar.gz."""
    from sim.config.loader import validate_scenario

    model = archive.name.removesuffix(".tar.gz")
    target = report_dir / model
    if target.exists():
        shutil.rmtree(target)
    with tarfile.open(archive) as tar:
        tar.extractall(report_dir, filter="data")
    if not (target / "record.json").is_file():
        return model, None, "no engine record (the replay did not run)"
    plan = ReplayPlan.from_json((target / "plan.json").read_text())
    scenario = validate_scenario(plan.scenario, f"replay plan of {model}")
    if plan_from_scenario(scenario, plan.scenario) != plan:
        raise ReportError(f"{model}: the replay plan the GPU ran is not what its scenario gives "
                          "today (python -m calibrate.gpu.plan); its requests would differ")
    replay = engine_replay(scenario, read_record(target / "record.json"))
    fidelity = compare(scenario, None, target / "table", replay)
    write_report(fidelity, target / "fidelity", plots=True)
    return model, fidelity, "ok"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calibrate.gpu.report",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="the GPU check's output directory")
    parser.add_argument("report", help="where the reports go")
    args = parser.parse_args(argv)
    out, report_dir = Path(args.out), Path(args.report)
    if not (out / "results.json").is_file():
        print(f"error: out: {out} has no results.json; give the directory "
              "python -m calibrate.gpu.check wrote", file=sys.stderr)
        return 2
    results = json.loads((out / "results.json").read_text())
    report_dir.mkdir(parents=True, exist_ok=True)
    code = 0
    for archive in sorted(out.glob("*.tar.gz")):
        try:
            model, fidelity, note = report_model(archive, report_dir)
        except (ReportError, ValueError) as err:
            print(f"error: {err}", file=sys.stderr)
            code = 1
            continue
        log = results.setdefault("models", {}).setdefault(model, {})
        if fidelity is None:
            log["validate"] = note
            continue
        log["validate"] = report_dict(fidelity)
        log["fidelity_markdown"] = metrics_markdown(fidelity)
        print(f"\n== {model}: fidelity ({fidelity.metadata.device_name}, world check "
              f"{fidelity.info.get('world_check')}) ==\n{log['fidelity_markdown']}")
    write_summary(report_dir, results)
    print(f"\nwrote {report_dir / 'summary.md'}")
    return code


if __name__ == "__main__":
    sys.exit(main())
