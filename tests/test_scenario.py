"""Scenario loading: the shipped files, the defaults, overrides and every error message."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.config.loader import load_scenario
from sim.config.scenario import DEFAULT_WORKLOAD, Scenario
from sim.config.yaml_input import ScenarioError

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"

SYNTHETIC = """
workload:
  arrivals: {process: poisson, rate: 2}
  prompt_tokens: {dist: fixed, value: 100}
  output_tokens: {dist: fixed, value: 10}
  num_requests: 10
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str, overrides: tuple[str, ...] = ()) -> str:
    with pytest.raises(ScenarioError) as info:
        load_scenario(write(tmp_path, text), overrides)
    return str(info.value)


def assert_clean(message: str) -> None:
    """What a user should never see: pydantic internals, URLs, union member names."""
    for noise in ("errors.pydantic.dev", "Value error,", "function-after", "dict[str",
                  ".str", "poisson.", "lognormal", "For further information", "Traceback"):
        assert noise not in message, f"{noise!r} leaked into: {message}"


# -- the shipped scenarios -------------------------------------------------------

def test_quickstart_yaml_is_the_schema_defaults_plus_an_slo() -> None:
    loaded, base_dir = load_scenario(SCENARIOS / "quickstart.yaml")
    assert base_dir == SCENARIOS
    assert loaded.slo is not None and loaded.slo.ttft_ms == 500 and loaded.slo.tpot_ms == 50
    default = Scenario()
    assert loaded.model_copy(update={"slo": None, "description": ""}) == default
    assert loaded.model_dump(exclude={"slo", "description"}) == default.model_dump(
        exclude={"slo", "description"})


def test_default_lengths_fit_the_default_models_context() -> None:
    """No request of the quickstart may be rejected for max_model_len."""
    default = Scenario()
    longest = DEFAULT_WORKLOAD["prompt_tokens"]["max"] + DEFAULT_WORKLOAD["output_tokens"]["max"]
    assert longest <= default.model_spec.max_context_tokens
    assert default.workload.arrivals is not None and default.workload.arrivals.rate == 8.0


def test_no_file_means_the_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    scenario, base_dir = load_scenario(None)
    assert scenario == Scenario()
    assert base_dir == tmp_path


@pytest.mark.parametrize("text", ["# nothing here\n", "", "{}\n"])
def test_an_empty_file_is_an_error_not_the_quickstart(tmp_path: Path, text: str) -> None:
    """An empty file once ran the quickstart silently and overwrote results/quickstart/."""
    message = error_of(tmp_path, text)
    assert "the scenario file is empty" in message and "servesim run" in message


def test_a_file_without_a_name_is_named_after_the_file(tmp_path: Path) -> None:
    path = tmp_path / "my run.yaml"
    path.write_text(SYNTHETIC)
    assert load_scenario(path)[0].name == "my_run"
    assert load_scenario(write(tmp_path, "name: kept\n" + SYNTHETIC))[0].name == "kept"


# -- overrides -------------------------------------------------------------------

def test_set_overrides_nested_fields_with_yaml_values(tmp_path: Path) -> None:
    scenario, _ = load_scenario(write(tmp_path, SYNTHETIC), (
        "workload.arrivals.rate=8.5", "scheduler.chunked_prefill=false", "model=qwen2.5-7b",
        "workload.num_requests=200"))
    assert scenario.workload.arrivals is not None and scenario.workload.arrivals.rate == 8.5
    assert scenario.scheduler.chunked_prefill is False
    assert scenario.model_spec.name == "qwen2.5-7b"
    assert scenario.workload.num_requests == 200


def test_set_creates_missing_sections(tmp_path: Path) -> None:
    scenario, _ = load_scenario(write(tmp_path, SYNTHETIC), ("slo.ttft_ms=250", "kv.num_blocks=64"))
    assert scenario.slo is not None and scenario.slo.ttft_ms == 250 and scenario.slo.tpot_ms is None
    assert scenario.kv.num_blocks == 64


def test_set_on_an_omitted_workload_edits_the_default_one() -> None:
    """`servesim run --set workload.num_requests=200` must not wipe the default workload."""
    scenario, _ = load_scenario(None, ("workload.num_requests=200", "workload.arrivals.rate=3"))
    expected = Scenario().workload.model_copy(update={"num_requests": 200})
    assert scenario.workload.num_requests == 200
    assert scenario.workload.prompt_tokens == expected.prompt_tokens
    assert scenario.workload.arrivals is not None and scenario.workload.arrivals.rate == 3


def test_set_value_can_be_a_yaml_mapping(tmp_path: Path) -> None:
    scenario, _ = load_scenario(write(tmp_path, SYNTHETIC),
                                ("workload.output_tokens={dist: uniform, low: 5, high: 9}",))
    assert scenario.workload.output_tokens is not None
    assert scenario.workload.output_tokens.model_dump()["high"] == 9


@pytest.mark.parametrize("override", ["workload.num_requests", "=3", "a..b=1", ".x=1"])
def test_malformed_set_is_an_error(override: str) -> None:
    with pytest.raises(ScenarioError, match="expected key.path=value") as info:
        load_scenario(None, (override,))
    assert repr(override) in str(info.value)


def test_set_through_a_scalar_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "model: llama-3-8b\n")
    with pytest.raises(ScenarioError, match="'model' is 'llama-3-8b', not a section"):
        load_scenario(path, ("model.num_layers=4",))


def test_set_value_that_is_not_yaml_is_an_error() -> None:
    with pytest.raises(ScenarioError, match=r"seed=\[1,.*not valid YAML"):
        load_scenario(None, ("seed=[1,",))


def test_set_value_is_validated_like_the_file(tmp_path: Path) -> None:
    message = error_of(tmp_path, SYNTHETIC, ("scheduler.max_num_seqs=-4",))
    assert "scheduler.max_num_seqs" in message and "-4" in message


# -- file-level errors -----------------------------------------------------------

def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="no such scenario file") as info:
        load_scenario(tmp_path / "nope.yaml")
    assert "nope.yaml" in str(info.value)


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path)


def test_invalid_yaml_is_one_line_with_its_position(tmp_path: Path) -> None:
    message = error_of(tmp_path, "name: x\nworkload: [1, 2\nseed: 3\n")
    assert "not valid YAML" in message and "line 3, column 5" in message
    assert "\n" not in message


@pytest.mark.parametrize("text, kind", [("- a\n- b\n", "list"), ("42\n", "int"),
                                        ("just words\n", "str")])
def test_non_mapping_file(tmp_path: Path, text: str, kind: str) -> None:
    message = error_of(tmp_path, text)
    assert "must be a mapping" in message and kind in message


# -- schema errors: path, problem and value, one line each -----------------------

def test_unknown_top_level_key_lists_allowed_keys(tmp_path: Path) -> None:
    message = error_of(tmp_path, "modle: llama-3-8b\n")
    assert "modle: unknown key; allowed: name, description, seed, model, hardware" in message
    assert "\n" not in message
    assert_clean(message)


def test_unknown_nested_key_lists_that_sections_keys(tmp_path: Path) -> None:
    message = error_of(tmp_path, "scheduler:\n  max_num_seq: 3\n")
    assert "scheduler.max_num_seq: unknown key; allowed: policy, max_num_seqs," in message
    assert_clean(message)


def test_unknown_key_inside_a_union_member_is_located_and_explained(tmp_path: Path) -> None:
    message = error_of(tmp_path, SYNTHETIC.replace("rate: 2", "rate: 2, jitter: 1"))
    assert "workload.arrivals.jitter: unknown key; allowed: process, rate, burstiness" in message
    assert_clean(message)


def test_wrong_type_names_field_and_value(tmp_path: Path) -> None:
    message = error_of(tmp_path, "scheduler:\n  max_num_seqs: many\n")
    assert message.endswith("scheduler.max_num_seqs: Input should be a valid integer, "
                            "unable to parse string as an integer (got 'many')")
    assert_clean(message)


def test_negative_rate_is_located_without_the_union_tag(tmp_path: Path) -> None:
    message = error_of(tmp_path, SYNTHETIC.replace("rate: 2", "rate: -1"))
    assert "workload.arrivals.rate: Input should be greater than 0 (got -1)" in message
    assert_clean(message)


def test_unknown_arrival_process_lists_the_choices(tmp_path: Path) -> None:
    message = error_of(tmp_path, SYNTHETIC.replace("process: poisson", "process: bursty"))
    assert ("workload.arrivals.process: unknown value 'bursty'; "
            "allowed: poisson, gamma, constant") in message
    assert_clean(message)


def test_missing_discriminator_is_named(tmp_path: Path) -> None:
    message = error_of(tmp_path, SYNTHETIC.replace("dist: fixed, value: 100", "value: 100"))
    assert "workload.prompt_tokens.dist: missing; allowed: fixed, uniform, normal" in message


def test_section_check_reports_the_section_not_its_whole_input(tmp_path: Path) -> None:
    text = SYNTHETIC.replace("{dist: fixed, value: 100}",
                             "{dist: lognormal, mean: 10, cv: 1, min: 20, max: 5}")
    message = error_of(tmp_path, text)
    assert message.endswith("workload.prompt_tokens: min (20) must be <= max (5)")
    assert_clean(message)


def test_unknown_model_lists_known_models(tmp_path: Path) -> None:
    message = error_of(tmp_path, "model: llama-9b\n")
    assert "model: unknown model 'llama-9b'; known: llama-3-8b, llama-3-70b" in message
    assert message.count("llama-9b") == 1  # the value is in the message: no "(got ...)" echo
    assert_clean(message)


def test_model_of_wrong_type_is_one_line(tmp_path: Path) -> None:
    message = error_of(tmp_path, "model: 3\n")
    assert message.endswith("model: Input should be a valid string or a valid dictionary (got 3)")
    assert_clean(message)


def test_unknown_gpu_lists_known_gpus(tmp_path: Path) -> None:
    message = error_of(tmp_path, "hardware:\n  gpu: h900\n")
    assert "hardware.gpu: unknown hardware 'h900'; known: h100-sxm" in message
    assert_clean(message)


def test_section_that_is_not_a_mapping(tmp_path: Path) -> None:
    message = error_of(tmp_path, "hardware: h100-sxm\n")
    assert message.endswith("hardware: Input should be a valid dictionary (got 'h100-sxm')")


def test_several_problems_one_line_each(tmp_path: Path) -> None:
    message = error_of(tmp_path, "seed: x\nhardware:\n  count: 0\nfoo: 1\n")
    lines = message.splitlines()
    assert lines[0].endswith(": 3 problems")
    assert [line.split(":")[0].strip() for line in lines[1:]] == [
        "seed", "hardware.count", "foo"]
    assert "(got 0)" in lines[2]


def test_custom_model_and_gpu_by_fields(tmp_path: Path) -> None:
    scenario, _ = load_scenario(write(tmp_path, (
        "model: {base: llama-3-8b, name: llama-3-8b-deep, num_layers: 40}\n"
        "hardware:\n  gpu: {base: h100-sxm, memory_bytes: 1.0e+11}\n")))
    assert scenario.model_spec.name == "llama-3-8b-deep"
    assert scenario.model_spec.num_layers == 40
    assert scenario.model_spec.hidden_size == Scenario().model_spec.hidden_size
    assert scenario.hardware_spec.memory_bytes == 1e11


def test_custom_model_with_a_bad_field_is_an_error(tmp_path: Path) -> None:
    message = error_of(tmp_path, "model: {base: llama-3-8b, layers: 40}\n")
    assert "model: unknown ModelSpec field 'layers'; allowed:" in message
    assert_clean(message)


def test_token_budget_below_max_num_seqs_is_a_scheduler_error(tmp_path: Path) -> None:
    message = error_of(tmp_path, "scheduler: {max_num_seqs: 64, max_num_batched_tokens: 32}\n")
    assert message.endswith("scheduler: max_num_batched_tokens (32) must be >= max_num_seqs (64) "
                            "so every decode fits a step")


def test_tensor_parallel_count_must_divide_the_heads(tmp_path: Path) -> None:
    message = error_of(tmp_path, "hardware: {count: 3}\n")
    assert "hardware.count: tp=3 must divide num_heads=32 of llama-3-8b" in message
    load_scenario(write(tmp_path, "hardware: {count: 4}\n"))  # a divisor is fine
