"""Every published figure, as the step that regenerates it: what it runs, what it writes.

`STEPS` is the registry benchmarks/regenerate.py runs, in its fixed order
(`python benchmarks/regenerate.py --list` prints it). Each step returns the
Markdown body of its docs/figures.md section and names, in `publishes`, the
tracked files it rewrites. The registry is apart from the runner because a
new figure is a new step here and nothing else: the runner, its sections and
its provenance stamp do not change.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from figure_tools import (
    REPO,
    Context,
    Step,
    command,
    publish,
    refresh_readme,
    run_and_show,
    servesim,
    shown,
)

README_CAPACITY = ("capacity", "--model", "llama-3-8b", "--gpu", "h100-sxm", "--context", "8192",
                   "--batch", "32")


def fresh(out: Path) -> Path:
    """`out`, a step's own scratch directory under --work, removed before its command runs.

    regenerate owns --work (git ignores it). A result directory written before servesim kept
    manifests is refused without --force, and --force would keep every old file the new run
    does not write: a plot the code no longer makes could then be published as this run's.
    Starting empty means every file a step reads or publishes is this run's. The point cache
    lies beside `out` (in --work itself), so it survives.
    """
    shutil.rmtree(out, ignore_errors=True)
    return out


def capacity(ctx: Context) -> str:
    sheet = servesim(*README_CAPACITY)
    refresh_readme(ctx.readme, "servesim " + " ".join(README_CAPACITY), sheet)
    return "\n".join([
        shown(README_CAPACITY, sheet),
        run_and_show("capacity", "--model", "llama-3.1-8b", "--context", "128k", "--batch", "1"),
        run_and_show("capacity", "--model", "llama-3-70b", ok=(1,)),  # exit 1: does not fit
    ])


def tokens(ctx: Context) -> str:
    return run_and_show("tokens", "docs/tokens_sample.txt", "--tokenizer", "byte",
                        "--tokenizer", "mistral-v1", "--tokenizer", "mistral-tekken")


def quickstart(ctx: Context) -> str:
    out = fresh(ctx.work / "quickstart")
    text = run_and_show("run", "scenarios/quickstart.yaml", "--timeline", "6", "--out", str(out))
    printed = text.split("\n", 2)[2].rsplit("```", 1)[0]  # the output, without the fence
    refresh_readme(ctx.readme, "servesim run scenarios/quickstart.yaml",
                   printed.replace(str(out), "results/quickstart"))
    publish(out / "latency_cdf.png", "docs/quickstart_latency_cdf.png")
    publish(out / "timeseries.png", "docs/quickstart_timeseries.png")
    publish(out / "timeline.png", "docs/timeline.png")
    return text.replace(str(out), "results/quickstart")


README_PLAN = ("plan", "scenarios/plan_llama70b.yaml", "--rate", "40", "--gpu", "h100-sxm,h200")


def plan(ctx: Context) -> str:
    """The README's `servesim plan` answer, from a fresh cache (a cached fleet would be
    counted as such, and could be a former code's)."""
    work = ctx.work / "plan"
    shutil.rmtree(work, ignore_errors=True)
    out = work / "out"
    text = servesim(*README_PLAN, "--out", str(out)).rstrip("\n")
    text = text.replace(str(out), "results/plan_plan_llama70b")
    refresh_readme(ctx.readme, "servesim " + " ".join(README_PLAN), text)
    return shown(README_PLAN, text)


def slots(ctx: Context) -> str:
    return run_and_show("plot", "slots", "--out", "docs/slots.png")


def compare(spec: str, pictures: dict[str, str]) -> Callable[[Context], str]:
    """A `servesim compare` step: its compare.md, and the named plots copied to docs/."""
    def step(ctx: Context) -> str:
        out = fresh(ctx.work / f"compare_{Path(spec).stem}")
        servesim("compare", spec, "--out", str(out))
        for source, target in pictures.items():
            publish(out / source, target)
        tables = re.sub(r"^# ", "### ", (out / "compare.md").read_text(), flags=re.MULTILINE)
        return f"`servesim compare {spec}`:\n\n{tables}"
    return step


ROUTERS = ("round_robin", "least_outstanding", "prefix_aware")


def routing(ctx: Context) -> str:
    rows = ["| router | prefix hit rate | mean TTFT | p50 TTFT | p99 TTFT | SLO attainment "
            "| req/s |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for policy in ROUTERS:
        out = fresh(ctx.work / f"routing_{policy}")
        servesim("run", "scenarios/routing.yaml", "--set", f"router.policy={policy}",
                 "--out", str(out), "--quiet")
        s = json.loads((out / "summary.json").read_text())
        rows.append(f"| {policy} | {s['prefix_hit_rate']:.1%} | {s['mean_ttft_ms'] / 1e3:.2f} s "
                    f"| {s['median_ttft_ms'] / 1e3:.2f} s | {s['p99_ttft_ms'] / 1e3:.2f} s "
                    f"| {s['slo_attainment']:.1%} | {s['request_throughput']:.2f} |")
    publish(ctx.work / "routing_round_robin" / "load_balance.png",
            "docs/routing_load_balance.png")
    return ("`servesim run scenarios/routing.yaml --set router.policy=ROUTER`; the picture "
            "is round_robin's `load_balance.png`.\n\n" + "\n".join(rows) + "\n")


LONG_CONTEXT_GRID = ("workload.prompt_tokens.value=3840,7936,16128,32512,65280,130816",
                     "workload.arrivals.rate=0.02,100")


def long_context(ctx: Context) -> str:
    out = fresh(ctx.work / "sweep_long_context")
    args = ["sweep", "scenarios/long_context.yaml", "--plots"]
    for grid in LONG_CONTEXT_GRID:
        args += ["--grid", grid]
    servesim(*args, "--quiet", "--out", str(out))
    publish(out / "sweep.png", "docs/long_context_sweep.png")
    return f"`servesim {' '.join(args)}`:\n\n" + (out / "sweep.md").read_text()


def engine_replay(ctx: Context) -> str:
    out = fresh(ctx.work / "engine_cpu")
    text = run_and_show("engine", "replay", "scenarios/engine_cpu.yaml", "--no-plots",
                        "--out", str(out))
    return text.replace(str(out), "results/engine_cpu_engine")


FIDELITY = {"calibrate_cpu": "calibration/cpu-tiny/fidelity",
            "calibrate_cpu_speculative": "calibration/cpu-tiny/fidelity-calibrate_cpu_speculative"}
FIDELITY_FILES = ("fidelity.json", "fidelity.md", "steps.csv", "requests.csv",
                  "latency_cdf.png", "step_latency.png")


def fidelity(ctx: Context) -> str:
    """The shipped CPU table validated against this machine's engine (no re-profiling)."""
    out = fresh(ctx.work / "fidelity_cpu")
    command([sys.executable, "benchmarks/fidelity_cpu.py", "--table", "calibration/cpu-tiny",
             "--out", str(out), "--quiet"])
    for name, target in FIDELITY.items():
        for file in FIDELITY_FILES:
            publish(out / f"fidelity-{name}" / file, f"{target}/{file}")
        report = REPO / target / "fidelity.json"  # its table, relative to where it now lies
        body = json.loads(report.read_text())
        body["table"] = os.path.relpath(REPO / "calibration" / "cpu-tiny", REPO / target)
        report.write_text(json.dumps(body, indent=2) + "\n")
    summary = (out / "summary.md").read_text().split("\n", 1)[1].replace(str(out), "results")
    return ("`python benchmarks/fidelity_cpu.py --table calibration/cpu-tiny`; the reports "
            "in calibration/cpu-tiny/fidelity*/.\n" + re.sub(r"^#", "###", summary,
                                                            flags=re.MULTILINE))


def python_block(*cmd: str) -> str:
    """`python CMD` run, shown as a fenced block: the command, then what it printed."""
    out = command([sys.executable, *cmd])
    return f"```\n$ python {' '.join(cmd)}\n{out.rstrip()}\n```\n"


def bench_sim(*args: str, json_name: str) -> Callable[[Context], str]:
    def step(ctx: Context) -> str:
        return python_block("benchmarks/bench_sim.py", *args, "--json",
                            f"benchmarks/results/{json_name}")
    return step


def stage_costs(ctx: Context) -> str:
    """Each stage's cost at the two bench_sim rates, a table and a JSON file each."""
    return "\n".join(python_block("benchmarks/stage_costs.py", "10000", rate, "--json",
                                   f"benchmarks/results/stage_costs_{name}.json")
                      for rate, name in (("2", "2rps"), ("200", "saturating")))


def real_runs(ctx: Context) -> str:
    """servesim against the real vLLM runs (errors only; skipped, saying why, without them)."""
    from calibrate.real_runs import DEFAULT_DIR, MISSING, RUNS_FILE

    if not (DEFAULT_DIR / RUNS_FILE).is_file():
        return f"Not regenerated here: {MISSING}.\n"
    return python_block("benchmarks/real_runs.py", "--floors")


def bench_engine(ctx: Context) -> str:
    cmd = ["benchmarks/bench_engine.py", "--device", "cpu", "--repeats", "10", "--out",
           "benchmarks/results"]
    return f"```\n$ python {' '.join(cmd)}\n```\n\n" + command([sys.executable, *cmd])


def serve(ctx: Context) -> str:
    """servesim serve measured by servesim load and by vLLM's bench serve (where VLLM_PYTHON
    names a venv with vLLM; else that part keeps its last published section)."""
    command([sys.executable, "benchmarks/serve_fidelity.py"])
    out = REPO / "benchmarks" / "results" / "serve"
    publish(out / "simulated" / "load" / "fidelity" / "latency_cdf.png",
            "docs/serve_latency_cdf.png")
    body = (out / "README.md").read_text().split("\n", 1)[1]
    return re.sub(r"^## ", "### ", body, flags=re.MULTILINE)


NOTEBOOKS = tuple(sorted(str(p.relative_to(REPO)) for p in (REPO / "notebooks").glob("*.ipynb")))
PROVENANCE_TAG = "provenance"


def notebooks(ctx: Context) -> str:
    """Execute each notebook in place (nbclient), ending it with a cell saying what ran it."""
    import nbformat
    from nbclient import NotebookClient

    rows = ["| notebook | wall s |", "| --- | --- |"]
    for name in NOTEBOOKS:
        path = REPO / name
        nb = nbformat.read(path, as_version=4)
        nb.cells = [c for c in nb.cells if PROVENANCE_TAG not in c.metadata.get("tags", [])]
        for cell in nb.cells:  # no per-cell timestamps: a rerun differs only where outputs do
            cell.metadata.pop("execution", None)
        started = time.perf_counter()
        NotebookClient(nb, timeout=900, kernel_name="python3", record_timing=False,
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        wall_s = time.perf_counter() - started
        note = nbformat.v4.new_markdown_cell(
            f"*Outputs above produced by `python benchmarks/regenerate.py --only notebooks` "
            f"on {ctx.stamp}.*")
        note.id = PROVENANCE_TAG  # a fixed id: a rerun changes the text only
        note.metadata["tags"] = [PROVENANCE_TAG]
        nb.cells.append(note)
        nbformat.write(nb, path)
        rows.append(f"| [{Path(name).stem}](../{name}) | {wall_s:.1f} |")
    return "Executed in place with nbclient:\n\n" + "\n".join(rows) + "\n"


# The doc pages that quote a step's output: each fenced block there that starts with
# `$ COMMAND` is rewritten from the step's section once all its commands have run (quote),
# as the README's quoted runs are; tests/test_regenerate.py holds each page to its step's
# section of docs/figures.md. (step, page, command line as shown)
MOE_PAGE, UNCERTAINTY_PAGE = "docs/moe_dp_ep.md", "docs/uncertainty.md"
MOE_CAPACITY = ("capacity", "--config", "builtin:deepseek-v3", "--gpu", "h200", "--gpus", "8",
                "--ep", "8", "--dp", "8")
MOE_PLAN = ("plan", "scenarios/moe_dp_ep_plan.yaml", "--rate", "16", "--gpu", "h200", "--tp",
            "8", "--requests", "4000")
UNCERTAINTY_PLAN = ("plan", "scenarios/quickstart.yaml", "--rate", "40", "--gpu", "h100-sxm",
                    "--tp", "1", "--slo", "tpot:14", "--requests", "1000", "--confidence",
                    "0.95")
MODEL_ERROR_WORK = "results/model_error"  # how --work's model_error directory is shown
MODEL_ERROR = ("-m", "calibrate.model_error", "--record", f"{MODEL_ERROR_WORK}/model_error.json",
               "--description", f"{MODEL_ERROR_WORK}/model_error_law.json")
PAGE_QUOTES = (
    ("moe_dp_ep", MOE_PAGE, "servesim " + " ".join(MOE_CAPACITY)),
    ("moe_dp_ep_plan", MOE_PAGE, "servesim " + " ".join(MOE_PLAN)),
    ("uncertainty", UNCERTAINTY_PAGE, "python " + " ".join(MODEL_ERROR)),
    ("uncertainty", UNCERTAINTY_PAGE, "servesim " + " ".join(UNCERTAINTY_PLAN)),
    ("uncertainty", UNCERTAINTY_PAGE, "servesim compare spec.yaml"),
    ("uncertainty", UNCERTAINTY_PAGE, "servesim compare spec.yaml --confidence 0.95"),
)


def quote(step: str, body: str) -> str:
    """`body`, a step's section, after copying each of its runs that a page quotes into that
    page: called last, so a step that fails leaves its pages as they were."""
    for name, page, command_line in PAGE_QUOTES:
        head = f"$ {command_line}\n"
        if name == step and head in body:
            start = body.index(head) + len(head)
            refresh_readme(REPO / page, command_line, body[start:body.index("```", start)])
    return body


def moe_dp_ep(ctx: Context) -> str:
    """DP+EP against TP for two MoE models (the compare), and the capacity sheet whose
    per-GPU terms docs/moe_dp_ep.md explains."""
    body = run_and_show(*MOE_CAPACITY) + "\n" + compare("scenarios/moe_dp_ep.yaml", {})(ctx)
    return quote("moe_dp_ep", body)


def plan_run(ctx: Context, args: tuple[str, ...], name: str) -> str:
    """A `servesim plan` answer from a fresh cache (a cached fleet could be a former code's),
    its output directory shown as the default one."""
    work = ctx.work / name
    shutil.rmtree(work, ignore_errors=True)
    out = work / "out"
    text = servesim(*args, "--out", str(out)).rstrip("\n")
    return shown(args, text.replace(str(out), f"results/plan_{Path(args[1]).stem}"))


def moe_dp_ep_plan(ctx: Context) -> str:
    return quote("moe_dp_ep_plan", plan_run(ctx, MOE_PLAN, "plan_moe_dp_ep_plan"))


def model_error(ctx: Context) -> str:
    """The coverage check of the model-error law, recomputed from the real runs into --work:
    the shipped law (sim/results/stats/data/model_error.json) is left as it is, since
    refreshing it is the calibration's own command; the section says whether the residuals
    still equal the committed record's. Skipped, saying why, without the third-party runs."""
    from calibrate.real_runs import DEFAULT_DIR, MISSING, RUNS_FILE

    if not (DEFAULT_DIR / RUNS_FILE).is_file():
        return f"Coverage check not regenerated here: {MISSING}.\n"
    out = fresh(ctx.work / "model_error")
    out.mkdir(parents=True)
    ran = [a.replace(MODEL_ERROR_WORK, str(out)) for a in MODEL_ERROR]
    text = command([sys.executable, *ran]).replace(str(out), MODEL_ERROR_WORK).rstrip("\n")
    shown_cmd = "python " + " ".join(MODEL_ERROR)
    residuals = json.loads((out / "model_error.json").read_text())["residuals"]
    committed = json.loads((REPO / "calibrate" / "model_error.json").read_text())["residuals"]
    same = ("the same residuals as the committed calibrate/model_error.json"
            if residuals == committed else "residuals that DIFFER from the committed "
            "calibrate/model_error.json (refresh it with `python -m calibrate.model_error`)")
    return f"```\n$ {shown_cmd}\n{text}\n```\n\nThis run gives {same}.\n"


def slo_search(ctx: Context, *flags: str) -> str:
    """`servesim compare spec.yaml FLAGS` on benchmarks/identity.py's compare spec: the SLO
    search's lines of what it prints (the page quotes those)."""
    from identity import COMPARE_SPEC

    work = fresh(ctx.work / f"slo_search{''.join(flags)}")
    work.mkdir(parents=True)
    (work / "spec.yaml").write_text(COMPARE_SPEC)
    printed = servesim("compare", str(work / "spec.yaml"), *flags, "--out", str(work / "out"))
    lines = printed.split("Highest sustained rate meeting the SLOs:\n", 1)[1].splitlines()
    text = "\n".join(line for line in lines if not re.match(r"\d+ runs \(", line))
    return shown(("compare", "spec.yaml", *flags), text)


def uncertainty(ctx: Context) -> str:
    """docs/uncertainty.md's runs: the coverage check, a plan at 95% confidence, and the
    compare's SLO search without and with it."""
    return quote("uncertainty", "\n".join((
        model_error(ctx), plan_run(ctx, UNCERTAINTY_PLAN, "plan_quickstart_confidence"),
        "The SLO search's lines of `servesim compare` on benchmarks/identity.py's compare "
        "spec, saved as `spec.yaml`:\n", slo_search(ctx),
        slo_search(ctx, "--confidence", "0.95"))))


BATCHING_PNG = {"throughput.png": "docs/batching_throughput.png",
                "latency_vs_throughput.png": "docs/batching_latency.png",
                "pareto.png": "docs/batching_pareto.png", "waste.png": "docs/batching_waste.png"}
PAGED_PNG = {"throughput.png": "docs/paged_throughput.png", "waste.png": "docs/paged_waste.png"}

STEPS = (
    Step("capacity", "the capacity sheets the README prints", "2 s", ("README.md",), capacity),
    Step("tokens", "token counts of docs/tokens_sample.txt", "1 s", (), tokens),
    Step("quickstart", "the worked example, its plots and a 6-request timeline", "2 s",
         ("README.md", "docs/quickstart_latency_cdf.png", "docs/quickstart_timeseries.png",
          "docs/timeline.png"), quickstart),
    Step("plan", "the cheapest fleet for Llama-3-70B at 40 req/s (servesim plan)", "2 min",
         ("README.md",), plan),
    Step("slots", "batch slots under static vs continuous batching", "1 s",
         ("docs/slots.png",), slots),
    Step("batching", "static vs dynamic vs continuous batching over load", "20 s",
         tuple(BATCHING_PNG.values()), compare("scenarios/batching_policies.yaml",
                                               BATCHING_PNG)),
    Step("paged", "paged vs contiguous KV", "1.5 min", tuple(PAGED_PNG.values()),
         compare("scenarios/paged_vs_contiguous.yaml", PAGED_PNG)),
    Step("prefix_caching", "Mooncake trace, prefix caching off vs on", "2 min", (),
         compare("scenarios/prefix_caching.yaml", {})),
    Step("routing", "4 replicas behind three routers", "1.5 min",
         ("docs/routing_load_balance.png",), routing),
    Step("speculative", "speculative decoding off vs draft model vs n-gram", "4 min", (),
         compare("scenarios/speculative.yaml", {})),
    Step("long_context", "4k to 128k context, trickle and burst", "25 s",
         ("docs/long_context_sweep.png",), long_context),
    Step("engine_replay", "the CPU engine serving scenarios/engine_cpu.yaml", "35 s", (),
         engine_replay),
    Step("fidelity", "the CPU table against this machine's engine", "1.5 min",
         tuple(f"{t}/{f}" for t in FIDELITY.values() for f in FIDELITY_FILES), fidelity),
    Step("bench_sim", "simulator speed and memory: start-up, 10k requests at 2 and 200 req/s",
         "1 min", ("benchmarks/results/bench_sim.json",),
         bench_sim("--only", "help", "quickstart", "2rps", "saturating", "--rounds", "1",
                   json_name="bench_sim.json")),
    Step("bench_sim_1m", "simulator speed and memory at a million requests (2 req/s, 10x "
         "overload)", "20 min", ("benchmarks/results/bench_sim_1m.json",),
         bench_sim("--only", "1m", "overload", "--rounds", "1", json_name="bench_sim_1m.json")),
    Step("stage_costs", "where a simulation's wall time goes, stage by stage (10k requests at 2 "
         "and 200 req/s)", "1 min", ("benchmarks/results/stage_costs_2rps.json",
                                     "benchmarks/results/stage_costs_saturating.json"),
         stage_costs),
    Step("real_runs", "servesim against 12 real vLLM runs on H100: signed errors", "1.5 min",
         ("benchmarks/results/real_runs/errors.csv", "benchmarks/results/real_runs/errors.md"),
         real_runs),
    Step("bench_engine", "engine kernels on this CPU against their floors", "2.5 min",
         ("benchmarks/results/bench_engine.json",), bench_engine),
    Step("serve", "servesim load and vllm bench serve against servesim serve", "3 min",
         ("benchmarks/results/serve/README.md", "docs/serve_latency_cdf.png"), serve),
    Step("disaggregation", "co-located vs prefill/decode pools at 4 H100s, and over P:D "
         "ratios and links", "4 min", (), compare("scenarios/disaggregation.yaml", {})),
    Step("kv_offload", "the prefix cache's host and disk offload tiers on multi-turn chat",
         "2.5 min", (), compare("scenarios/kv_offload.yaml", {})),
    Step("moe_dp_ep", "MoE DP attention + EP against TP (Qwen3-30B-A3B, DeepSeek-V3)", "2 min",
         (MOE_PAGE,), moe_dp_ep),
    Step("moe_dp_ep_plan", "the cheapest DeepSeek-V3 layout on H200s at 16 req/s (servesim "
         "plan)", "15 s", (MOE_PAGE,), moe_dp_ep_plan),
    Step("uncertainty", "the model error's coverage check, and a plan at 95% confidence",
         "2 min", (UNCERTAINTY_PAGE,), uncertainty),
    Step("notebooks", "every notebook executed in place", "1 min", NOTEBOOKS, notebooks),
)
