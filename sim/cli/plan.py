"""`servesim plan SCENARIO --rate R`: the cheapest GPU type x TP x replicas that sustains R
within the SLOs (sim.experiments.plan); a bad option exits 2 before any simulation."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

from sim.cli.run import add_force_option, out_dir_of


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="the cheapest deployment that sustains a rate within SLOs")
    p.add_argument("scenario", help="scenario YAML: its model, workload (lengths or trace), SLOs")
    p.add_argument("--rate", type=float, required=True, help="target arrival rate, req/s")
    p.add_argument("--gpu", default="h100-sxm,h200", help="GPU types to consider (catalogue)")
    p.add_argument("--tp", default="1,2,4,8", help="tensor-parallel degrees to consider")
    p.add_argument("--dp", default="auto", help="data-parallel degrees of MoE layouts: DP=N "
                   "ranks x TP=T with the experts over all N x T GPUs, at the --tp GPU counts, "
                   "one DP group each (docs/moe_dp_ep.md); auto: every N for an MoE model, "
                   "none for a dense one; 1: pure TP only")
    p.add_argument("--dp-batched-tokens", type=int, default=None, metavar="N",
                   help="a DP rank's max_num_batched_tokens in the DP layouts (default: the "
                   "scenario's): a smaller prefill chunk on one rank stalls the others less")
    p.add_argument("--slo", default=None, help="bounds on the percentile, e.g. "
                   "'ttft:2000 tpot:100' (default: the scenario's slo section)")
    p.add_argument("--percentile", default="p99", choices=("median", "p90", "p99"),
                   help="which percentile of TTFT and TPOT must meet the bounds")
    p.add_argument("--price", default=None, metavar="GPU=USD,...",
                   help="$/GPU-hour per GPU type: cost in $/hour instead of GPU count")
    p.add_argument("--max-replicas", type=int, default=32,
                   help="most replicas a candidate is simulated with")
    p.add_argument("--requests", type=int, default=2000, help="requests per simulated fleet")
    p.add_argument("--confidence", type=float, default=None, metavar="C",
                   help="the SLO must hold at this probability (e.g. 0.95) under simulation "
                   "noise and the model's error against real servers (docs/uncertainty.md); "
                   "also prints the point estimate's pick and the GPUs the confidence costs")
    p.add_argument("--jobs", type=int, default=None, help="parallel simulations")
    p.add_argument("--backend", default="loky", choices=("loky", "dask", "ray"),
                   help="joblib backend: local processes, a Dask or a Ray cluster")
    p.add_argument("--out", help="output directory (default results/plan_<scenario>)")
    add_force_option(p)
    p.add_argument("--no-plots", action="store_true", help="skip plan.png")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no answer printed")
    p.set_defaults(func=_plan)


def _question(args: argparse.Namespace):  # noqa: ANN202 - a PlanQuestion, imported lazily
    from sim.config.catalogue import get_hardware
    from sim.config.loader import read_scenario_raw
    from sim.experiments.plan_layouts import parse_dps
    from sim.experiments.plan_run import PlanQuestion
    from sim.results.stats.prediction import check_confidence
    from sim.results.stats.slo import SLO

    if not args.rate > 0:
        raise ValueError(f"--rate: must be > 0 req/s, got {args.rate}")
    if args.max_replicas < 1 or args.requests < 100:
        raise ValueError("--max-replicas must be >= 1 and --requests >= 100, got "
                         f"{args.max_replicas} and {args.requests}")
    check_confidence(args.confidence, "--confidence")  # compare's check (its spec field's)
    gpus = tuple(g.strip() for g in args.gpu.split(",") if g.strip())
    for g in gpus:
        get_hardware(g)  # an unknown name: its error lists the catalogue
    try:
        tps = tuple(int(t) for t in args.tp.split(","))
    except ValueError:
        raise ValueError(f"--tp: comma-separated integers, got {args.tp!r}") from None
    prices: dict[str, float] = {}
    for item in (args.price or "").split(","):
        if item.strip():
            name, _, usd = item.partition("=")
            try:
                prices[name.strip()] = float(usd)
            except ValueError:
                raise ValueError(f"--price: expected GPU=USD, got {item!r}") from None
    if prices and set(prices) != set(gpus):
        raise ValueError(f"--price: give a price for every --gpu ({', '.join(gpus)})")
    path = Path(args.scenario)
    raw = read_scenario_raw(path)
    slo = SLO.parse(args.slo) if args.slo else SLO(**(raw.get("slo") or {}))
    if slo.ttft_ms is None and slo.tpot_ms is None:
        raise ValueError("--slo: give ttft and/or tpot bounds (or an slo section)")
    question = PlanQuestion(raw, str(path), path.resolve().parent, args.rate, gpus, tps,
                            slo.ttft_ms, slo.tpot_ms, args.percentile, tuple(prices.items()),
                            args.max_replicas, args.requests, confidence=args.confidence)
    model = question.scenario(gpus[0], tps[0], 1).model_spec
    if args.dp_batched_tokens is not None and args.dp_batched_tokens < 1:
        raise ValueError(f"--dp-batched-tokens: a token budget >= 1, got "
                         f"{args.dp_batched_tokens}")
    return replace(question, dps=parse_dps(args.dp, model, tps),
                   dp_batched_tokens=args.dp_batched_tokens)


def _plan(args: argparse.Namespace) -> int:
    from sim.config.yaml_input import ScenarioError
    from sim.experiments.cache import PointCache
    from sim.experiments.plan_output import format_plan, write_plan
    from sim.experiments.plan_run import run_plan
    from sim.experiments.sweep import Backend, SweepError
    from sim.results.files.output_dir import OutputDirError, Staging

    default = Path("results") / f"plan_{Path(args.scenario).stem}"
    out_dir, field = out_dir_of(args.out, None, default)
    try:
        question = _question(args)
        question.scenario(question.gpus[0], question.tps[0], 1)  # a bad base fails now
        stage = Staging(out_dir, field, "plan", args.force)
    except (ValueError, ScenarioError, OutputDirError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    with stage:
        try:
            result = run_plan(question, Backend(args.backend, args.jobs), not args.quiet,
                              PointCache.beside(out_dir))
        except (SweepError, ScenarioError, ValueError, FileNotFoundError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        write_plan(result, question, stage.path, plots=not args.no_plots)
        stage.commit()
    if not args.quiet:
        print(format_plan(result, question))
        print(f"planned in {time.perf_counter() - started:.0f} s wall "
              f"({len(result.tried)} fleets simulated, {result.reused} from the cache); "
              f"results in {out_dir}/")
    return 0
