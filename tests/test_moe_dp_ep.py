"""Data-parallel attention with expert parallelism (issue 49): the schema and its errors,
the per-GPU memory split, the all-to-all bytes, the lockstep step, and a run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.assemble import build_group_latency, build_latency, kv_budget
from sim.cli import main
from sim.config.capacity_dp import dp_ep_report
from sim.config.catalogue import get_hardware, get_model
from sim.config.costs import weights_bytes
from sim.config.data_parallel import memory_split, model_expert_bytes
from sim.config.link import Link
from sim.config.loader import validate_scenario
from sim.config.sections import resolve_model
from sim.config.specs import params_by_part, part_bytes
from sim.config.yaml_input import ScenarioError
from sim.core.plan import StepShape
from sim.experiments.run import run_scenario
from sim.latency.moe_dp_ep import (
    DUMMY_SHAPE,
    DPEPGroupLatency,
    all_to_all_bytes,
    dispatch_traffic,
    gpu_experts_touched,
    gpu_hit_probabilities,
    gpu_route_shares,
    shape_rows,
)
from sim.latency.roofline import RooflineLatency

QWEN = {"config": "builtin:qwen3-30b-a3b"}
DP2 = {"count": 2, "expert_parallel": 2, "data_parallel": 2}


def _scenario(**fields: object):  # noqa: ANN202
    return validate_scenario({"model": QWEN, "hardware": DP2, **fields}, "test")


# -- schema --------------------------------------------------------------------------


def test_dp_scenario_splits_count_into_ranks() -> None:
    scenario = validate_scenario({"model": QWEN, "hardware": {
        "count": 4, "expert_parallel": 4, "data_parallel": 2}}, "test")
    assert scenario.hardware.tensor_parallel == 2
    assert validate_scenario({"model": QWEN}, "test").hardware.tensor_parallel == 1


@pytest.mark.parametrize(("fields", "message"), [
    ({"hardware": {"count": 3, "expert_parallel": 3, "data_parallel": 2}},
     "hardware.data_parallel: 2 ranks must divide hardware.count"),
    ({"hardware": {"count": 2, "data_parallel": 2}},
     "hardware.expert_parallel: .* must equal hardware.count \\(2\\)"),
    ({"model": "llama-3-8b"}, "hardware.data_parallel: dp=2: .* llama-3-8b is dense"),
    ({"scheduler": {"policy": "static"}}, "scheduler.policy: .* use continuous"),
    ({"replicas": 2}, "replicas: a fleet of data-parallel groups is not modelled"),
    ({"latency": {"model": "fixed", "step_ms": 5}}, "latency.model: .* use roofline"),
    ({"disaggregation": {}}, "hardware.data_parallel: a prefill or decode pool"),
    ({"hardware": {"count": 2}, "disaggregation": {"decode": {"hardware": DP2}}},
     "disaggregation.decode.hardware.data_parallel: a prefill or decode pool"),
])
def test_dp_scenario_errors_name_the_field(fields: dict, message: str) -> None:
    raw = {"model": QWEN, "hardware": DP2, **fields}
    with pytest.raises(ScenarioError, match=message):
        validate_scenario(raw, "test")


def test_dp_error_exits_2_without_traceback(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("model: {config: builtin:qwen3-30b-a3b}\n"
                    "hardware: {count: 2, expert_parallel: 1, data_parallel: 2}\n")
    assert main(["run", str(path), "--quiet", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "hardware.expert_parallel" in err and "Traceback" not in err


# -- memory --------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "dp", "tp"), [("qwen3-30b-a3b", 2, 1),
                                                ("qwen3-30b-a3b", 2, 2),
                                                ("deepseek-v3", 8, 1)])
def test_memory_experts_split_rest_replicated(name: str, dp: int, tp: int) -> None:
    model = resolve_model({"config": f"builtin:{name}"})
    split = memory_split(model, dp, tp)
    gpus = dp * tp
    # the experts: every GPU's share adds up to the model's experts once
    assert gpus * split["experts_bytes"] == pytest.approx(model_expert_bytes(model))
    # the rest: each rank holds what one tp group holds without the experts
    whole = params_by_part(model, tp, 0)
    size = part_bytes(model)
    rest = sum(whole[p] * size[p] for p in ("weights", "carrier", "vocab"))
    assert split["weights_bytes"] == pytest.approx(rest + split["experts_bytes"])
    # and the group holds the model plus dp - 1 more copies of its non-expert part
    tp1 = params_by_part(model, 1, 0)
    model_rest = sum(tp1[p] * size[p] for p in ("weights", "carrier", "vocab"))
    model_bytes = weights_bytes(model)
    assert model_bytes == pytest.approx(model_rest + model_expert_bytes(model))
    tp_copies = tp * rest - model_rest  # what a tp group replicates (norms, MLA's kv_a)
    assert gpus * split["weights_bytes"] == pytest.approx(
        model_bytes + (dp - 1) * model_rest + dp * tp_copies)
    # the scenario's KV budget reads the same per-GPU weights
    assert weights_bytes(model, tp, gpus, dp) == pytest.approx(split["weights_bytes"])


def test_mla_latent_whole_per_rank_and_group_holds_more_than_tp() -> None:
    model = resolve_model({"config": "builtin:deepseek-v3"})
    report = dp_ep_report(model, get_hardware("h200"), dp=8, tp=1)
    # TP copies the latent onto every GPU; DP ranks each keep their own sequences' latent
    assert report["rank_kv_bytes_per_token"] == report["tp_only"]["kv_bytes_per_token"]
    assert report["group_max_concurrency"] > report["tp_only"]["max_concurrency"]


def test_capacity_dp_sheet_shows_every_term(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", "--config", "builtin:qwen3-30b-a3b", "--gpus", "2", "--ep", "2",
                 "--dp", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    parts = ("replicated_weights_bytes", "replicated_carrier_bytes", "replicated_vocab_bytes",
             "experts_bytes")
    assert sum(report[p] for p in parts) == pytest.approx(report["weights_bytes"])
    assert main(["capacity", "--config", "builtin:qwen3-30b-a3b", "--gpus", "2", "--ep", "2",
                 "--dp", "2"]) == 0
    out = capsys.readouterr().out
    for label in ("attention+dense", "norms+routers", "vocabulary", "routed experts",
                  "KV per rank", "group", "TP only"):
        assert label in out
    assert main(["capacity", "--config", "builtin:qwen3-30b-a3b", "--gpus", "2",
                 "--dp", "2"]) == 2
    assert "--dp 2: ep=1 must be dp x tp = 2" in capsys.readouterr().err


# -- all-to-all ----------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 4096), min_size=2, max_size=8),
       st.sampled_from([(8, 2), (64, 8), (128, 8), (256, 8)]))
def test_dispatch_bytes_are_tokens_remote_gpus_hidden_dtype(tokens: list[int],
                                                            experts: tuple[int, int]) -> None:
    num_experts, k = experts
    gpus = len(tokens)
    hits = gpu_hit_probabilities(num_experts, k, gpus)
    per_gpu = num_experts // gpus
    if num_experts % gpus == 0:  # uniform routing, experts dealt evenly: one q for all
        q = 1 - (1 - k / num_experts) ** per_gpu
        assert all(h == pytest.approx(q) for h in hits)
    sent, received = dispatch_traffic(tokens, hits, 2048 * 2)
    assert sum(sent) == pytest.approx(sum(received))  # what leaves a GPU lands on another
    # a token goes to another GPU at most once, and never more often than k expert picks
    for t, out in zip(tokens, sent, strict=True):
        assert out <= t * min(gpus - 1, k) * 2048 * 2 * (1 + 1e-9)
    if num_experts % gpus == 0:
        assert sum(sent) == pytest.approx(all_to_all_bytes(sum(tokens), (gpus - 1) * q, 2048, 2))


def test_all_to_all_bytes_by_hand() -> None:
    # 64 tokens, each to 1.5 other GPUs on average, hidden 2048, bf16
    assert all_to_all_bytes(64, 1.5, 2048, 2) == 64 * 1.5 * 2048 * 2
    assert all_to_all_bytes(64, 0.0, 2048, 2) == 0
    with pytest.raises(ValueError, match="remote_copies"):
        all_to_all_bytes(1, -1, 1, 1)
    # two GPUs, 128 experts, top-8: a token almost surely has an expert on the other GPU,
    # and is sent there once, not once per expert (4 of its 8 picks on average)
    q = gpu_hit_probabilities(128, 8, 2)
    assert q[0] == pytest.approx(1 - (1 - 8 / 128) ** 64)
    sent, _ = dispatch_traffic([100, 0], q, 1.0)
    assert sent[0] == pytest.approx(100 * q[1]) and sent[0] < 100 * 8 * 0.5


@pytest.mark.parametrize("skew", [0.0, 0.8])
def test_experts_touched_per_gpu_agree_with_the_moe_model(skew: float) -> None:
    from sim.config.moe import expected_distinct_experts, experts_touched_per_gpu

    touched = gpu_experts_touched(128, 8, 40, 4, skew)
    assert max(touched) == pytest.approx(experts_touched_per_gpu(128, 8, 40, 4, skew))
    assert sum(touched) == pytest.approx(expected_distinct_experts(128, 8, 40, skew))
    group = _group()
    m = group.model
    _, experts_s = group.moe_layer_s([20, 20])
    busiest = max(gpu_experts_touched(m.num_experts, m.experts_per_token, 40, 2,
                                      m.routing_skew))
    assert experts_s > 0 and busiest <= m.num_experts / 2


def test_skew_loads_one_gpu_more() -> None:
    shares = gpu_route_shares(128, 8, 4, skew=1.0)
    assert math.fsum(shares) == pytest.approx(1)
    assert max(shares) > 0.25 > min(shares)


# -- lockstep ------------------------------------------------------------------------


def _group(link: Link | None = None) -> DPEPGroupLatency:
    group = build_group_latency(_scenario(scheduler={"async_scheduling": False}))
    return group if link is None else DPEPGroupLatency(group.rank, link)


_shapes = st.one_of(st.none(), st.builds(
    lambda n, ctx, chunk: StepShape(num_decodes=n, decode_context_sum=n * ctx,
                                    decode_context_max=ctx, padded_batch=n,
                                    prefill_chunk_tokens=(chunk,) if chunk else (),
                                    prefill_context_tokens=(0,) if chunk else ()),
    st.integers(1, 256), st.integers(0, 4096), st.integers(0, 2048)))


@settings(max_examples=40, deadline=None)
@given(_shapes, _shapes)
def test_lockstep_step_is_slowest_rank_plus_moe(a: StepShape | None,
                                                b: StepShape | None) -> None:
    group = _group()
    total_s, rank_s = group.lockstep([a, b])
    own = [group.rank.step_time(DUMMY_SHAPE if s is None else s) for s in (a, b)]
    assert rank_s == own
    a2a_s, experts_s = group.moe_layer_s([shape_rows(DUMMY_SHAPE if s is None else s)
                                          for s in (a, b)])
    moe_s = group.model.moe_layers * (2 * a2a_s + experts_s)
    assert total_s == pytest.approx(max(own) + moe_s)
    assert total_s >= max(own)
    # the order of the ranks changes nothing
    assert group.step_time([b, a]) == pytest.approx(total_s)


def test_idle_rank_runs_a_dummy_batch() -> None:
    group = _group()
    busy = StepShape(num_decodes=64, decode_context_sum=64 * 1000, padded_batch=64)
    total_s, rank_s = group.lockstep([busy, None])
    assert rank_s[1] == group.rank.step_time(DUMMY_SHAPE) > 0
    assert total_s < group.step_time([busy, busy])  # fewer tokens through the experts


def test_all_to_all_follows_the_link() -> None:
    shape = StepShape(num_decodes=128, decode_context_sum=128 * 1000, padded_batch=128)
    fast = _group(Link("nvlink", 4.5e11, 5e-6, generation=4))
    slow = _group(Link("pcie", 2.5e10, 5e-6, generation=4))
    a2a_fast, experts = fast.moe_layer_s([128, 128])
    a2a_slow, experts_slow = slow.moe_layer_s([128, 128])
    assert experts == experts_slow
    m = fast.model
    q = gpu_hit_probabilities(m.num_experts, m.experts_per_token, 2, m.routing_skew)
    busiest = 128 * max(q) * m.hidden_size * m.carrier.bytes_per_element
    assert a2a_fast == pytest.approx(5e-6 + busiest / 4.5e11)
    assert a2a_slow == pytest.approx(5e-6 + busiest / 2.5e10)
    assert slow.step_time([shape, shape]) > fast.step_time([shape, shape])


def test_rank_roofline_leaves_routed_experts_out() -> None:
    model = get_model("mixtral-8x7b")
    hw = get_hardware("h100-sxm")
    shape = StepShape(num_decodes=32, decode_context_sum=32 * 512, padded_batch=32)
    tp1 = RooflineLatency(model, hw)
    rank = RooflineLatency(model, hw, tp=1, ep=2, dp=2)
    assert rank.step_time(shape) < tp1.step_time(shape)
    with pytest.raises(ValueError, match="ep=4 must be dp x tp = 2"):
        RooflineLatency(model, hw, tp=1, ep=4, dp=2)


def test_scenario_pool_is_one_ranks() -> None:
    scenario = _scenario()
    budget = kv_budget(scenario)
    model = scenario.model_spec
    assert budget.weights_bytes == pytest.approx(memory_split(model, 2, 1)["weights_bytes"])
    assert isinstance(build_latency(scenario), RooflineLatency)


# -- a run ---------------------------------------------------------------------------


def test_dp_run_records_ranks_and_imbalance(tmp_path: Path) -> None:
    scenario = _scenario(workload={
        "arrivals": {"process": "poisson", "rate": 20.0},
        "prompt_tokens": {"dist": "uniform", "low": 100, "high": 2000},
        "output_tokens": {"dist": "uniform", "low": 10, "high": 300},
        "num_requests": 120}, router={"policy": "round_robin"})
    result = run_scenario(scenario, show_progress=False)
    dp = result.summary["data_parallel"]
    assert result.summary["completed"] == 120
    assert dp["ranks"] == 2 and dp["lockstep_steps"] > 0
    # every prompt token, and every output token but the first (the prefill's), computed once
    summary = result.summary
    assert summary["total_preemptions"] == 0
    assert sum(dp["tokens_by_rank"]) == (summary["total_input_tokens"]
                                         + summary["total_output_tokens"] - 120)
    assert dp["token_imbalance"] >= 1.0 and 0 <= dp["time_lost_share"] < 1
    assert [row["requests"] for row in result.summary["replicas"]] == [60, 60]
    columns = result.recorder.steps_columns()
    assert sum(columns["rank0_tokens"]) + sum(columns["rank1_tokens"]) == sum(
        dp["tokens_by_rank"])
    assert len(columns["rank1_mean_batch"]) == len(columns["t_start_s"])


def test_async_overlaps_the_slowest_host_with_the_whole_step() -> None:
    sync = _group()
    overlapped = DPEPGroupLatency(sync.rank, sync.link, host_serial_share=0.0)
    busy = StepShape(num_decodes=200, decode_context_sum=200 * 800, padded_batch=200)
    shapes = [busy, None]
    total_sync, rank_s = sync.lockstep(shapes)
    params = sync.rank.fitted
    host = [params.cpu_step_s + params.cpu_seq_s * n for n in (200, 1)]
    moe_s = total_sync - max(rank_s)
    gpu_s = max(r - h for r, h in zip(rank_s, host, strict=True)) + moe_s
    # nothing of the host serial: it costs only where it outlasts the whole step's GPU time
    assert overlapped.step_time(shapes) == pytest.approx(gpu_s + max(0.0, max(host) - gpu_s))
    assert overlapped.step_time(shapes) < total_sync
    assert overlapped.output_lag_s(busy) == pytest.approx(host[0])
    assert sync.output_lag_s(busy) == 0.0


def test_serve_refuses_data_parallel_ranks() -> None:
    from sim.serve.simulated import build_simulated

    with pytest.raises(ValueError, match="hardware.data_parallel: `servesim serve`"):
        build_simulated(_scenario(), None)  # type: ignore[arg-type]  # refused before use


def test_one_ranks_chunk_loads_its_gpus_link_more_than_the_same_tokens_spread() -> None:
    """The prefill stall: the busiest GPU sets the all-to-all, so 2,000 tokens on one rank
    cost more than 1,000 on each; deduplicated, a token leaves its GPU at most once per
    other GPU."""
    group = _group()
    a2a_one, _ = group.moe_layer_s([2000, 0])
    a2a_even, _ = group.moe_layer_s([1000, 1000])
    assert a2a_one > a2a_even
    m = group.model
    token_bytes = m.hidden_size * m.carrier.bytes_per_element
    assert a2a_one <= group.link.latency_s + 2000 * token_bytes / group.link.bandwidth_bytes_per_s
