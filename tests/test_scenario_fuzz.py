"""Random YAML documents and random `--set` overrides: a valid scenario or one ScenarioError.

Nothing a user can type may reach them as a traceback. The documents mix the
schema's own field names and values (so many get deep into validation) with
junk; the examples below pin the shapes that once crashed the loader.
"""

from __future__ import annotations

import copy
import re
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sim.cli.schema_doc import field_docs
from sim.config.loader import load_scenario
from sim.config.scenario import Scenario
from sim.config.yaml_input import ScenarioError

PATHS = sorted({re.sub(r"\[[^]]*\]", "", doc.path) for doc in field_docs()})
NAMES = sorted({part for path in PATHS for part in path.split(".")})
WORDS = ["poisson", "gamma", "constant", "fixed", "uniform", "lognormal", "empirical",
         "continuous", "static", "dynamic", "paged", "contiguous", "roofline", "table",
         "recompute", "swap", "llama-3-8b", "tiny", "h100-sxm", "ngram", "prefix_aware"]

keys = st.sampled_from(NAMES) | st.text(max_size=6)
scalars = (st.none() | st.booleans() | st.integers() | st.floats() | st.sampled_from(WORDS)
           | st.text(max_size=10))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(keys, inner, max_size=4), max_leaves=16)
# values a field might really take, so that some documents get deep into validation
plausible = (st.integers(-2, 100_000) | st.floats(-1, 10) | st.sampled_from(WORDS)
             | st.booleans() | st.none() | values)
QUICKSTART = yaml.safe_load((Path(__file__).resolve().parents[1] / "scenarios" /
                             "quickstart.yaml").read_text())


def mutated(changes: list[tuple[str, object]]) -> str:
    """The quickstart with a few fields set to random values."""
    raw = copy.deepcopy(QUICKSTART)
    for path, value in changes:
        *parents, leaf = path.split(".")
        node = raw
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[leaf] = value
    return yaml.safe_dump(raw)


def dumped(value: object) -> str:
    return yaml.safe_dump(value).strip()


documents = (st.lists(st.tuples(st.sampled_from(PATHS), plausible), max_size=3).map(mutated)
             | st.dictionaries(keys, values, max_size=6).map(yaml.safe_dump)
             | values.map(yaml.safe_dump) | st.text(max_size=60))
value_texts = plausible.map(dumped) | st.text(max_size=20)
paths = st.sampled_from(PATHS) | st.lists(keys, min_size=1, max_size=3).map(".".join)
overrides = st.lists(st.tuples(paths, value_texts).map("=".join) | st.text(max_size=15),
                     max_size=3)


def load(text: str, sets: list[str]) -> Scenario | ScenarioError:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzz.yaml"
        path.write_text(text)
        try:
            return load_scenario(path, sets)[0]
        except ScenarioError as err:
            return err


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents, overrides)
@example("a: " + "[" * 3000 + "]" * 3000, [])
@example("seed: 1" + "0" * 5000, [])
@example("seed: 0x" + "f" * 5000, [])
@example("a: &x [*x]", [])
@example("0x" + "f" * 5000 + ": 1", [])
@example("workload: {num_requests: 3}", ["workload.num_requests=" + "9" * 30])
@example("name: q", ["seed=" + "{a: " * 200 + "}" * 200])
@example("name: q", ["model=!!python/object:os.system"])
@example("when: 2024-13-45", [])
def test_the_loader_gives_a_scenario_or_one_message(text: str, sets: list[str]) -> None:
    outcome = load(text, sets)
    if isinstance(outcome, ScenarioError):
        message = str(outcome)
        assert message and "Traceback" not in message and len(message) < 4000
        assert message.split(":")[0] and "\n" not in message.splitlines()[0]
    else:
        assert isinstance(outcome, Scenario)
