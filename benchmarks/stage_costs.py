"""Where a simulation point's time goes, stage by stage: calls, µs a call, share of the wall.

Why: bench_sim.py's ceiling (steps / events) says how far fewer events could
take a point; what holds a point below it is what each event costs. A request
passes through the same few stages (its arrival, its admission step, the decode
runs it rides in, its finish), so their costs per call bound what any change to
one of them can give: a stage's share is the most that making it free would save.

Each stage is a method timed by a wrapper (its own time: the stages it calls are
taken out), in one process of this checkout started as `servesim run` starts
(bench_point.one_point); "other" is the rest of the wall (SimPy, the arrival
process, the replica's loop, setup). The wrappers cost a little themselves, so
the same point also runs plain in a process of its own, and both walls are shown.

    python benchmarks/stage_costs.py 10000 2          # a table; --json F also writes it
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench_point import one_point  # this folder is the script's sys.path[0]

# (stage, module, class, method): a decode run's, a plain step's, then the recorders'
STAGES = (
    ("run: describe", "sim.core.schedulers.continuous", "ContinuousScheduler", "decode_run"),
    ("run: price", "sim.world.fast_forward", "ReplicaFastForward", "_price"),
    ("run: begin", "sim.world.fast_forward", "ReplicaFastForward", "_begin_run"),
    ("run: apply", "sim.core.schedulers.continuous", "ContinuousScheduler", "advance_decodes"),
    ("run: record", "sim.world.fast_forward", "ReplicaFastForward", "_record"),
    ("run: buffer", "sim.results.record.recorder", "RunRecorder", "record_decode_run"),
    ("run: end", "sim.world.fast_forward", "ReplicaFastForward", "_end_run"),
    ("run: catch up", "sim.world.fast_forward", "ReplicaFastForward", "catch_up"),
    ("run: observer", "sim.observe.observer", "ReplicaObserver", "on_decode_steps"),
    ("step: schedule", "sim.core.schedulers.continuous", "ContinuousScheduler", "schedule"),
    ("step: price", "sim.latency.roofline", "RooflineLatency", "step_time"),
    ("step: done", "sim.core.schedulers.continuous", "ContinuousScheduler", "on_step_done"),
    ("step: record", "sim.results.record.recorder", "RunRecorder", "record_step"),
    ("step: observer", "sim.observe.observer", "ReplicaObserver", "on_step"),
    ("arrival", "sim.world.replica", "Replica", "submit"),
    ("arrival: observer", "sim.observe.observer", "ReplicaObserver", "on_arrival"),
    ("finish: record", "sim.results.record.recorder", "RunRecorder", "record_finished"),
    ("fold: steps", "sim.results.record.recorder", "RunRecorder", "_fold"),
    ("fold: requests", "sim.results.record.recorder", "RunRecorder", "_fold_requests"),
)


class Stages:
    """Own time and calls of each stage; `running` holds the time of the stages called
    by the ones in progress, innermost last."""

    def __init__(self, names: tuple[str, ...] = tuple(name for name, *_ in STAGES),
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.own_s = dict.fromkeys(names, 0.0)
        self.calls = dict.fromkeys(names, 0)
        self.running: list[float] = []
        self.clock = clock

    def wrap(self, name: str, method: Callable) -> Callable:
        own_s, calls, running, clock = self.own_s, self.calls, self.running, self.clock

        def timed(*args: object, **kwargs: object) -> object:
            running.append(0.0)
            started = clock()
            try:
                return method(*args, **kwargs)
            finally:
                spent = clock() - started
                own_s[name] += spent - running.pop()
                calls[name] += 1
                if running:
                    running[-1] += spent

        return timed

    def install(self) -> None:
        """Wrap every stage's method on its class (before the run: bound methods taken
        during it are the wrappers)."""
        for name, module, cls, method in STAGES:
            owner = getattr(importlib.import_module(module), cls)
            setattr(owner, method, self.wrap(name, getattr(owner, method)))


def staged_point(num_requests: int, rate: float) -> dict:
    """The point in this process with every stage timed: its row and the stages' table."""
    stages = Stages()
    stages.install()
    row = one_point(num_requests, rate)
    wall_s, n = row["wall_s"], num_requests
    table = [{"stage": name, "calls": stages.calls[name], "own_s": own,
              "us_per_call": own / stages.calls[name] * 1e6 if stages.calls[name] else 0.0,
              "us_per_request": own / n * 1e6, "share": own / wall_s}
             for name, own in stages.own_s.items()]
    other_s = wall_s - sum(stages.own_s.values())
    table.append({"stage": "other", "calls": 0, "own_s": other_s, "us_per_call": 0.0,
                  "us_per_request": other_s / n * 1e6, "share": other_s / wall_s})
    return {"n": n, "rate": rate, "staged_wall_s": wall_s,
            "decode_runs": row.get("decode_runs"), "steps": row["steps"], "stages": table}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("requests", type=int)
    parser.add_argument("rate", type=float, help="requests per second")
    parser.add_argument("--json", type=Path, help="also write the table here")
    args = parser.parse_args()
    plain = subprocess.run([sys.executable, str(Path(__file__).with_name("bench_sim.py")),
                            "--point", str(args.requests), str(args.rate)],
                           check=True, capture_output=True, text=True)
    result = staged_point(args.requests, args.rate)
    result["plain_wall_s"] = json.loads(plain.stdout.strip().splitlines()[-1])["wall_s"]
    print(f"{args.requests} requests at {args.rate:g} req/s: {result['steps']} steps, "
          f"{result['decode_runs']} decode runs; wall {result['plain_wall_s']:.2f} s plain, "
          f"{result['staged_wall_s']:.2f} s timed by stage")
    print(f"{'stage':18} {'calls':>8} {'µs/call':>8} {'µs/request':>10} {'share':>6}")
    for line in sorted(result["stages"], key=lambda line: -line["own_s"]):
        print(f"{line['stage']:18} {line['calls']:8d} {line['us_per_call']:8.1f} "
              f"{line['us_per_request']:10.1f} {line['share']:6.1%}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
