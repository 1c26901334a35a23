"""sim.core is shared by the simulator and the engine, so it must import neither."""

import subprocess
import sys


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
