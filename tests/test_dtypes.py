"""Weight and KV dtypes: bytes per element with scales, and where each one is charged."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sim.cli import main
from sim.config.catalogue import get_hardware, get_model
from sim.config.costs import kv_bytes_per_token, weights_bytes, weights_read_bytes
from sim.config.dtypes import get_dtype
from sim.config.loader import validate_scenario
from sim.config.yaml_input import ScenarioError
from sim.core.plan import StepShape
from sim.latency.roofline import RooflineLatency

H100 = get_hardware("h100-sxm")


@pytest.mark.parametrize(("name", "expected"), [
    ("bf16", 2.0), ("fp16", 2.0), ("fp32", 4.0), ("fp8", 1.0), ("int8", 1.0),
    ("fp8-block", 1 + 4 / (128 * 128)),  # an fp32 scale per 128x128 block
    ("int4", (4 + (16 + 4) / 128) / 8),  # fp16 scale + 4-bit zero per 128
    ("int4-g64", (4 + (16 + 4) / 64) / 8),
    ("int8-g128", (8 + (16 + 8) / 128) / 8),
    ("mxfp4", (4 + 8 / 32) / 8),  # an E8M0 scale per 32
    ("nvfp4", (4 + 8 / 16) / 8),  # an fp8 scale per 16
])
def test_bytes_per_element_count_the_scales(name: str, expected: float) -> None:
    assert get_dtype(name).bytes_per_element == expected


@pytest.mark.parametrize("name", ["fp6", "int4-g0", "int3-g128", ""])
def test_unknown_dtype_names_the_choices(name: str) -> None:
    with pytest.raises(ValueError, match="known: fp32, bf16"):
        get_dtype(name)


def test_weights_and_kv_dtypes_are_apart() -> None:
    base = get_model("llama-3-8b")
    fp8_kv = dataclasses.replace(base, kv_dtype="fp8")
    assert kv_bytes_per_token(fp8_kv) == kv_bytes_per_token(base) / 2
    assert weights_bytes(fp8_kv) == weights_bytes(base)
    fp8_w = dataclasses.replace(base, weight_dtype="fp8")
    assert kv_bytes_per_token(fp8_w) == kv_bytes_per_token(base)
    vocab = 2 * 128256 * 4096  # embedding and lm_head stay bf16
    norms = 32 * 2 * 4096 + 4096
    linear = base.total_params - vocab - norms
    assert weights_bytes(fp8_w) == linear * 1 + (vocab + norms) * 2


def test_roofline_charges_fp8_matmuls_at_the_fp8_rate() -> None:
    base = get_model("llama-3-8b")
    prefill = StepShape((8192,), (0,), 0, 0, 0, 1)
    bf16 = RooflineLatency(base, H100).breakdown(prefill)
    fp8 = RooflineLatency(dataclasses.replace(base, weight_dtype="fp8"), H100).breakdown(prefill)
    int4 = RooflineLatency(dataclasses.replace(base, weight_dtype="int4"), H100).breakdown(prefill)
    # weight-only int4 dequantises to bf16: same compute; fp8 runs at twice the rate
    assert int4["compute_s"] == pytest.approx(bf16["compute_s"])
    assert fp8["compute_s"] < 0.7 * bf16["compute_s"]
    a100 = get_hardware("a100-80gb")  # no fp8 tensor cores: bf16's rate
    assert RooflineLatency(dataclasses.replace(base, weight_dtype="fp8"), a100).breakdown(
        prefill)["compute_s"] == pytest.approx(RooflineLatency(base, a100).breakdown(
            prefill)["compute_s"])


def test_roofline_reads_the_stored_bytes() -> None:
    base = get_model("llama-3-8b")
    decode = StepShape((), (), 1, 0, 0, 1)
    for name in ("fp8", "int4", "mxfp4"):
        model = dataclasses.replace(base, weight_dtype=name)
        read = RooflineLatency(model, H100).breakdown(decode)["bytes"]
        bf16_read = RooflineLatency(base, H100).breakdown(decode)["bytes"]
        saved = weights_read_bytes(base, 1) - weights_read_bytes(model, 1)
        assert bf16_read - read == pytest.approx(saved)
        assert saved > 0


def test_scenario_kv_dtype_bytes_exits_naming_the_new_fields() -> None:
    with pytest.raises(ScenarioError, match="kv_dtype"):
        validate_scenario({"kv": {"dtype_bytes": 1}}, "test")
    scenario = validate_scenario({"model": {"base": "llama-3-8b", "weight_dtype": "fp8",
                                            "kv_dtype": "fp8"}}, "test")
    assert scenario.model_spec.kv.name == "fp8" and scenario.model_spec.weights.name == "fp8"
    with pytest.raises(ScenarioError, match="kv_dtype: unknown dtype 'fp5'"):
        validate_scenario({"model": {"base": "llama-3-8b", "kv_dtype": "fp5"}}, "test")


def test_deprecated_dtype_bytes_still_works_with_a_notice(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", "--dtype-bytes", "1", "--json"]) == 0
    out, err = capsys.readouterr()
    assert err.strip() == ("servesim capacity: --dtype-bytes is deprecated and will be removed; "
                           "use --weight-dtype fp8 --kv-dtype fp8")
    report = json.loads(out)
    assert (report["weight_dtype"], report["kv_dtype"]) == ("fp8", "fp8")


def test_capacity_sheet_names_both_dtypes_in_each_term(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", "--weight-dtype", "int4", "--kv-dtype", "fp8"]) == 0
    rows = dict(line.split("  ", 1) for line in capsys.readouterr().out.splitlines()
                if not line.startswith(" "))
    assert "int4-g128 0.51953 B" in rows["setup"] and "KV fp8 1 B" in rows["setup"]
    assert "fp8 1 B" in rows["KV per token"]
    assert "int4-g128" in rows["weights"]
    assert "(int4-g128)" in rows["decode floor"] and "(fp8)" in rows["decode floor"]
