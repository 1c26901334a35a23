"""Prefill/decode disaggregation: every request once, TTFT on the prefill side, the hand-off
priced by the link, blocks conserved, and the mistakes a user can make."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.cli import main
from sim.config.scenario import Scenario
from sim.experiments.run import run_scenario
from sim.experiments.run_disaggregated import _setups, pool_scenario
from sim.latency.kv_transfer import kv_shard_bytes
from sim.results.record.recorder import RunRecorder
from sim.workload import make_requests
from sim.world.disaggregated import DisaggregatedFleet
from sim.world.disaggregated_run import simulate_disaggregated
from sim.world.router import build_router, router_rng


def _scenario(**extra: Any) -> Scenario:
    fields: dict[str, Any] = {
        "seed": 3,
        "workload": {"arrivals": {"process": "poisson", "rate": 6.0},
                     "prompt_tokens": {"dist": "uniform", "low": 200, "high": 3000},
                     "output_tokens": {"dist": "uniform", "low": 1, "high": 60},
                     "num_requests": 80},
        "disaggregation": {"prefill": {"replicas": 1}, "decode": {"replicas": 1},
                           "link": "rdma-400"}}
    fields.update(extra)
    return Scenario.model_validate(fields)


def test_every_request_finishes_once_with_its_prefill_ttft() -> None:
    result = run_scenario(_scenario(), show_progress=False)
    s = result.summary
    assert s["completed"] == 80 and s["rejected"] == 0
    frame = result.recorder.requests_frame()
    assert frame["request_id"].is_unique and len(frame) == 80
    dis = s["disaggregation"]
    multi = int((frame["output_tokens"] > 1).sum())
    assert dis["num_transfers"] == multi
    # each transfer costs at least its idle price; the second token waits for it
    assert dis["p50_kv_transfer_ms"] > 0
    assert dis["p50_second_token_gap_ms"] > dis["p50_kv_transfer_ms"]
    model = result.scenario.model_spec
    moved = frame.loc[frame["output_tokens"] > 1, "prompt_tokens"].sum()
    assert dis["kv_transfer_bytes"] == pytest.approx(kv_shard_bytes(model, int(moved), 1))
    assert dis["validated"] is False
    assert set(dis["pools"]) == {"prefill", "decode"}


def test_each_pools_queue_is_its_own() -> None:
    """The decode pool's queue runs from a transfer's landing to its decode admission, a
    part of the second token's gap; the prefill pool's from arrival to prefill admission,
    which an overloaded prefill instance (rate 20, prompts to 3000) makes the longer."""
    s = run_scenario(_scenario(workload={
        "arrivals": {"process": "poisson", "rate": 20.0},
        "prompt_tokens": {"dist": "uniform", "low": 200, "high": 3000},
        "output_tokens": {"dist": "uniform", "low": 2, "high": 60}, "num_requests": 80}),
        show_progress=False).summary["disaggregation"]
    prefill, decode = s["pools"]["prefill"], s["pools"]["decode"]
    assert 0 <= decode["mean_queue_ms"] <= decode["p99_queue_ms"]
    assert decode["p99_queue_ms"] <= s["p99_second_token_gap_ms"]
    assert prefill["p99_queue_ms"] > 5 * decode["p99_queue_ms"]


def test_a_slower_link_lengthens_transfers_and_the_second_token() -> None:
    fast = run_scenario(_scenario(), show_progress=False).summary["disaggregation"]
    slow_link = {"kind": "tcp", "bandwidth_bytes_per_s": 1.0e9, "latency_s": 1.0e-4}
    slow = run_scenario(_scenario(disaggregation={
        "link": slow_link}), show_progress=False).summary["disaggregation"]
    assert slow["p50_kv_transfer_ms"] > 5 * fast["p50_kv_transfer_ms"]
    assert slow["p50_second_token_gap_ms"] > fast["p50_second_token_gap_ms"]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 2), st.integers(1, 2), st.integers(66, 200), st.booleans(),
       st.sampled_from(["recompute", "swap"]), st.integers(0, 10_000), st.booleans())
def test_blocks_are_in_one_place_or_in_flight(num_prefill: int, num_decode: int,
                                              num_blocks: int, prefix: bool,
                                              preemption: str, seed: int, tier: bool) -> None:
    """Checked after every step of random fleets: preemption, prefix caching, host tier."""
    scenario = _scenario(
        seed=seed, kv={"num_blocks": num_blocks, "prefix_caching": prefix,
                       "offload_host_gib": 0.05 if prefix and tier else 0.0},
        scheduler={"preemption": preemption, "max_model_len": 1024},
        latency={"model": "fixed", "step_ms": 5.0},
        workload={"arrivals": {"process": "poisson", "rate": 40.0},
                  "prompt_tokens": {"dist": "uniform", "low": 16, "high": 700},
                  "output_tokens": {"dist": "uniform", "low": 1, "high": 200},
                  "num_requests": 40},
        disaggregation={"prefill": {"replicas": num_prefill},
                        "decode": {"replicas": num_decode}, "link": "pcie5"})
    dis = scenario.disaggregation
    assert dis is not None
    pools = {side: _setups(pool_scenario(scenario, pool, side), side, None, None, False)
             for side, pool in (("prefill", dis.prefill), ("decode", dis.decode))}
    checks = []

    def check(fleet: DisaggregatedFleet) -> None:
        fleet.check()
        checks.append(1)

    recorder = RunRecorder(rows=None)
    _end, stats = simulate_disaggregated(
        make_requests(scenario.workload, seed), pools["prefill"], pools["decode"],
        build_router("round_robin", 1.5), build_router("least_kv", 1.5), router_rng(seed),
        dis.link_value, recorder, (RunRecorder(rows=None), RunRecorder(rows=None)),
        kv_shard_bytes(scenario.model_spec, 1), scenario.model_spec.num_layers, False,
        on_event=check)
    assert checks
    summary = recorder.summary(slo=None, kv_blocks_total=1, block_size=16,
                               prefix_caching=prefix, cache_evictions=0, recomputed_tokens=0,
                               kv_bytes_per_token=1.0)
    assert summary["completed"] + summary["rejected"] == 40
    for setup in pools["prefill"] + pools["decode"]:
        kv = setup.kv
        setup.kv.check_invariants()  # type: ignore[attr-defined]
        assert kv.num_used_blocks == 0, "a block left behind after the run"
    assert len(stats.transfer_s) == len(stats.reservation_wait_s)


def _itl(**extra: Any) -> dict[str, Any]:
    workload = {"arrivals": {"process": "poisson", "rate": 6.0},
                "prompt_tokens": {"dist": "fixed", "value": 3000},
                "output_tokens": {"dist": "fixed", "value": 64}, "num_requests": 60}
    fields = {"seed": 5, "workload": workload,
              "scheduler": {"chunked_prefill": False}, **extra}
    return run_scenario(Scenario.model_validate(fields), show_progress=False).summary


def test_free_link_decode_itl_is_no_worse_than_colocated_without_chunking() -> None:
    colocated = _itl(replicas=2)
    free = {"kind": "rdma", "line_rate_gbit_per_s": 400, "bandwidth_bytes_per_s": None,
            "latency_s": 0.0}
    disaggregated = _itl(disaggregation={"prefill": {"replicas": 1},
                                         "decode": {"replicas": 1}, "link": free})
    assert colocated["p99_itl_ms"] > 2 * colocated["median_itl_ms"]  # prefills interfere
    assert disaggregated["p99_itl_ms"] <= colocated["p99_itl_ms"]
    assert disaggregated["mean_itl_ms"] <= colocated["mean_itl_ms"]
    assert disaggregated["disaggregation"]["p99_kv_transfer_ms"] == 0.0


def _exit(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    code = main(["run", str(path), "--out", str(tmp_path / "out"), "--no-plots", "--quiet"])
    captured = capsys.readouterr()
    return code, captured.err + captured.out


def test_a_link_of_zero_bandwidth_is_refused(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    code, text = _exit(tmp_path, "disaggregation:\n  link: {kind: tcp, bandwidth_bytes_per_s: "
                       "0, latency_s: 0.001}\n", capsys)
    assert code == 2
    assert "disaggregation.link" in text and "bandwidth" in text
    assert "Traceback" not in text


def test_a_pool_that_cannot_hold_one_request_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, text = _exit(tmp_path, "disaggregation:\n  decode:\n    replicas: 1\n    hardware: "
                       "{gpu: h100-sxm, memory_utilization: 0.17}\n", capsys)
    assert code == 2
    assert "disaggregation.decode" in text
    assert "Traceback" not in text
    code, text = _exit(tmp_path, "disaggregation:\n  prefill:\n    kv: {num_blocks: 100}\n",
                       capsys)
    assert code == 2
    assert "disaggregation.prefill" in text and "8192" in text


def test_layerwise_overlap_shortens_the_exposed_transfer() -> None:
    slow = {"kind": "rdma", "line_rate_gbit_per_s": 100, "bandwidth_bytes_per_s": 1.0e10,
            "latency_s": 1.0e-5}
    whole = run_scenario(_scenario(disaggregation={"link": slow}),
                         show_progress=False).summary
    layered = run_scenario(_scenario(disaggregation={"link": slow, "layerwise": True}),
                           show_progress=False).summary
    assert (layered["disaggregation"]["p50_kv_transfer_ms"]
            < whole["disaggregation"]["p50_kv_transfer_ms"])
    assert layered["median_tpot_ms"] <= whole["median_tpot_ms"]
    # the bytes counted are the prompt's whole KV either way
    assert (layered["disaggregation"]["kv_transfer_bytes"]
            == whole["disaggregation"]["kv_transfer_bytes"])


def test_a_pool_that_does_not_batch_continuously_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, text = _exit(tmp_path, "disaggregation:\n  decode:\n    scheduler: {policy: static}\n",
                       capsys)
    assert code == 2
    assert "disaggregation.decode.scheduler.policy" in text and "Traceback" not in text
