"""Test set-up that must work on every install, the simulator-only one included.

`pip install -e . pytest hypothesis` has no nbmake, torch or tokenizer packages: pytest then
accepts the configured `--nbmake` and collects no notebooks, and notebooks that run the engine
skip where torch is missing (the engine's test files skip themselves with importorskip).
Hypothesis runs derandomized (the same examples every run, so a submission never fails on a
draw); `HYPOTHESIS_PROFILE=explore` searches afresh.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

try:  # the suite's property tests draw the same examples on every run: no run fails by chance
    from hypothesis import settings
except ImportError:  # pragma: no cover - hypothesis is in the test extra
    settings = None
if settings is not None:
    settings.register_profile("ci", derandomize=True, database=None)
    settings.register_profile("explore", derandomize=False)  # HYPOTHESIS_PROFILE=explore
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

HAS_TORCH = importlib.util.find_spec("torch") is not None
ENGINE_WORDS = ("import torch", "gpu_engine", "calibrate")  # a notebook cell that runs the engine

if importlib.util.find_spec("nbmake") is None:
    def pytest_addoption(parser: pytest.Parser) -> None:
        parser.addoption("--nbmake", action="store_true",
                         help="(nbmake is not installed: notebooks are not collected)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_TORCH:
        return
    skip = pytest.mark.skip(reason="this notebook runs the engine: torch is not installed")
    for item in items:
        path = item.path
        if path.suffix == ".ipynb" and any(w in path.read_text() for w in ENGINE_WORDS):
            item.add_marker(skip)
