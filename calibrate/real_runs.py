"""Real vLLM serving runs as servesim scenarios, and servesim's signed error on each.

The runs (`calibration/real_runs/h100_vllm_runs.csv`, gitignored: third-party
measurements that `.ci/run` copies from the shared folder beside the checkout, taken from the
public repository inference-sim/training at ed5c1d26900e) are one row per
stage: a model on H100-SXM at tensor parallel `tp`, vLLM's scheduler limits,
and a constant-rate stream of `num_groups` x `prompts_per_group` distinct
prompts sent in a cycle (`workload.prompt_groups`), with measured client-side
TTFT, TPOT, end-to-end latency and output throughput.

Each row becomes a scenario as a new user would write it: the model's shipped
config.json, the GPU, vLLM's settings (prefix caching on, V1's default), the
measured prompt length with the extra tokens given to the question, the
requested output length. `simulate_row` runs it for the stage's duration and
`errors` compares what servesim predicts with what was measured. Nothing here
fits anything: calibrate.fit_serving does, on these functions.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_DIR = Path(__file__).resolve().parent.parent / "calibration" / "real_runs"
RUNS_FILE = "h100_vllm_runs.csv"
MISSING = ("calibration/real_runs/ absent: third-party real vLLM serving runs, never "
           "committed; `.ci/run` copies them from the shared folder beside the checkout "
           "(its real_runs/); their figures come from the public repository "
           "inference-sim/training at ed5c1d26900e, default_args/")

# the runs' model names -> servesim's shipped config.json (sim/config/data/models/)
MODELS: Mapping[str, str] = {
    "meta-llama/Llama-2-7b-hf": "builtin:llama-2-7b",
    "meta-llama/Llama-2-70b-hf": "builtin:llama-2-70b",
    "codellama/CodeLlama-34b-Instruct-hf": "builtin:codellama-34b-instruct",
    "mistralai/Mixtral-8x7B-v0.1": "builtin:mixtral-8x7b",
}
GPUS: Mapping[str, str] = {"H100-SXM-80GB": "h100-sxm"}

# (name, the summary's client-side key, the row's measured column)
METRICS: tuple[tuple[str, str, str], ...] = (
    ("ttft_mean", "mean_ttft_ms", "ttft_mean_ms"),
    ("ttft_p50", "median_ttft_ms", "ttft_p50_ms"),
    ("ttft_p99", "p99_ttft_ms", "ttft_p99_ms"),
    ("tpot", "mean_tpot_ms", "tpot_mean_ms"),
    ("e2e_mean", "mean_e2el_ms", "e2e_mean_ms"),
    ("e2e_p50", "median_e2el_ms", "e2e_p50_ms"),
    ("output_tok_s", "output_throughput", "output_tok_s"),
)
METRIC_NAMES = tuple(m[0] for m in METRICS)


@dataclass(frozen=True, slots=True)
class RealRun:
    """One measured stage: what ran (the scenario's inputs) and what was measured."""

    run: str
    stage: int
    model: str  # the runs' name, e.g. meta-llama/Llama-2-7b-hf
    gpu: str
    tp: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    num_groups: int
    prompts_per_group: int
    system_prompt_len: int
    output_len: int
    rate_req_s: float
    duration_s: float
    prompt_len_mean: float
    measured: Mapping[str, float]  # METRIC_NAMES -> the measured figure
    n_fail: int

    @property
    def name(self) -> str:
        return f"{self.short_model}-tp{self.tp}@{self.rate_req_s:g}"

    @property
    def short_model(self) -> str:
        return MODELS[self.model].removeprefix("builtin:")

    @property
    def steady(self) -> bool:
        """A stage the real server kept up with: every request finished (the reasoning
        runs' clients gave up on most of theirs)."""
        return self.n_fail == 0


def _measured(row: Mapping[str, str]) -> dict[str, float]:
    """The row's client-side figures; output throughput in tokens: where the client counted
    stream chunks (output_len_mean < output_len), its tokens/s are scaled by tokens per chunk."""
    figures = {name: float(row[column]) for name, _, column in METRICS}
    figures["output_tok_s"] *= float(row["output_len"]) / float(row["output_len_mean"])
    return figures


def read_runs(folder: Path = DEFAULT_DIR) -> list[RealRun]:
    """The runs of `folder`/h100_vllm_runs.csv; FileNotFoundError says where they come from."""
    path = Path(folder) / RUNS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: {MISSING}")
    runs = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            if row["model"] not in MODELS or row["gpu"] not in GPUS:
                raise ValueError(f"{path}: run {row['run']} has a model or GPU servesim does "
                                 f"not map ({row['model']}, {row['gpu']})")
            runs.append(RealRun(
                run=row["run"], stage=int(row["stage"]), model=row["model"], gpu=row["gpu"],
                tp=int(row["tp"]), max_num_seqs=int(row["max_num_seqs"]),
                max_num_batched_tokens=int(row["max_num_batched_tokens"]),
                max_model_len=int(row["max_model_len"]), num_groups=int(row["num_groups"]),
                prompts_per_group=int(row["prompts_per_group"]),
                system_prompt_len=int(row["system_prompt_len"]),
                output_len=int(row["output_len"]), rate_req_s=float(row["rate_req_s"]),
                duration_s=float(row["duration_s"]),
                prompt_len_mean=float(row["prompt_len_mean"]),
                measured=_measured(row),
                n_fail=int(row["n_fail"])))
    return runs


def scenario_of(run: RealRun, seed: int = 0, duration_s: float | None = None,
                latency: Mapping[str, Any] | None = None,
                scheduler: Mapping[str, Any] | None = None,
                frontend: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The scenario a user would write for `run` (a dict for sim.config.loader).

    `duration_s` shortens the stage (the fit's quick passes); `latency`, `scheduler` and
    `frontend` add to those sections (the fit's terms, an ablation)."""
    return {
        "frontend": dict(frontend or {}),
        "name": f"{run.run}-stage{run.stage}",
        "seed": seed,
        "model": {"config": MODELS[run.model]},
        "hardware": {"gpu": GPUS[run.gpu], "count": run.tp, "memory_utilization": 0.9},
        "scheduler": {"policy": "continuous", "max_num_seqs": run.max_num_seqs,
                      "max_num_batched_tokens": run.max_num_batched_tokens,
                      "max_model_len": run.max_model_len, **(scheduler or {})},
        "kv": {"prefix_caching": True},
        "latency": {"model": "roofline", **(latency or {})},
        "workload": {
            "arrivals": {"process": "constant", "rate": run.rate_req_s},
            "prompt_tokens": {"dist": "fixed", "value": round(run.prompt_len_mean)},
            "output_tokens": {"dist": "fixed", "value": run.output_len},
            "prompt_groups": {"groups": run.num_groups,
                              "prompts_per_group": run.prompts_per_group,
                              "system_tokens": run.system_prompt_len},
            "duration_s": duration_s or run.duration_s,
        },
    }


@dataclass(frozen=True, slots=True)
class Predicted:
    """servesim's figures for one run: METRIC_NAMES -> value, and its own verdicts."""

    figures: Mapping[str, float]
    sustained: bool
    ttft_growth: float  # the last tenth's mean TTFT over the first tenth's (queues grow: > 1)
    summary: Mapping[str, Any]


def simulate_row(run: RealRun, seed: int = 0, duration_s: float | None = None,
                 latency: Mapping[str, Any] | None = None,
                 scheduler: Mapping[str, Any] | None = None,
                 frontend: Mapping[str, Any] | None = None) -> Predicted:
    """Simulate `run` (its whole stage unless `duration_s`) and read what a client measures."""
    from sim.config.loader import validate_scenario
    from sim.experiments.run import run_scenario

    scenario = validate_scenario(scenario_of(run, seed, duration_s, latency, scheduler,
                                             frontend),
                                 f"real run {run.name}")
    result = run_scenario(scenario, show_progress=False)
    summary = result.summary
    figures = {name: float(summary[key]) for name, key, _ in METRICS}
    frame = result.recorder.requests_frame()
    growth = _ttft_growth(frame)
    return Predicted(figures, bool(summary.get("sustained", False)), growth, summary)


def _ttft_growth(frame: Any) -> float:
    """Mean TTFT of the last tenth of arrivals over the first tenth's."""
    column = "ttft_ms" if "ttft_ms" in frame else None
    if column is None or len(frame) < 20:
        return math.nan
    ordered = frame.sort_values("arrival_s")[column].to_numpy()
    tenth = len(ordered) // 10
    first, last = float(ordered[:tenth].mean()), float(ordered[-tenth:].mean())
    return last / first if first > 0 else math.inf


def signed_errors(predicted: Mapping[str, float], measured: Mapping[str, float]
                  ) -> dict[str, float]:
    """(predicted - measured) / measured per metric, as fractions."""
    return {name: (predicted[name] - measured[name]) / measured[name]
            for name in METRIC_NAMES if measured.get(name)}


def median_abs(errors: Sequence[Mapping[str, float]], metric: str) -> float:
    """The median absolute error of `metric` over runs (NaN if none has it)."""
    values = sorted(abs(e[metric]) for e in errors if metric in e and math.isfinite(e[metric]))
    if not values:
        return math.nan
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
