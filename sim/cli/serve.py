"""`servesim serve SCENARIO`: an OpenAI-compatible server, simulated (default) or the engine.

Everything a user can get wrong (the scenario, the port, the output
directory, the tokenizer) is checked before the server binds; Ctrl-C then
shuts it down cleanly and writes what it served (sim.serve.server).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from sim.cli.run import add_force_option
from sim.cli.serve_load import fail, tokenizer_and_stage


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
    p.add_argument("--api-key", help="require `Authorization: Bearer KEY` on /v1 routes, as "
                                     "vLLM does (default: $VLLM_API_KEY, else "
                                     "$SERVESIM_API_KEY; the environment keeps it out of `ps`)")
    p.add_argument("--served-model-name", help="the model id clients send (default: the "
                                               "scenario's model)")
    p.add_argument("--tokenizer", help="tokenizer for prompts and text (default: the scenario's "
                                       "workload.tokenizer, else byte)")
    p.add_argument("--out", help="where the served requests are written at Ctrl-C (default "
                                 "results/<name>-served)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--replicas", type=int, help="start N simulated servers on consecutive ports "
                                                "from --port, each with its own clock, /metrics "
                                                "and KV events (default: the scenario's replicas)")
    p.add_argument("--router-port", type=int, help="with --replicas: also a front port that "
                                                   "routes each request with the scenario's "
                                                   "router.policy")
    p.add_argument("--kv-events-config", metavar="JSON",
                   help="publish KV-cache events as vLLM does, with vLLM's JSON, e.g. "
                        "'{\"enable_kv_cache_events\": true, \"endpoint\": \"tcp://*:5557\"}' "
                        "(needs pyzmq and msgpack: pip install servesim[events])")
    add_force_option(p)
    p.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from sim.config.loader import load_scenario
    from sim.config.yaml_input import ScenarioError

    try:
        scenario, base_dir = load_scenario(args.scenario, args.overrides)
    except ScenarioError as err:
        return fail(str(err))
    if not 0 <= args.port <= 65535:
        return fail(f"--port: must be 0..65535, got {args.port}")
    replicas = scenario.replicas if args.replicas is None else args.replicas
    if replicas < 1:
        return fail(f"--replicas: must be >= 1, got {replicas}")
    if replicas > 1 and args.engine:
        return fail(f"--replicas: the engine backend serves one replica, got {replicas}")
    if args.router_port is not None and not 0 <= args.router_port <= 65535:
        return fail(f"--router-port: must be 0..65535, got {args.router_port}")
    if args.port and args.port + replicas - 1 > 65535:
        return fail(f"--port: {args.port} + {replicas} replicas runs past port 65535")
    from sim.serve.kv_events import KVEventsConfigError, parse_config

    try:
        kv_events = parse_config(args.kv_events_config)
    except KVEventsConfigError as err:
        return fail(str(err))
    if kv_events is not None and not _has_events_packages():
        return fail("--kv-events-config: needs pyzmq and msgpack (pip install "
                     "servesim[events])")
    args.kv_events, args.replicas = kv_events, replicas
    if replicas > 1:
        scenario = scenario.model_copy(update={"replicas": 1})
    prepared = tokenizer_and_stage(args, scenario, "-served", "serve")
    if isinstance(prepared, str):
        return fail(prepared)
    tokenizer, out_dir, stage = prepared
    with stage:
        if replicas > 1:
            status = _serve_fleet(scenario, base_dir, tokenizer, args, stage.path)
            if status:
                return status
            stage.commit()
            print(f"results in {out_dir}/", file=sys.stderr)
            return 0
        try:
            served = (_engine(scenario, base_dir, tokenizer, args) if args.engine else
                      _simulated(scenario, base_dir, tokenizer, args))
        except (ValueError, FileNotFoundError) as err:
            return fail(f"{args.scenario or 'default scenario'}: {err}")
        from sim.serve.server import serve_forever, write_served

        def ready(port: int) -> None:
            kind = "engine" if args.engine else f"simulated, {served.latency_name}"
            print(f"serving {served.model.name} ({kind}) on http://{args.host}:{port}/v1 ; "
                  "Ctrl-C to stop", file=sys.stderr, flush=True)

        try:
            server = serve_forever(served, args.host, args.port, ready)
        except OSError as err:
            return fail(f"--port: cannot bind {args.host}:{args.port}: {err.strerror or err}")
        write_served(server, stage.path, plots=scenario.output.plots and not args.no_plots)
        stage.commit()
    count = len(server.served.loop.recorder.requests_frame())
    print(f"served {count} requests; results in {out_dir}/", file=sys.stderr)
    return 0


def _has_events_packages() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("zmq", "msgpack"))


def _serve_fleet(scenario, base_dir, tokenizer, args, out: Path) -> int:  # noqa: ANN001
    """--replicas N: N simulated servers (and a front with --router-port) until Ctrl-C; each
    replica's served requests go to OUT/replica-<i>/."""
    from sim.serve.fleet import Fleet, replica_events, serve_fleet_forever
    from sim.serve.server import simulated_served, write_served
    from sim.world.router import build_router

    key, name = api_key_of(args.api_key, dict(os.environ)), _model_name(args, scenario)
    try:
        served = [simulated_served(scenario, tokenizer, base_dir, name, key,
                                   kv_events=replica_events(args.kv_events, i))
                  for i in range(args.replicas)]
    except (ValueError, FileNotFoundError) as err:
        return fail(f"{args.scenario or 'default scenario'}: {err}")
    router = None if args.router_port is None else build_router(
        scenario.router.policy, scenario.router.load_limit)
    fleet = Fleet(served, args.host, args.port, router, args.router_port, scenario.seed)

    def ready(ports: list[int]) -> None:
        urls = ", ".join(f"http://{args.host}:{p}/v1" for p in ports[:args.replicas])
        print(f"serving {name} (simulated, {served[0].latency_name}) x{args.replicas} on "
              f"{urls}", file=sys.stderr, flush=True)
        if router is not None:
            print(f"routing ({scenario.router.policy}) on http://{args.host}:{ports[-1]}/v1 ;"
                  " Ctrl-C to stop", file=sys.stderr, flush=True)

    try:
        serve_fleet_forever(fleet, ready)
    except OSError as err:
        return fail(f"--port: cannot bind {args.host}:{args.port}..: {err.strerror or err}")
    for i, server in enumerate(fleet.servers):
        write_served(server, out / f"replica-{i}",
                     plots=scenario.output.plots and not args.no_plots)
    return 0


def api_key_of(given: str | None, environ: dict[str, str]) -> str | None:
    """--api-key, else VLLM_API_KEY (as vLLM reads it), else SERVESIM_API_KEY; empty is none."""
    for key in (given, environ.get("VLLM_API_KEY"), environ.get("SERVESIM_API_KEY")):
        if key:
            return key
    return None


def _model_name(args: argparse.Namespace, scenario: object) -> str:
    return args.served_model_name or scenario.model_spec.name  # type: ignore[attr-defined]


def _simulated(scenario, base_dir: Path | None, tokenizer, args):  # noqa: ANN001, ANN202
    from sim.serve.server import simulated_served

    return simulated_served(scenario, tokenizer, base_dir, _model_name(args, scenario),
                            api_key_of(args.api_key, dict(os.environ)),
                            kv_events=args.kv_events)


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
    loop = ServeLoop(stepper, tokenizer, max_model_len=max_len)
    return Served(loop, ServedModel(_model_name(args, scenario), max_len,
                                    api_key_of(args.api_key, dict(os.environ)), "engine"),
                  scenario, budget, "engine", args.kv_events)
