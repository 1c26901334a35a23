"""What each part of the house loads at run time: sim.core neither simpy nor torch, the
simulator no torch, the engine no simpy (the import-linter contracts say the same of the
import graph; these check what a real interpreter ends up loading)."""

import json
import subprocess
import sys

import pytest


def test_sim_core_loads_neither_simpy_nor_torch() -> None:
    code = (
        "import sys, sim.core, sim.core.schedulers\n"
        "bad = [m for m in ('simpy', 'torch') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"sim.core imported {out.stdout.strip()}"


def test_simulator_does_not_load_torch() -> None:
    code = (
        "import sys, sim.cli, sim.experiments.run, sim.world.fleet\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_engine_loads_no_simpy() -> None:
    """The engine keeps its own time: neither it nor its replay needs the SimPy world."""
    pytest.importorskip("torch")
    code = (
        "import sys, gpu_engine, gpu_engine.engine, gpu_engine.setup, gpu_engine.replay\n"
        "print(','.join(m for m in sys.modules if m == 'simpy' or m.startswith('sim.world')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"the engine loaded {out.stdout.strip()}"


HEAVY = ("numpy", "pandas", "matplotlib", "scipy", "pydantic", "yaml", "simpy", "torch")


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["schema", "--help"]])
def test_help_loads_no_heavy_library(argv: list[str]) -> None:
    """`servesim --help` builds the parser only: every command loads its libraries when run."""
    code = (
        "import contextlib, io, sys\nfrom sim.cli import main\n"
        f"with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        f"    main({argv!r})\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"servesim {' '.join(argv)} loaded {out.stdout.strip()}"


def test_a_run_without_plots_loads_neither_matplotlib_nor_scipy(tmp_path) -> None:  # noqa: ANN001
    code = (
        "import sys\nfrom pathlib import Path\n"
        "from sim.config.loader import load_scenario\n"
        "from sim.experiments.outputs import write_outputs\n"
        "from sim.experiments.run import run_scenario\n"
        "sc, _ = load_scenario(None, ['workload.num_requests=30'])\n"
        f"write_outputs(run_scenario(sc, show_progress=False), Path({str(tmp_path)!r}), False)\n"
        "print(','.join(m for m in ('matplotlib', 'scipy') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"a run loaded {out.stdout.strip()}"


# What `servesim run --no-plots` needs none of: the replications' sweep machinery and joblib
# (one run), a latency table's reader (a roofline run), matplotlib and scipy (no plots),
# pandas (requests.csv streams, the time series is written from columns), tqdm (a short run
# shows no bar); for a synthetic workload, neither the trace readers, the tokenizers nor
# the conversations, and for a catalogue model no config.json reader; statistics (a t
# quantile's normal approximation, past 10,000 degrees of freedom).
NOT_IN_A_RUN = ("joblib", "matplotlib", "scipy", "pandas", "tqdm", "sim.experiments.replicate",
                "sim.experiments.sweep", "sim.experiments.runner", "sim.latency.table_files",
                "sim.plots", "sim.workload.trace", "sim.workload.traces",
                "sim.workload.csv_traces", "sim.workload.text", "sim.workload.conversations",
                "sim.text", "sim.config.hf_config", "statistics")


def test_a_run_without_plots_loads_only_what_it_uses(tmp_path) -> None:  # noqa: ANN001
    code = (
        "import sys\nfrom sim.cli import main\n"
        f"code = main(['run', '--no-plots', '--quiet', '--set', 'workload.num_requests=30', "
        f"'--out', {str(tmp_path / 'out')!r}])\n"
        f"print(code, ','.join(m for m in {NOT_IN_A_RUN!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    code, _, loaded = out.stdout.strip().partition(" ")
    assert code == "0", out.stderr
    assert (tmp_path / "out" / "summary.json").exists()
    assert loaded == "", f"servesim run --no-plots loaded {loaded}"


def test_the_workload_package_names_load_from_their_modules_on_first_use() -> None:
    """sim.workload re-exports its traces' and conversations' names lazily: a synthetic
    workload loads neither; reading a name loads its module and gives that module's object."""
    code = (
        "import importlib, json, sys\nimport sim.workload as w\n"
        "before = sorted(m for m in sys.modules if m.startswith(('sim.workload.', 'sim.text')))\n"
        "same = {n: getattr(w, n) is getattr(importlib.import_module(f'sim.workload.{m}'), n)"
        " for n, m in w._LAZY.items()}\n"
        "print(json.dumps([before, same, set(w._LAZY) <= set(w.__all__)]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, same, exported = json.loads(out.stdout)
    assert before == ["sim.workload.arrivals", "sim.workload.build", "sim.workload.config",
                      "sim.workload.lengths", "sim.workload.prefixes"]
    assert same and all(same.values()), same
    assert exported  # every lazy name is part of the package's API
    import sim.workload

    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        sim.workload.no_such_name  # noqa: B018


def test_the_default_scenario_loads_without_the_yaml_parser() -> None:
    """PyYAML loads when there is YAML to read: the built-in default (`servesim run` with no
    file) never parses any, so it must not pay the parser's import; a file then loads it."""
    code = (
        "import sys\nfrom sim.config.loader import load_scenario\n"
        "load_scenario(None)\nbefore = 'yaml' in sys.modules\n"
        "from sim.config.yaml_input import parse_yaml\n"
        "print(before, parse_yaml('a: [1, 2]', 'text'), 'yaml' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False {'a': [1, 2]} True"
