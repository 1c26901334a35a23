"""The large fuzzing profile: tests/test_fuzz_cli.py's strategies, many examples, every finding.

    python benchmarks/fuzz_inputs.py --examples 200            # per input kind
    PYTHONPATH=OTHER_CHECKOUT python benchmarks/fuzz_inputs.py  # fuzz another sim

The suite's tests stop at the first failure and run a dozen examples each; this runs
`--examples` per kind (scenario files, --set overrides, traces, config.json, explain)
and records every input that breaks a rule (an exception escaping the CLI, a
traceback, another exit code than 0 or 2, memory over the bound, a staging directory
left, an unbounded message, a numpy warning, a run that served nothing called a
success, or a case running over --timeout seconds), then prints one line per distinct
finding with an example command. Exit status 1 when anything was found.
"""

from __future__ import annotations

import argparse
import importlib.util
import signal
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, given, seed, settings

HERE = Path(__file__).resolve().parents[1]


class CaseTimeout(Exception):
    """A case ran over --timeout seconds."""


def _load_suite():  # noqa: ANN202 - a module
    spec = importlib.util.spec_from_file_location("fuzz_cli", HERE / "tests" / "test_fuzz_cli.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["fuzz_cli"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _on_alarm(signum: int, frame: object) -> None:
    raise CaseTimeout


def fuzz(examples: int, timeout_s: float, rng_seed: int) -> tuple[Counter, dict, int]:
    """(findings counted by (kind, problem), an example argv per finding, cases run)."""
    suite = _load_suite()
    found: Counter = Counter()
    sample: dict = {}
    ran = 0
    strategies = {"scenario": suite.scenario_cases(), "--set": suite.set_cases(),
                  "trace": suite.trace_cases(), "config": suite.config_cases(),
                  "explain": suite.explain_cases()}
    signal.signal(signal.SIGALRM, _on_alarm)
    for strategy in strategies.values():
        @seed(rng_seed)
        @settings(max_examples=examples, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(strategy)
        def one(case: object) -> None:
            nonlocal ran
            ran += 1
            with tempfile.TemporaryDirectory() as folder:
                signal.setitimer(signal.ITIMER_REAL, timeout_s)
                said = ""
                try:
                    outcome = suite.run_case(case, Path(folder))
                    problem = suite.problem(outcome, case)
                    said = (outcome.err.strip().splitlines() or [""])[-1][:150]
                except CaseTimeout:
                    problem = f"ran over {timeout_s:g} s"
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            if problem is not None:
                key = (case.kind, problem.split("\n")[0][:110])  # type: ignore[attr-defined]
                found[key] += 1
                sample.setdefault(key, (" ".join(case.argv), said))  # type: ignore[attr-defined]

        one()
    return found, sample, ran


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200, help="examples per input kind")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per case")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import sim

    warnings.simplefilter("ignore", ResourceWarning)  # unclosed files of failed runs, at GC

    print(f"fuzzing sim from {sim.__file__}: {args.examples} examples per kind, "
          f"seed {args.seed}")
    started = time.perf_counter()
    found, sample, ran = fuzz(args.examples, args.timeout, args.seed)
    took = time.perf_counter() - started
    print(f"{ran} cases in {took:.0f} s; {len(found)} distinct findings")
    for (kind, problem), count in sorted(found.items()):
        argv, said = sample[(kind, problem)]
        print(f"  [{kind}] x{count}: {problem}\n      e.g. servesim {argv}"
              + (f"\n      stderr: {said}" if said else ""))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
