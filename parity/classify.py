"""Which of issue 14's causes (A-E, parity/vllm_rules.py) explains each mismatch.

    python -m parity.classify [--trace FILE] [--path auto|each|batch] [--json OUT]

For every configuration where today's servesim differs from vLLM: run it with
all the rules, then with all but one. A rule whose removal brings the
difference back is a cause of that configuration; one that differs even with
every rule has a cause beyond A-E. Prints the tally and each configuration.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from parity.compare import DEFAULT_TRACE, first_difference, load_recorded
from parity.configs import generate_configs
from parity.servesim_side import PATHS, ServesimSide
from parity.steps import RunResult, run_config
from parity.vllm_rules import RULES, classes


def _differs(config, recorded: RunResult, rules: frozenset[str], path: str):
    kv_cls, sched_cls = classes(rules)
    return first_difference(recorded, run_config(config, ServesimSide(config, path, kv_cls,
                                                                      sched_cls)))


def classify(path: str, trace: Path) -> dict:
    meta, recorded = load_recorded(trace)
    every = frozenset(RULES)
    rows = []
    configs = generate_configs()
    for config in configs:
        rec = recorded[config.name]
        today = _differs(config, rec, frozenset(), path)
        if today is None:
            continue
        row = {"name": config.name, "first_step": today.index, "fields": list(today.fields)}
        if _differs(config, rec, every, path) is not None:
            row["causes"] = ["other"]
        else:
            row["causes"] = [r for r in sorted(every)
                             if _differs(config, rec, every - {r}, path) is not None]
            row["alone"] = [r for r in sorted(every)
                            if _differs(config, rec, frozenset({r}), path) is None]
        rows.append(row)
    tally = {c: sum(c in r["causes"] for r in rows) for c in [*sorted(RULES), "other"]}
    return {"vllm_version": meta["vllm_version"], "path": path,
            "configurations": len(configs), "mismatched": len(rows), "tally": tally, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--path", default="auto")
    ap.add_argument("--json", type=Path, help="also write the result here")
    args = ap.parse_args(argv)
    if args.path not in PATHS:
        print(f"--path: {args.path!r} is not one of {', '.join(PATHS)}", file=sys.stderr)
        return 2
    if not args.trace.exists():
        print(f"--trace: {args.trace} does not exist", file=sys.stderr)
        return 2
    result = classify(args.path, args.trace)
    for row in result["rows"]:
        alone = ",".join(row.get("alone", [])) or "-"
        print(f"{row['name']:<20} first diff at step {row['first_step']:>5} "
              f"({','.join(row['fields'])}); causes {','.join(row['causes']) or '?'}; "
              f"fixed by one rule alone: {alone}")
    print(f"path {args.path}: {result['mismatched']}/{result['configurations']} differ today; "
          "configurations needing each rule: "
          + ", ".join(f"{c} {n}" for c, n in result["tally"].items()))
    if args.json:  # one row per line, so that a re-run diffs by configuration
        head = {k: v for k, v in result.items() if k != "rows"}
        rows = ",\n".join(" " + json.dumps(r) for r in result["rows"])
        args.json.write_text(json.dumps(head)[:-1] + ', "rows": [\n' + rows + "\n]}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
