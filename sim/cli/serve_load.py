"""`servesim load URL [SCENARIO]`: drive any OpenAI-compatible server with a scenario's
workload and measure it on the client.

Why beside `servesim serve` and not in it: it talks to any server (vLLM, SGLang,
servesim's own), and writes what `servesim run` writes plus vLLM bench's result
JSON (sim.serve.bench), one directory per rate of a `--rate` sweep.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from sim.cli.run import add_force_option


def fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def tokenizer_and_stage(args: argparse.Namespace, scenario, suffix: str,  # noqa: ANN001
                        command: str) -> tuple | str:
    """What `serve` and `load` both check before they start: the tokenizer, and the output
    directory staged and locked (`suffix` names the default one). (tokenizer, out_dir,
    stage), or the error line."""
    from sim.cli.run import out_dir_of
    from sim.results.files.output_dir import OutputDirError, Staging, variant_dir
    from sim.text import TokenizerError, load_tokenizer

    try:
        tokenizer = load_tokenizer(args.tokenizer or scenario.workload.tokenizer or "byte")
    except TokenizerError as err:
        return f"--tokenizer: {err}"
    out_dir, field = out_dir_of(args.out, None, variant_dir(scenario.name, args.overrides,
                                                             suffix))
    try:
        return tokenizer, out_dir, Staging(out_dir, field, command, args.force)
    except OutputDirError as err:
        return str(err)


def add_load(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("load", help="replay a scenario's workload against an OpenAI-compatible "
                                    "server and measure it on the client")
    p.add_argument("url", help="the server's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("scenario", nargs="?", help="scenario YAML; omit for the built-in default")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field (repeatable)")
    p.add_argument("--model", help="model id to send (default: the first at /v1/models)")
    p.add_argument("--api-key", help="sent as `Authorization: Bearer KEY`")
    p.add_argument("--chat", action="store_true",
                   help="use /v1/chat/completions (default /v1/completions with token ids)")
    p.add_argument("--tokenizer", help="tokenizer for synthetic prompts (default: the "
                                       "scenario's workload.tokenizer, else byte)")
    p.add_argument("--max-concurrency", type=int, help="cap on requests in flight")
    p.add_argument("--rate", help="request rate(s) in req/s, comma-separated for a sweep "
                                  "(e.g. 1,2,4,inf; inf sends every request at once): sets "
                                  "workload.arrivals.rate; a sweep writes OUT/rate-<R>/ each")
    p.add_argument("--compare", action="store_true",
                   help="also simulate the requests as sent and write the fidelity report "
                        "(OUT/fidelity/)")
    p.add_argument("--out", help="output directory (default results/<name>-load)")
    add_force_option(p)
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no table")
    p.set_defaults(func=_load)


def _load(args: argparse.Namespace) -> int:
    from urllib.parse import urlparse

    from sim.config.loader import load_scenario
    from sim.config.yaml_input import ScenarioError

    parsed = urlparse(args.url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        return fail(f"url: must be http://HOST:PORT or https://..., got {args.url!r}")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        return fail(f"--max-concurrency: must be >= 1, got {args.max_concurrency}")
    try:
        scenario, base_dir = load_scenario(args.scenario, args.overrides)
    except ScenarioError as err:
        return fail(str(err))
    prepared = tokenizer_and_stage(args, scenario, "-load", "load")
    if isinstance(prepared, str):
        return fail(prepared)
    tokenizer, out_dir, stage = prepared
    try:
        rates = _rates(args.rate)
    except ValueError as err:
        return fail(str(err))
    runs = []
    for rate in rates:
        sets = args.overrides if rate is None or math.isinf(rate) else \
            [*args.overrides, f"workload.arrivals.rate={rate}"]
        try:
            runs.append((rate, *load_scenario(args.scenario, sets)))
        except ScenarioError as err:
            return fail(f"--rate: {err}")
    with stage:
        for rate, run_scenario, run_base in runs:
            out = stage.path if len(runs) == 1 else stage.path / f"rate-{rate:g}"
            try:
                written = _measure(args, run_scenario, run_base, tokenizer, out, rate)
            except (ValueError, FileNotFoundError) as err:
                return fail(f"{args.scenario or 'default scenario'}: {err}")
            if written is None:
                return 1
        stage.commit()
    if not args.quiet:
        print(f"results in {out_dir}/")
    return 0


def _rates(text: str | None) -> list[float | None]:
    """--rate's values: positive numbers or inf; [None] without --rate."""
    if text is None:
        return [None]
    rates = []
    for piece in text.split(","):
        try:
            rate = float(piece)
        except ValueError:
            rate = math.nan
        if not rate > 0:
            raise ValueError(f"--rate: each rate must be a number > 0 or inf, got "
                             f"{piece.strip()[:60]!r}")
        rates.append(rate)
    return rates


def _measure(args, scenario, base_dir, tokenizer, out: Path,  # noqa: ANN001
             rate: float | None = None) -> list[Path] | None:
    import json

    from tqdm import tqdm

    from sim.plots.run import plot_latency_cdfs
    from sim.results.files.report import format_summary
    from sim.results.files.write import write_run_files
    from sim.serve.bench import bench_result
    from sim.serve.load import LoadError, load_summary, run_load
    from sim.workload import make_requests

    workload = list(make_requests(scenario.workload, scenario.seed, base_dir))
    if rate is not None and math.isinf(rate):  # every request at once, as vLLM's inf
        for request in workload:
            request.arrival_s = 0.0
    with tqdm(total=len(workload), unit="req", disable=args.quiet, desc="load") as bar:
        try:
            recorder, measured = run_load(args.url, workload, tokenizer, args.model, args.chat,
                                          args.api_key, args.max_concurrency, bar.update)
        except LoadError as err:
            print(f"error: {err}", file=sys.stderr)
            return None
    summary = load_summary(recorder, measured, args.url)
    requests = recorder.requests_frame()
    written = write_run_files(out, summary, requests, recorder.steps_frame())
    sent_rate = rate if rate is not None else getattr(scenario.workload.arrivals, "rate",
                                                      math.inf)
    bench = bench_result(measured, args.model or scenario.model_spec.name, tokenizer.name,
                         float(sent_rate), args.max_concurrency, scenario.name)
    written.append(out / "vllm_bench.json")
    written[-1].write_text(json.dumps(bench) + "\n")
    plots = scenario.output.plots and not args.no_plots
    if plots:
        written.append(plot_latency_cdfs(requests, out / "latency_cdf.png"))
    if not args.quiet:
        print(format_summary(summary))
    if args.compare:
        from sim.serve.fidelity import compare, markdown, replayed_requests, write_report

        fidelity = compare(scenario, args.url, summary, requests,
                           replayed_requests(measured, workload), base_dir)
        written += write_report(fidelity, out / "fidelity", plots)
        if not args.quiet:
            print(markdown(fidelity, plots=False))
    return written
