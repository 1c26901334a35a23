"""Reading a scenario: a file (or the built-in default), `--set` overrides, validation.

Every way this can fail is one `ScenarioError` naming the file and the field,
never a traceback: the YAML is read safely (sim.config.yaml_input) and
pydantic's report is rewritten into the user's field paths (sim.config.error_text).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sim.config.checks import shown
from sim.config.error_text import boolean_for_number, format_errors
from sim.config.scenario import DEFAULT_WORKLOAD, Scenario
from sim.config.specs import check_tp
from sim.config.yaml_input import ScenarioError, check_plain, parse_yaml, read_yaml


def apply_overrides(raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply `key.path=value` strings (values parsed as YAML) to a raw scenario dict.

    A key given twice is an error: the last one silently winning hides a typo.
    """
    given: dict[str, str] = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        *parents, leaf = key.strip().split(".")
        if not sep or not all((*parents, leaf)):
            raise ScenarioError(f"--set {shown(item)}: expected key.path=value")
        path = ".".join((*parents, leaf))
        if path in given:
            raise ScenarioError(f"--set {shown(path)}: given twice ({shown(given[path], 30)} "
                                f"and {shown(item, 30)}); give each key once")
        given[path] = item
        node = raw
        for part in parents:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif part == "trace" and isinstance(child, str):  # `trace: FILE` is {path: FILE}
                child = node[part] = {"path": child}
            if not isinstance(child, dict):
                raise ScenarioError(f"--set {shown(item)}: {part!r} is {shown(child, 30)}, "
                                    "not a section")
            node = child
        # checked with the whole scenario (validate_scenario), which names the field
        node[leaf] = parse_yaml(text, f"--set {shown(item)}: value", check=False)
    return raw


def read_scenario_raw(path: Path) -> dict[str, Any]:
    """A scenario file's mapping, before validation; named after the file unless it says.

    An empty file is an error rather than the quickstart (which would overwrite
    results/quickstart/), and a compare spec is pointed at `servesim compare`.
    """
    raw = read_yaml(path, "scenario")
    if raw is None or raw == {}:
        raise ScenarioError(f"{path}: the scenario file is empty; give at least one field "
                            "(`servesim schema` lists them), or run `servesim run` with no "
                            "file for the built-in quickstart")
    if not isinstance(raw, dict):
        raise ScenarioError(f"{path}: a scenario must be a mapping of fields, "
                            f"got {type(raw).__name__}")
    if "variants" in raw:
        raise ScenarioError(f"{path}: this is a compare spec (it has variants), not a "
                            f"scenario; run it with `servesim compare {path}`")
    if "name" not in raw:
        raw["name"] = re.sub(r"[^A-Za-z0-9._-]", "_", path.stem).lstrip(".")[:100] or "scenario"
    return raw


def load_scenario(path: str | Path | None, overrides: Sequence[str] = ()) -> tuple[Scenario, Path]:
    """Read, override and validate a scenario; returns it and its base folder."""
    if path is None:
        raw: dict[str, Any] = {}
        base_dir = Path.cwd()
    else:
        path = Path(path)
        raw = read_scenario_raw(path)
        base_dir = path.resolve().parent
    if "workload" not in raw and not any(o.strip().startswith("workload.trace")
                                         for o in overrides):
        # an omitted workload means the default one; `--set workload.x=...` edits it
        raw["workload"] = copy.deepcopy(DEFAULT_WORKLOAD)
    raw = with_default_workload(apply_overrides(raw, overrides))
    return validate_scenario(_model_config_near(raw, base_dir),
                             str(path or "default scenario")), base_dir


def with_default_workload(raw: dict[str, Any]) -> dict[str, Any]:
    """A scenario's partial synthetic `workload:` completed from the default one.

    A field left out (arrivals, prompt_tokens, output_tokens, and num_requests when
    duration_s is not given either) is the default's; a field that names no
    `process:`/`dist:` and only keys the default's has (`arrivals: {rate: 2}`) changes
    those keys of the default's. A field that names its process or distribution is the
    user's whole, so a file that spells its workload out runs exactly as written; a
    trace replay takes nothing from the default.
    """
    workload = raw.get("workload")
    if not isinstance(workload, dict) or "trace" in workload:
        return raw
    merged = copy.deepcopy(DEFAULT_WORKLOAD)
    if "num_requests" in workload or "duration_s" in workload:
        del merged["num_requests"]
    for key, value in workload.items():
        default = merged.get(key)
        if isinstance(value, dict) and isinstance(default, dict) and \
                not value.keys() & {"process", "dist"} and value.keys() <= default.keys():
            value = {**default, **value}
        merged[key] = value
    return {**raw, "workload": merged}


def _model_config_near(raw: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """`model: {config: PATH}` is relative to the scenario's folder (else to the cwd)."""
    model = raw.get("model")
    if isinstance(model, dict) and isinstance(model.get("config"), str):
        given = Path(model["config"])
        if not given.is_absolute() and (base_dir / given).exists():
            raw = {**raw, "model": {**model, "config": str(base_dir / given)}}
    return raw


def validate_scenario(raw: dict[str, Any], source: str) -> Scenario:
    """Validate a raw mapping; every problem becomes one ScenarioError naming `source`."""
    check_plain(raw, source)
    flag = boolean_for_number(raw, Scenario)
    if flag is not None:
        raise ScenarioError(f"{source}: {flag}: takes no true/false (a boolean is not a number "
                            "here); give the value itself")
    try:
        scenario = Scenario.model_validate(raw)
    except ValidationError as err:
        raise ScenarioError(format_errors(err, source, Scenario)) from None
    try:
        check_tp(scenario.model_spec, scenario.hardware.tensor_parallel)  # a rank's GPUs
    except ValueError as err:
        raise ScenarioError(f"{source}: hardware.count: {err}") from None
    return scenario
