"""Link: validation, the transfer and collective arithmetic, the catalogue's links, and the
roofline's collectives priced from them (every figure read from the data, never copied)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from sim.config.catalogue import (
    HARDWARE,
    LINKS,
    get_hardware,
    get_model,
    hardware_from_fields,
    link_from_fields,
)
from sim.config.link import Link, all_to_all_s, allreduce_bus_bytes, allreduce_s, transfer_s
from sim.config.loader import validate_scenario
from sim.config.yaml_input import ScenarioError
from sim.core.kv_transfer import swap_move
from sim.core.plan import StepShape
from sim.latency.kv_transfer import step_moves_s
from sim.latency.roofline import RooflineLatency

PCIE = Link("pcie", 25e9, 10e-6, generation=4)
LLAMA70 = get_model("llama-3-70b")
DECODE = StepShape((), (), 64, 64 * 1000, 1000, 64)  # 64 decodes, no padding
# GPUs whose datasheets give them no NVLink (or, for h100-pcie, none in a plain server)
PCIE_ONLY = ("h100-pcie", "l40s", "l4", "a10g", "rtx-4090", "rtx-pro-6000", "l20")


@pytest.mark.parametrize(("fields", "message"), [
    ({"kind": "warp"}, "link kind must be one of nvlink, pcie, .*got 'warp'"),
    ({"bandwidth_bytes_per_s": -1.0}, "bandwidth_bytes_per_s must be a finite number > 0, "
                                      "or None for a free link, got -1.0"),
    ({"bandwidth_bytes_per_s": math.inf}, "bandwidth_bytes_per_s .* got inf"),
    ({"bandwidth_bytes_per_s": True}, "bandwidth_bytes_per_s .* got True"),
    ({"latency_s": math.nan}, "latency_s must be a finite number >= 0, got nan"),
    ({"latency_s": -1e-6}, "latency_s must be a finite number >= 0, got -1e-06"),
    ({"generation": 0}, "generation of a pcie link must be a whole number 1-7, got 0"),
    ({"generation": 4.0}, "generation of a pcie link .* got 4.0"),
    ({"kind": "nvlink", "generation": 6}, "generation of a nvlink link .* 0-5, got 6"),
    ({"kind": "tcp", "generation": 3}, "generation of a tcp link .* 0 \\(none\\), got 3"),
    ({"kind": "rdma", "generation": 0}, "line_rate_gbit_per_s is required for an rdma link"),
    ({"line_rate_gbit_per_s": 400.0}, "line_rate_gbit_per_s is for rdma and tcp links only"),
    ({"kind": "rdma", "generation": 0, "line_rate_gbit_per_s": 100.0},
     "bandwidth_bytes_per_s=25000000000.0 is more than its line rate of 100.0 Gb/s"),
])
def test_a_bad_link_says_which_field_and_what_is_allowed(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(PCIE, **fields)


def test_rdma_and_free_links_are_valid() -> None:
    rdma = Link("rdma", 48e9, 40e-6, line_rate_gbit_per_s=400)
    assert rdma.line_rate_gbit_per_s == 400 and not rdma.free
    assert Link("tcp", None, 1e-4).free


def test_transfer_is_latency_plus_bytes_over_bandwidth() -> None:
    assert transfer_s(PCIE, 1e9) == pytest.approx(10e-6 + 1e9 / 25e9, rel=1e-15)
    assert transfer_s(PCIE, 0) == 0.0  # nothing moved, no copy issued
    with pytest.raises(ValueError, match="nbytes must be a finite number >= 0, got -1"):
        transfer_s(PCIE, -1)


def test_allreduce_is_what_nccl_tests_would_report() -> None:
    # 4 ranks, 1 MB: latency + 2 * 3/4 * 1e6 / 25e9 = 10 us + 60 us
    assert allreduce_s(PCIE, 1e6, 4) == pytest.approx(70e-6, rel=1e-12)
    assert allreduce_bus_bytes(1e6, 4) == 1.5e6
    # nccl-tests: algbw = S / t, busbw = algbw * 2(n-1)/n; past the latency, busbw is the link's
    for ranks in (2, 4, 8):
        algbw = 8e6 / (allreduce_s(PCIE, 8e6, ranks) - PCIE.latency_s)
        assert algbw * 2 * (ranks - 1) / ranks == pytest.approx(25e9, rel=1e-12)
    assert allreduce_s(PCIE, 1e6, 1) == 0.0
    assert allreduce_s(PCIE, 0, 8) == 0.0
    with pytest.raises(ValueError, match="ranks must be a whole number >= 1, got 0"):
        allreduce_s(PCIE, 1e6, 0)


def test_all_to_all_sends_all_but_its_own_share() -> None:
    # 8 ranks, 8 MB each: 7/8 of it leaves every rank
    assert all_to_all_s(PCIE, 8e6, 8) == pytest.approx(10e-6 + 7e6 / 25e9, rel=1e-12)
    assert all_to_all_s(PCIE, 8e6, 1) == 0.0


def test_a_free_link_costs_its_latency_only() -> None:
    free = Link("nvlink", None, 5e-6, generation=4)
    assert transfer_s(free, 1e12) == 5e-6
    assert allreduce_s(free, 1e12, 8) == 5e-6
    assert all_to_all_s(free, 1e12, 8) == 5e-6
    hw = dataclasses.replace(get_hardware("h100-sxm"), link=free)
    assert hw.interconnect_bandwidth_bytes_per_s == math.inf
    roof = RooflineLatency(LLAMA70, hw, tp=4)
    assert roof.breakdown(DECODE)["allreduce_s"] == pytest.approx(2 * 80 * 5e-6, rel=1e-12)


def test_every_catalogue_gpu_names_its_links_and_every_figure_its_source() -> None:
    raw = json.loads((Path(__file__).parent.parent / "sim" / "config" / "data" /
                      "links.json").read_text())["links"]
    assert set(raw) == set(LINKS)
    for name, entry in raw.items():
        assert entry["bandwidth_source"].strip() and entry["latency_source"].strip(), name
    for name, hw in HARDWARE.items():
        assert hw.link in LINKS.values(), name
        assert hw.host_link in LINKS.values(), name
        assert hw.link.kind in ("nvlink", "pcie", "infinity-fabric"), name
    for name in PCIE_ONLY:
        assert HARDWARE[name].link.kind == "pcie", name
    assert HARDWARE["h100-sxm"].link == LINKS["nvlink4"]
    assert HARDWARE["a100-80gb"].link == LINKS["nvlink3"]
    assert HARDWARE["b200"].link == LINKS["nvlink5"]


def test_the_roofline_all_reduce_is_the_gpu_links() -> None:
    link = LINKS["nvlink4"]
    per_reduce = 64 * LLAMA70.hidden_size * 2  # 64 rows of bf16 hidden state
    expected = 2 * LLAMA70.num_layers * (link.latency_s
                                         + 2 * 3 / 4 * per_reduce / link.bandwidth_bytes_per_s)
    roof = RooflineLatency(LLAMA70, get_hardware("h100-sxm"), tp=4)
    assert roof.breakdown(DECODE)["allreduce_s"] == pytest.approx(expected, rel=1e-12)
    # a user's latency replaces the link's, the bandwidth stays
    zero = RooflineLatency(LLAMA70, get_hardware("h100-sxm"), tp=4, allreduce_latency_s=0.0)
    assert zero.breakdown(DECODE)["allreduce_s"] == pytest.approx(
        expected - 2 * LLAMA70.num_layers * link.latency_s, rel=1e-12)
    with pytest.raises(ValueError, match="allreduce_latency_s must be finite and >= 0"):
        RooflineLatency(LLAMA70, get_hardware("h100-sxm"), tp=4, allreduce_latency_s=-1.0)


def test_a_pcie_gpus_all_reduce_costs_more_than_an_nvlink_ones() -> None:
    sxm = get_hardware("h100-sxm")
    nvlink = RooflineLatency(LLAMA70, sxm, tp=4).breakdown(DECODE)["allreduce_s"]
    pcie = RooflineLatency(LLAMA70, dataclasses.replace(sxm, link=LINKS["pcie5"]),
                           tp=4).breakdown(DECODE)["allreduce_s"]
    card = RooflineLatency(LLAMA70, get_hardware("h100-pcie"), tp=4).breakdown(DECODE)
    assert pcie > nvlink > 0
    assert card["allreduce_s"] == pytest.approx(pcie, rel=1e-12)


def test_the_ep_all_to_all_goes_over_the_link() -> None:
    mixtral = get_model("mixtral-8x7b")
    h200 = get_hardware("h200")
    nvlink = RooflineLatency(mixtral, h200, tp=8, ep=8).breakdown(DECODE)["allreduce_s"]
    slow = dataclasses.replace(h200, link=dataclasses.replace(LINKS["nvlink4"],
                                                              bandwidth_bytes_per_s=1e9))
    slower = RooflineLatency(mixtral, slow, tp=8, ep=8).breakdown(DECODE)["allreduce_s"]
    assert slower > nvlink
    # by hand: one all-reduce per layer (attention), two all-to-alls per MoE layer
    link = LINKS["nvlink4"]
    act, h, layers = 2, mixtral.hidden_size, mixtral.num_layers
    buffer = 64 / 8 * mixtral.experts_per_token * h * act
    expected = (layers * allreduce_s(link, 64 * h * act, 8)
                + 2 * layers * (link.latency_s + 7 / 8 * buffer / link.bandwidth_bytes_per_s))
    assert nvlink == pytest.approx(expected, rel=1e-12)


def test_swaps_cross_the_host_link() -> None:
    host = Link("pcie", 20e9, 30e-6, generation=4)
    hw = dataclasses.replace(get_hardware("h100-sxm"), host_link=host)
    roof = RooflineLatency(get_model("llama-3-8b"), hw)
    moved = StepShape((), (), 4, 400, 100, 4, swap_out_tokens=64, swap_in_tokens=32)
    per_token = 2 * 32 * 8 * 128 * 2  # (K, V) x layers x kv heads x dim x bf16
    moves = [swap_move(0, 4, 16 * per_token), swap_move(1, 2, 16 * per_token, swap_in=True)]
    moved_s = step_moves_s({"host": hw.host_link}, moves)  # one transfer: latency once
    assert moved_s == pytest.approx(30e-6 + 96 * per_token / 20e9, rel=1e-12)
    assert roof.step_time(moved, moved_s) - roof.step_time(moved) == pytest.approx(moved_s)


def test_a_gpu_mapping_takes_links_and_the_old_bandwidth_fields() -> None:
    hw = hardware_from_fields({"base": "h100-sxm", "link": "pcie5",
                               "interconnect_bandwidth_bytes_per_s": "3e10"})
    assert hw.link == dataclasses.replace(LINKS["pcie5"], bandwidth_bytes_per_s=3e10)
    custom = hardware_from_fields({"name": "cpu", "bf16_flops_per_s": 5e10,
                                   "memory_bytes": 2**28, "memory_bandwidth_bytes_per_s": 1e10,
                                   "interconnect_bandwidth_bytes_per_s": 1e9,
                                   "host_link_bandwidth_bytes_per_s": 2e9})
    assert custom.interconnect_bandwidth_bytes_per_s == 1e9
    assert custom.host_link_bandwidth_bytes_per_s == 2e9
    assert custom.link.latency_s == LINKS["nvlink4"].latency_s  # the old NVLink assumption
    with pytest.raises(ValueError, match="interconnect_bandwidth_bytes_per_s=-5.*> 0"):
        hardware_from_fields({"base": "l4", "interconnect_bandwidth_bytes_per_s": -5})
    with pytest.raises(ValueError, match="unknown link 'nvlink9'; known: nvlink3"):
        hardware_from_fields({"base": "l4", "link": "nvlink9"})
    assert link_from_fields({"base": "pcie5", "latency_s": "2e-5"}).latency_s == 2e-5
    with pytest.raises(ValueError, match="unknown Link field 'speed'; allowed: kind, "):
        link_from_fields({"base": "pcie5", "speed": 1})


def test_a_scenario_overrides_the_gpus_link() -> None:
    base = {"model": "llama-3-70b", "hardware": {"gpu": "h100-sxm", "count": 4}}
    assert validate_scenario(base, "test").hardware_spec.link == LINKS["nvlink4"]
    pcie = validate_scenario({**base, "hardware": {**base["hardware"], "link": "pcie5"}}, "test")
    assert pcie.hardware_spec.link == LINKS["pcie5"]
    assert pcie.hardware_spec.memory_bytes == get_hardware("h100-sxm").memory_bytes
    own = validate_scenario({**base, "hardware": {**base["hardware"], "link": {
        "kind": "nvlink", "generation": 4, "bandwidth_bytes_per_s": 1e11,
        "latency_s": 2e-5}}}, "test")
    assert own.hardware_spec.link == Link("nvlink", 1e11, 2e-5, generation=4)
    with pytest.raises(ScenarioError, match="link"):
        validate_scenario({**base, "hardware": {**base["hardware"], "link": {
            "kind": "pcie", "bandwidth_bytes_per_s": 1e10, "latency_s": 1e-5}}}, "test")
