"""`servesim engine generate|replay`: the real PyTorch engine from the command line.

Only the argument parsing lives here; torch and gpu_engine are imported when
an engine command runs, so the simulator never loads them.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from sim.cli.run import add_force_option


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("engine", help="run the real PyTorch engine (needs torch)")
    sub = p.add_subparsers(dest="engine_command", required=True)

    g = sub.add_parser("generate", help="stream text from a model (random weights by default)")
    g.add_argument("--prompt", required=True, help="the prompt text")
    g.add_argument("--max-tokens", type=int, default=64, help="tokens to generate (default 64)")
    g.add_argument("--model", default="tiny", help="catalogue model (default tiny)")
    g.add_argument("--weights", help="local Hugging Face directory (config.json + safetensors)")
    g.add_argument("--tokenizer", default=None,
                   help="byte (default), a tokenizer name, or a tokenizer.json path "
                        "(default: the weights directory's tokenizer.json if any, else byte)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-k", type=int, default=0, help="0 = off")
    g.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    g.add_argument("--seed", type=int, default=0, help="weights and sampling seed")
    g.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="where the model runs: auto (default) = cuda if torch sees a GPU, "
                        "else cpu")
    g.add_argument("--stop-at-eos", action="store_true",
                   help="end the stream at the tokenizer's end-of-sequence token")
    g.set_defaults(func=_generate)

    r = sub.add_parser("replay", help="serve a scenario's workload on the engine "
                                      "(same schema and result files as `servesim run`)")
    r.add_argument("scenario", help="scenario YAML (see scenarios/engine_cpu.yaml)")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field, e.g. --set workload.num_requests=20 (repeatable)")
    r.add_argument("--device", choices=("auto", "cpu", "cuda"), help="override engine.device")
    r.add_argument("--virtual-clock", action="store_true",
                   help="advance time by the scenario's latency model instead of the wall "
                        "clock (arrivals are not waited for)")
    r.add_argument("--out", help="output directory (default: results/<name>_engine, or "
                                 "results/<name>_engine_virtual with --virtual-clock; plus the "
                                 "--set overrides and --device, if any)")
    add_force_option(r)
    r.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    r.add_argument("--quiet", action="store_true", help="no progress bar, no table")
    r.set_defaults(func=_replay)


def _engine_modules() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        print("error: the engine needs PyTorch: pip install 'servesim[engine]'", file=sys.stderr)
        return False
    return True


def _generate(args: argparse.Namespace) -> int:
    if not _engine_modules():
        return 2
    from gpu_engine.generate import GenerateError, generate_text, weights_notice

    if args.max_tokens < 1:
        print(f"error: --max-tokens must be >= 1, got {args.max_tokens}", file=sys.stderr)
        return 2
    notice = weights_notice(args.model, args.weights)
    if notice:
        print(notice, file=sys.stderr)
    try:
        for piece in generate_text(args.prompt, args.max_tokens, model=args.model,
                                   weights=args.weights, tokenizer=args.tokenizer,
                                   temperature=args.temperature, top_k=args.top_k,
                                   top_p=args.top_p, seed=args.seed, device=args.device,
                                   stop_at_eos=args.stop_at_eos):
            sys.stdout.write(piece)
            sys.stdout.flush()
    except (GenerateError, ValueError, FileNotFoundError) as err:
        print(f"\nerror: {err}", file=sys.stderr)
        return 2
    sys.stdout.write("\n")
    return 0


def replay_dir(name: str, overrides: list[str], device: str | None, virtual_clock: bool
               ) -> Path:
    """The default results directory: one per clock, device and set of overrides, so a
    virtual-clock replay never replaces a wall-clock one (or a CUDA one a CPU one)."""
    from sim.results.files.output_dir import variant_dir

    knobs = [*overrides, *([f"engine.device={device}"] if device else [])]
    return variant_dir(name, knobs, "_engine_virtual" if virtual_clock else "_engine")


def _replay(args: argparse.Namespace) -> int:
    from sim.cli.run import out_dir_of
    from sim.config.loader import load_scenario
    from sim.config.yaml_input import ScenarioError
    from sim.results.files.output_dir import OutputDirError, Staging

    try:
        scenario, base_dir = load_scenario(args.scenario, args.overrides)
        out_dir, field = out_dir_of(args.out, None, replay_dir(
            scenario.name, args.overrides, args.device, args.virtual_clock))
        stage = Staging(out_dir, field, "engine replay", args.force)  # before torch loads
    except (ScenarioError, OutputDirError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    with stage:
        if not _engine_modules():
            return 2
        from gpu_engine.replay import replay_scenario
        from sim.assemble import build_latency
        from sim.experiments.outputs import write_outputs

        try:
            latency = build_latency(scenario) if args.virtual_clock else None
            run = replay_scenario(scenario, base_dir, show_progress=not args.quiet,
                                  latency=latency, device=args.device)
        except (ValueError, FileNotFoundError) as err:
            print(f"error: {args.scenario}: {err}", file=sys.stderr)
            return 2
        write_outputs(run.result, stage.path, plots=scenario.output.plots and not args.no_plots)
        run.write_steps(stage.path)
        stage.commit()
    if not args.quiet:
        _print_replay(run, out_dir)
    return 0


def _print_replay(run: Any, out_dir: Path) -> None:
    from sim.results.files.report import format_summary

    result, steps = run.result, run.steps
    scenario = result.scenario
    device_ms = sum(s.device_s for s in steps) * 1e3
    wall_ms = sum(s.wall_s for s in steps) * 1e3
    print(f"scenario {scenario.name}: {scenario.model_spec.name} on {result.latency_name}, "
          f"{scenario.scheduler.policy} batching, {result.num_blocks} KV blocks of "
          f"{scenario.kv.block_size} tokens")
    print(format_summary(result.summary))
    share = device_ms / wall_ms if wall_ms > 0 else math.nan
    print(f"{len(steps)} steps: kernels {device_ms:.0f} ms of {wall_ms:.0f} ms step wall "
          f"time ({share:.0%}); served in {result.wall_s:.2f} s; results in {out_dir}/")
