"""The `servesim` command: one thin face per subcommand (sim.cli.run, experiments, capacity,
schema, tokens, explain, engine, calibrate), and how every command ends.

The one place in sim that reaches gpu_engine and calibrate, lazily, inside the
commands that need them (so `servesim --help` and the simulator never load
torch); nothing imports this package. Ctrl-C and a closed pipe end any command quietly.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings
from collections.abc import Sequence
from typing import NoReturn

from sim import __version__
from sim.cli import interrupts, start_up

# Every command: the sim.cli module that adds it to the parser, and how (in --help's order).
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("run", "add_run"), "compare": ("experiments", "add_compare"),
    "sweep": ("experiments", "add_sweep"), "plan": ("plan", "register"),
    "capacity": ("capacity", "register"), "schema": ("schema", "register"),
    "tokens": ("tokens", "register"), "explain": ("explain", "register"),
    "plot": ("explain", "register"),  # explain's module adds both
    "engine": ("engine", "register"),
    "calibrate": ("calibrate", "register"),  # its commands load calibrate (and torch) as they run
    "serve": ("serve", "add_serve"),  # aiohttp (and, with --engine, torch) only when it runs
    "load": ("serve_load", "add_load"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """servesim's parser: every command, or only `command` (one of COMMANDS) in full and so
    only its module (`servesim run` loads neither the tokenizers nor the others' parsers:
    ~8 ms of a quickstart run). Its help and its errors are the same either way."""
    import importlib

    parser = argparse.ArgumentParser(
        prog="servesim", description="Simulate LLM serving and answer capacity questions.")
    parser.add_argument("--version", action="version", version=f"servesim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    chosen = COMMANDS.get(command or "")
    for name, (module, adder) in COMMANDS.items():
        if name in sub.choices:
            continue  # added by its module with another command
        if chosen in (None, (module, adder)):
            getattr(importlib.import_module(f"sim.cli.{module}"), adder)(sub)
        else:  # a bare name: the usage line of a usage error still lists every command
            sub.add_parser(name)
    return parser


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str,
                      lineno: int, file: object = None, line: str | None = None) -> None:
    """A warning is for the user: one `warning: ...` line, not the source line that raised it."""
    print(f"warning: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; Ctrl-C and a closed pipe end it quietly, for every command.

    Ctrl-C: exit code 130 and one line; loky's worker processes are stopped so no
    semaphore is leaked, and a result directory in the making is removed
    (sim.results.files.output_dir). A reader that stops early (`servesim explain ... | head`):
    the rest of the output is dropped and the exit code is 141, as for SIGPIPE.
    """
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        args = build_parser(argv[0] if argv else None).parse_args(argv)
        if not getattr(args, "own_start_up", False):  # else the command says when (run)
            start_up.started()
        with warnings.catch_warnings():  # restores the usual display when the command returns
            warnings.showwarning = _one_line_warning
            code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit flush
        return code
    except KeyboardInterrupt:
        interrupts.stop()
        _stop_workers()
        lead = "\n" if sys.stderr.isatty() else ""  # end a progress bar's line first
        print(f"{lead}interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _drop_stdout()
        return 141
    except Exception as err:  # noqa: BLE001 - re-raised unless Ctrl-C caused it
        from sim.results.files.output_dir import OutputDirError

        if isinstance(err, OutputDirError):  # a result that could not be put in place
            print(f"error: {err}", file=sys.stderr)
            return 2
        if not interrupts.caused_by_interrupt(err):
            raise
        interrupts.stop()
        _stop_workers()
        print("interrupted", file=sys.stderr)
        return 130


def console() -> NoReturn:
    """The `servesim` process (the console script, `python -m sim.cli`): `main`, started
    without garbage collections or a scan for pydantic plugins (sim.cli.start_up), with a
    Ctrl-C raised again until the command takes it (sim.cli.interrupts)."""
    start_up.begin()
    interrupts.install()
    code = main()
    interrupts.stop()  # a Ctrl-C the command never saw: it is done now
    start_up.leaving()
    sys.exit(code)


def _stop_workers() -> None:
    """Shut joblib's reusable loky pool down, if one was started, so it frees its semaphores."""
    loky = sys.modules.get("joblib.externals.loky.reusable_executor")
    executor = getattr(loky, "_executor", None)
    if executor is not None:
        # interrupted while the pool was starting: nothing runs yet, and shutdown may say so
        with contextlib.suppress(RuntimeError):
            executor.shutdown(wait=True, kill_workers=True)


def _drop_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's last flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (captured in tests): nothing to flush
        pass
