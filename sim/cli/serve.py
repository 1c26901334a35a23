"""`servesim serve SCENARIO`: an OpenAI-compatible server, simulated (default) or the engine.

Everything a user can get wrong (the scenario, the port, the output
directory, the tokenizer) is checked before the server binds; Ctrl-C then
shuts it down cleanly and writes what it served (sim.serve.server).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a scenario over OpenAI's API (simulated, or the "
                                     "real engine with --engine)")
    p.add_argument("scenario", nargs="?", help="scenario YAML; omit for the built-in default")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field (repeatable)")
    p.add_argument("--engine", action="store_true",
                   help="run the real PyTorch engine (CPU, or CUDA when present) instead of the "
                        "latency model")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = any free)")
    p.add_argument("--api-key", help="require `Authorization: Bearer KEY` on /v1 routes")
    p.add_argument("--served-model-name", help="the model id clients send (default: the "
                                               "scenario's model)")
    p.add_argument("--tokenizer", help="tokenizer for prompts and text (default: the scenario's "
                                       "workload.tokenizer, else byte)")
    p.add_argument("--out", help="where the served requests are written at Ctrl-C (default "
                                 "results/<name>-served)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.set_defaults(func=_serve)


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _serve(args: argparse.Namespace) -> int:
    from sim.cli.run import out_dir_of
    from sim.config.loader import load_scenario
    from sim.config.yaml_input import ScenarioError
    from sim.results.files.output_dir import OutputDirError, Staging, variant_dir
    from sim.text import TokenizerError, load_tokenizer

    try:
        scenario, base_dir = load_scenario(args.scenario, args.overrides)
    except ScenarioError as err:
        return _fail(str(err))
    if not 0 <= args.port <= 65535:
        return _fail(f"--port: must be 0..65535, got {args.port}")
    if scenario.replicas != 1:
        return _fail(f"replicas: a server is one replica, got {scenario.replicas}")
    try:
        tokenizer = load_tokenizer(args.tokenizer or scenario.workload.tokenizer or "byte")
    except TokenizerError as err:
        return _fail(f"--tokenizer: {err}")
    out_dir, field = out_dir_of(args.out, None, variant_dir(scenario.name, args.overrides,
                                                             "-served"))
    try:
        stage = Staging(out_dir, field)
    except OutputDirError as err:
        return _fail(str(err))
    with stage:
        try:
            served = (_engine(scenario, base_dir, tokenizer, args) if args.engine else
                      _simulated(scenario, base_dir, tokenizer, args))
        except (ValueError, FileNotFoundError) as err:
            return _fail(f"{args.scenario or 'default scenario'}: {err}")
        from sim.serve.server import serve_forever, write_served

        def ready(port: int) -> None:
            kind = "engine" if args.engine else f"simulated, {served.latency_name}"
            print(f"serving {served.model.name} ({kind}) on http://{args.host}:{port}/v1 ; "
                  "Ctrl-C to stop", file=sys.stderr, flush=True)

        try:
            server = serve_forever(served, args.host, args.port, ready)
        except OSError as err:
            return _fail(f"--port: cannot bind {args.host}:{args.port}: {err.strerror or err}")
        write_served(server, stage.path, plots=scenario.output.plots and not args.no_plots)
        stage.commit()
    count = len(server.served.loop.recorder.requests_frame())
    print(f"served {count} requests; results in {out_dir}/", file=sys.stderr)
    return 0


def _model_name(args: argparse.Namespace, scenario: object) -> str:
    return args.served_model_name or scenario.model_spec.name  # type: ignore[attr-defined]


def _simulated(scenario, base_dir: Path | None, tokenizer, args):  # noqa: ANN001, ANN202
    from sim.serve.server import simulated_served

    return simulated_served(scenario, tokenizer, base_dir, _model_name(args, scenario),
                            args.api_key)


def _engine(scenario, base_dir: Path | None, tokenizer, args):  # noqa: ANN001, ANN202
    from gpu_engine.setup import EngineSetupError
    from sim.cli.serve_engine import build_engine_stepper
    from sim.serve.app import ServedModel
    from sim.serve.loop import ServeLoop
    from sim.serve.server import Served

    try:
        stepper, budget, max_len = build_engine_stepper(scenario, tokenizer, base_dir)
    except EngineSetupError as err:
        raise ValueError(str(err)) from None
    loop = ServeLoop(stepper, tokenizer)
    return Served(loop, ServedModel(_model_name(args, scenario), max_len, args.api_key),
                  scenario, budget, "engine")


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
    p.add_argument("--compare", action="store_true",
                   help="also simulate the requests as sent and write the fidelity report "
                        "(OUT/fidelity/)")
    p.add_argument("--out", help="output directory (default results/<name>-load)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no table")
    p.set_defaults(func=_load)


def _load(args: argparse.Namespace) -> int:
    from urllib.parse import urlparse

    from sim.cli.run import out_dir_of
    from sim.config.loader import load_scenario
    from sim.config.yaml_input import ScenarioError
    from sim.results.files.output_dir import OutputDirError, Staging, variant_dir
    from sim.text import TokenizerError, load_tokenizer

    parsed = urlparse(args.url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        return _fail(f"url: must be http://HOST:PORT or https://..., got {args.url!r}")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        return _fail(f"--max-concurrency: must be >= 1, got {args.max_concurrency}")
    try:
        scenario, base_dir = load_scenario(args.scenario, args.overrides)
    except ScenarioError as err:
        return _fail(str(err))
    try:
        tokenizer = load_tokenizer(args.tokenizer or scenario.workload.tokenizer or "byte")
    except TokenizerError as err:
        return _fail(f"--tokenizer: {err}")
    out_dir, field = out_dir_of(args.out, None, variant_dir(scenario.name, args.overrides,
                                                             "-load"))
    try:
        stage = Staging(out_dir, field)
    except OutputDirError as err:
        return _fail(str(err))
    with stage:
        try:
            written = _measure(args, scenario, base_dir, tokenizer, stage.path)
        except (ValueError, FileNotFoundError) as err:
            return _fail(f"{args.scenario or 'default scenario'}: {err}")
        if written is None:
            return 1
        stage.commit()
    if not args.quiet:
        print(f"results in {out_dir}/")
    return 0


def _measure(args, scenario, base_dir, tokenizer, out: Path) -> list[Path] | None:  # noqa: ANN001
    from tqdm import tqdm

    from sim.plots.run import plot_latency_cdfs
    from sim.results.files.report import format_summary
    from sim.results.files.write import write_run_files
    from sim.serve.load import LoadError, load_summary, run_load
    from sim.workload import make_requests

    workload = list(make_requests(scenario.workload, scenario.seed, base_dir))
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
