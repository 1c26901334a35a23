"""Compare servesim with recorded vLLM traces, step for step; print the first differing step.

    python -m parity.compare [--trace FILE] [--only NAME ...]
                             [--show N]

A trace of the parallel-sampling configurations (its metadata names them, e.g.
traces/vllm-0.32.0-parallel-sampling.jsonl.gz) replays those (parity/parallel.py).
A trace recorded with async scheduling (its metadata says so, e.g.
traces/vllm-0.32.0-async.jsonl.gz) is replayed with servesim's scheduler in
async mode through the async loop, on the configurations it holds.

Exit status 0 when every configuration matches, 1 when some differ, 2 on bad
input.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path

from parity.configs import GENERATOR_VERSION, ParityConfig, generate_configs, runs_async
from parity.parallel import FAMILY as PARALLEL_FAMILY
from parity.parallel import generate_parallel_configs
from parity.steps import RunResult, StepRecord, run_config, run_config_async
from parity.trace import read_trace

HERE = Path(__file__).resolve().parent
DEFAULT_TRACE = HERE / "traces" / "vllm-0.32.0.jsonl.gz"
ASYNC_TRACE = HERE / "traces" / "vllm-0.32.0-async.jsonl.gz"
# n > 1 split into children (parity/parallel.py), synchronous and async
PARALLEL_TRACE = HERE / "traces" / "vllm-0.32.0-parallel-sampling.jsonl.gz"
PARALLEL_ASYNC_TRACE = HERE / "traces" / "vllm-0.32.0-parallel-sampling-async.jsonl.gz"
_FIELDS = [f.name for f in fields(StepRecord) if f.name != "step"]


@dataclass(frozen=True, slots=True)
class Mismatch:
    """The first step where two runs differ (`index` counts recorded steps)."""

    name: str
    index: int
    fields: tuple[str, ...]
    vllm: StepRecord | None
    servesim: StepRecord | None
    note: str = ""

    def describe(self) -> str:
        lines = [f"{self.name}: first difference at recorded step {self.index}"
                 + (f" (step {self.vllm.step if self.vllm else self.servesim.step})"
                    if self.vllm or self.servesim else "")
                 + (f": {self.note}" if self.note else "")]
        for label, rec in (("vllm    ", self.vllm), ("servesim", self.servesim)):
            if rec is None:
                lines.append(f"  {label} (no step)")
                continue
            shown = ", ".join(f"{f}={getattr(rec, f)}" + (" <<" if f in self.fields else "")
                              for f in ["step", *_FIELDS])
            lines.append(f"  {label} {shown}")
        return "\n".join(lines)


def first_difference(vllm: RunResult, servesim: RunResult) -> Mismatch | None:
    for i, (a, b) in enumerate(zip(vllm.steps, servesim.steps, strict=False)):
        diff = tuple(f for f in ["step", *_FIELDS] if getattr(a, f) != getattr(b, f))
        if diff:
            return Mismatch(vllm.name, i, diff, a, b)
    n = min(len(vllm.steps), len(servesim.steps))
    if len(vllm.steps) != len(servesim.steps):
        a = vllm.steps[n] if n < len(vllm.steps) else None
        b = servesim.steps[n] if n < len(servesim.steps) else None
        return Mismatch(vllm.name, n, ("steps",), a, b,
                        f"{len(vllm.steps)} steps in vLLM, {len(servesim.steps)} in servesim")
    if vllm.error != servesim.error:
        return Mismatch(vllm.name, n, ("error",), None, None,
                        f"vLLM error {vllm.error!r}, servesim error {servesim.error!r}")
    return None


def load_recorded(path: Path) -> tuple[dict, dict[str, RunResult]]:
    """The trace, refused if this generator would build other configurations."""
    meta, runs = read_trace(path)
    if meta.get("generator_version") != GENERATOR_VERSION:
        raise ValueError(f"{path} was recorded with generator version "
                         f"{meta.get('generator_version')}, this is {GENERATOR_VERSION}: "
                         "re-record with parity/record_vllm.py")
    return meta, runs


def compare_all(configs: list[ParityConfig], recorded: dict[str, RunResult], side_factory,
                async_scheduling: bool = False) -> tuple[list[Mismatch | None], int, float]:
    """(first mismatch per configuration or None, steps compared, seconds in servesim);
    `async_scheduling`: run the async loop (side_factory builds async sides)."""
    run = run_config_async if async_scheduling else run_config
    results, steps, t0 = [], 0, time.perf_counter()
    for config in configs:
        rec = recorded.get(config.name)
        if rec is None or rec.digest != config.digest:
            results.append(Mismatch(config.name, 0, ("digest",), None, None,
                                    "not recorded for this configuration: re-record"))
            continue
        mine = run(config, side_factory(config))
        mismatch = first_difference(rec, mine)
        steps += len(rec.steps) if mismatch is None else mismatch.index
        results.append(mismatch)
    return results, steps, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    from parity.servesim_side import ServesimSide

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--only", nargs="+", metavar="NAME")
    ap.add_argument("--show", type=int, default=5, help="mismatches to print in full")
    args = ap.parse_args(argv)
    if not args.trace.exists():
        print(f"--trace: {args.trace} does not exist; record one with "
              "parity/record_vllm.py", file=sys.stderr)
        return 2
    meta, recorded = load_recorded(args.trace)
    configs = generate_parallel_configs() if meta.get("configs") == PARALLEL_FAMILY \
        else generate_configs()
    if args.only:
        unknown = sorted(set(args.only) - {c.name for c in configs})
        if unknown:
            print(f"--only: no configuration named {unknown[0]!r} (names look like "
                  "'mixed-000', see parity/configs.py FAMILIES)", file=sys.stderr)
            return 2
        configs = [c for c in configs if c.name in set(args.only)]

    async_scheduling = bool(meta.get("async_scheduling"))
    if async_scheduling:
        configs = [c for c in configs if runs_async(c)]
    results, steps, secs = compare_all(
        configs, recorded, lambda c: ServesimSide(c, async_scheduling), async_scheduling)
    bad = [m for m in results if m is not None]
    for m in bad[:args.show]:
        print(m.describe())
    mode = " (async scheduling)" if async_scheduling else ""
    print(f"vLLM {meta.get('vllm_version')}{mode} vs servesim: "
          f"{len(configs) - len(bad)}/{len(configs)} "
          f"configurations identical; {steps} steps compared before any difference; "
          f"{1e3 * secs / max(1, len(configs)):.1f} ms per configuration")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
