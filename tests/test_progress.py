"""A run's progress bar (sim.experiments.progress): silent and tqdm-free until its delay has
passed, then a tqdm bar that starts from the count so far."""

import subprocess
import sys

from sim.experiments.progress import DelayedBar


def test_a_bar_past_its_delay_shows_every_request_counted(capsys) -> None:  # noqa: ANN001
    with DelayedBar(10, "simulating", "req", delay_s=0.0) as bar:
        bar.update(3)  # opens the bar with these three
        bar.update(7)
        assert bar._bar is not None and bar._bar.n == 10
    err = capsys.readouterr().err
    assert "simulating" in err and "10/10" in err


def test_a_disabled_bar_never_opens(capsys) -> None:  # noqa: ANN001
    with DelayedBar(10, "simulating", "req", delay_s=0.0, enabled=False) as bar:
        bar.update(10)
        assert bar._bar is None
    assert capsys.readouterr().err == ""


def test_a_bar_within_its_delay_loads_no_tqdm() -> None:
    code = ("import sys\nfrom sim.experiments.progress import DelayedBar\n"
            "with DelayedBar(5, 'simulating', 'req', delay_s=3600.0) as bar:\n"
            "    bar.update(5)\n"
            "print('tqdm' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
    assert out.stderr == ""
