"""The GPU check's results as results.json and a summary.md a person reads first.

One function, called after every phase (so a stop keeps a readable summary):
correctness, the floors, each timed step against its floor and the issue's
H200 targets, the transformers ratio, and per model the profile, fit and
replay; calibrate/gpu/report.py appends the fidelity tables when it has them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return "-" if value is None else str(value)


def _correctness(c: dict[str, Any]) -> list[str]:
    if "error" in c:
        return [f"Correctness FAILED: {c['error']}", ""]
    errors = ", ".join(f"{k} {_fmt(v)}" for k, v in c["attention_rel_error"].items())
    lines = [f"- attention ({c['attention_backend']}) vs dense reference, relative error: "
             f"{errors} (tolerance {_fmt(c['attention_tolerance'])}): "
             f"{'ok' if c['attention_ok'] else 'FAILED'}"]
    if "torch_backend_rel_error" in c:
        lines.append("- torch backend, the same cases: " + ", ".join(
            f"{k} {_fmt(v)}" for k, v in c["torch_backend_rel_error"].items()))
    g = c["graph_vs_eager"]
    lines.append("- CUDA-graph decode vs eager on the same inputs: " + (
        g["skipped"] if "skipped" in g else
        f"{g['steps']} steps, {g['rows']} rows, {g['token_mismatches']} token mismatches, "
        f"max |logit diff| {_fmt(g['max_abs_logit_diff'])}: "
        f"{'identical' if g['identical'] else 'DIFFERENT'}"))
    s = c["host_syncs_per_step"]
    lines.append("- host waits per engine step: " + "; ".join(
        f"{k}: {v}" for k, v in s.items() if isinstance(v, dict))
        + f": {'ok' if s.get('ok') else 'FAILED'}")
    a = c["decode_allocation"]
    lines.append("- decode step allocation: " + (
        a["skipped"] if "skipped" in a else
        f"batch {a['batch']} x {a['context']}: {a['step_extra_bytes'] / 2**20:.1f} MiB beyond "
        f"what it found, {a['extra_over_live_kv']:.3f} x one layer's live KV: "
        f"{'ok' if a['ok'] else 'FAILED'}"))
    return [*lines, ""]


def _speed(sp: dict[str, Any], floors: dict[str, Any] | None) -> list[str]:
    if "error" in sp:
        return [f"Speed FAILED: {sp['error']}", ""]
    lines = []
    if floors:
        lines.append(f"Floors measured here: copy {floors['copy_GBps']:.0f} GB/s, bf16 matmul "
                     f"{floors['matmul_TFLOPs']:.0f} TFLOP/s. {sp['model']}, KV pool "
                     f"{sp['kv_pool_GiB']:.1f} GiB, {sp['graphs']} decode graphs.")
    lines += ["", "| kind | batch | tokens / context | step ms | device ms | floor ms | "
              "device / floor | tokens/s | note |", "| --- | --- | --- | --- | --- | --- | "
              "--- | --- | --- |"]
    for r in sp.get("rows", []):
        size = r.get("context", r.get("tokens"))
        ratio = r.get("over_floor", r["device_ms"] / r["floor_ms"])
        note = "" if r.get("kv_distinct", 1.0) >= 1.0 else \
            f"KV wraps the pool ({r['kv_distinct']:.0%} distinct)"
        if r["kind"] == "prefill":
            note = f"{r['achieved_TFLOPs']:.0f} TFLOP/s, {r['share_of_matmul_rate']:.0%} of matmul"
        lines.append(f"| {r['kind']} | {r['batch']} | {size} | {r['step_ms']:.3f} | "
                     f"{r['device_ms']:.3f} | {r['floor_ms']:.3f} | {ratio:.2f} | "
                     f"{r['tokens_per_s']:.0f} | {note} |")
    t = sp.get("targets", {})
    if t:
        lines += ["", "Targets (H200): " + "; ".join(f"{k} {_fmt(v)}" for k, v in t.items())]
    g = sp.get("generate")
    if g:
        lines += ["", f"Greedy batch {g['batch']} x {g['prompt']} + {g['output']}: engine "
                  f"{g['engine_s']:.2f} s, transformers generate "
                  f"{_fmt(g['transformers_s'])} s, engine speedup {_fmt(g['engine_speedup'])}"]
    return [*lines, ""]


def _model(name: str, log: dict[str, Any]) -> list[str]:
    lines = [f"## {name}", ""]
    if "error" in log:
        lines.append(f"FAILED: {log['error']}")
    if "profile" in log:
        p = log["profile"]
        lines.append(f"Profiled {p['points']} of {p['grid_points']} shapes in "
                     f"{p['measure_s']:.0f} s (+{p['setup_s']:.0f} s setup) on {p['device']}.")
    held = next((e for e in log.get("fit", []) if e["kind"] == "all"), None)
    if held:
        lines.append(f"Fit held-out error: mean {held['mean_ape_pct']:.1f}%, "
                     f"p90 {held['p90_ape_pct']:.1f}%.")
    r = log.get("replay")
    if isinstance(r, dict):
        lines.append(f"Replay: {r['requests']} requests in {r['engine_steps']} steps, "
                     f"{r['engine_wall_s']:.1f} s (+{r['engine_setup_s']:.1f} s setup).")
    elif r:
        lines.append(f"Replay {r}.")
    if "fidelity_markdown" in log:
        lines += ["", log["fidelity_markdown"]]
    return [*lines, ""]


def write_summary(out: Path, results: dict[str, Any]) -> Path:
    info = results["info"]
    lines = [f"# GPU check on {info.get('device')}", "",
             f"torch {info.get('torch')}, CUDA {info.get('cuda')}, triton {info.get('triton')}"
             f"{', ' + info['nvidia_smi'] if info.get('nvidia_smi') else ''}; "
             f"{'smoke, ' if info.get('smoke') else ''}{info.get('elapsed_s', 0):.0f} s"
             + (f"; {info['stopped']}" if info.get("stopped") else ""), ""]
    if "correctness" in results:
        lines += ["## Correctness", "", *_correctness(results["correctness"])]
    if "speed" in results:
        lines += ["## Speed", "", *_speed(results["speed"], results.get("floors"))]
    for name, log in results.get("models", {}).items():
        lines += _model(name, log)
    path = out / "summary.md"
    path.write_text("\n".join(lines))
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    return path
