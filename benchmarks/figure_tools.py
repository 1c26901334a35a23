"""How a figure step runs: the commands it types, the files it publishes, the README it refreshes.

benchmarks/figure_steps.py's steps are written with these (a `servesim`
command as a reader types it, its output shown as a fenced block, a picture
copied into docs/); benchmarks/regenerate.py gives each step its `Context`.
They are apart from both so that a step reads as what it publishes and the
runner as how sections are kept, neither as subprocess plumbing.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class StepFailed(Exception):
    """A command of a step exited with an unexpected status."""


@dataclass(frozen=True, slots=True)
class Context:
    work: Path  # scratch results, absolute
    stamp: str  # machine and commit, computed once before anything is written
    readme: Path  # the README whose quoted runs are refreshed (a copy, in the tests)


@dataclass(frozen=True, slots=True)
class Step:
    name: str
    what: str
    cost: str  # measured wall time on a 2-core machine (all steps: ~15 min)
    publishes: tuple[str, ...]  # paths, relative to the repository, besides docs/figures.md
    run: Callable[[Context], str]  # returns the Markdown body of the step's section


def command(args: Sequence[str], ok: Sequence[int] = (0,)) -> str:
    """Run `args` in the repository root; stdout is returned, stderr (progress bars) shown."""
    done = subprocess.run(list(args), cwd=REPO, stdout=subprocess.PIPE, text=True)
    if done.returncode not in ok:
        raise StepFailed(f"`{' '.join(args)}` exited with status {done.returncode}")
    return done.stdout


def servesim(*args: str, ok: Sequence[int] = (0,)) -> str:
    return command([sys.executable, "-m", "sim.cli", *args], ok)


def shown(args: Sequence[str], output: str) -> str:
    """A fenced block: the command as a reader types it, then what it printed."""
    return f"```\n$ servesim {' '.join(args)}\n{output.rstrip()}\n```\n"


def publish(source: Path, target: str) -> None:
    (REPO / target).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, REPO / target)


def run_and_show(*args: str, ok: Sequence[int] = (0,)) -> str:
    return shown(args, servesim(*args, ok=ok))


def refresh_readme(readme: Path, command_line: str, output: str) -> None:
    """Replace what the README shows under `$ command_line` with `output` (the same fenced
    block, the same command line): the README quotes runs, and tests hold it to them."""
    text = readme.read_text()
    head = f"$ {command_line}\n"
    start = text.index(head) + len(head)
    end = text.index("```", start)
    readme.write_text(text[:start] + output.rstrip("\n") + "\n" + text[end:])

