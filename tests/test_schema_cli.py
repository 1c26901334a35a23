"""`servesim schema`: every field, its type, default and meaning, from the models themselves."""

from __future__ import annotations

import argparse
import json

import pytest
from pydantic import BaseModel

import sim.config.draws
import sim.config.scenario
import sim.config.sections
import sim.config.speculative
import sim.config.workload
from sim.cli import build_parser, main
from sim.cli.schema_doc import field_docs
from sim.config.scenario import SCHEMA_VERSION, Scenario


def schema_json(capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["schema", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def scenario_models() -> list[type[BaseModel]]:
    """Every section model the scenario schema defines, the workload's included."""
    modules = (sim.config.scenario, sim.config.sections, sim.config.speculative,
               sim.config.workload, sim.config.draws)
    return [m for module in modules for m in vars(module).values() if isinstance(m, type)
            and issubclass(m, BaseModel) and m.__module__ == module.__name__
            and m.model_fields]


def test_every_field_of_the_scenario_models_has_a_meaning() -> None:
    missing = [f"{m.__name__}.{name}" for m in scenario_models()
               for name, field in m.model_fields.items() if not field.description]
    assert missing == []


def test_every_top_level_field_and_section_is_listed(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    data = schema_json(capsys)
    assert data["schema_version"] == SCHEMA_VERSION
    paths = {f["path"] for f in data["fields"]}
    assert set(Scenario.model_fields) <= paths
    for model in (Scenario.model_fields["kv"].annotation,
                  Scenario.model_fields["scheduler"].annotation):
        prefix = next(k for k, f in Scenario.model_fields.items() if f.annotation is model)
        assert {f"{prefix}.{name}" for name in model.model_fields} <= paths
    assert "speculative.acceptance[dist=beta].std" in paths
    assert "workload.arrivals[process=gamma].burstiness" in paths


def test_defaults_are_the_schemas_own(capsys: pytest.CaptureFixture[str]) -> None:
    """Each listed default equals what an omitted field becomes."""
    defaults = Scenario().model_dump(mode="json")
    checked = 0
    for field in schema_json(capsys)["fields"]:
        if "[" in field["path"] or field["path"].startswith("workload"):
            continue  # choice members and the workload (its default is the quickstart's)
        *parents, leaf = field["path"].split(".")
        node = defaults
        for part in parents:
            node = node[part] if node is not None else None
        if node is None:
            continue  # in an optional section (slo, disaggregation), absent by default
        assert field["default"] == node[leaf], field["path"]
        checked += 1
    assert checked > 50


def test_types_show_choices_and_bounds() -> None:
    docs = {d.path: d for d in field_docs()}
    assert docs["scheduler.policy"].type == "continuous | static | dynamic"
    assert docs["hardware.memory_utilization"].type == "float > 0.0, <= 1.0"
    assert docs["kv.num_blocks"].type.startswith("int | null >= 2")
    assert docs["workload.arrivals"].type.startswith("section by process (poisson | gamma")
    assert docs["speculative.acceptance[dist=uniform].low"].required


def test_text_lists_each_field_with_its_meaning(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    out = capsys.readouterr().out
    assert f"version {SCHEMA_VERSION}" in out.splitlines()[0]
    assert "kv.block_size: int >= 1 = 16\n    tokens per KV block" in out
    assert "name: str = \"quickstart\"" in out


def test_every_option_of_every_command_has_help() -> None:
    """`calibrate profile --block-size`, `--dtype` and `engine generate --device` had none."""

    def missing(parser: argparse.ArgumentParser, prefix: str) -> list[str]:
        found = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found += missing(sub, f"{prefix} {name}")
            elif not isinstance(action, argparse._HelpAction | argparse._VersionAction) \
                    and not action.help:
                found.append(f"{prefix} {'/'.join(action.option_strings) or action.dest}")
        return found

    assert missing(build_parser(), "servesim") == []
