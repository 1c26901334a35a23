"""The serving system's terms: grouped prompts in a cycle, host time overlapped under async
scheduling, and the frontend's client-side offsets."""

from __future__ import annotations

import itertools

import pytest

from sim.config.frontend import NO_FRONTEND, Frontend
from sim.config.loader import validate_scenario
from sim.config.yaml_input import ScenarioError
from sim.experiments.run import run_scenario
from sim.latency.roofline_terms import visible_host_s
from sim.workload import make_requests
from sim.workload.prompt_groups import PromptCycle, PromptGroups


def _scenario(**sections: dict) -> dict:
    base = {
        "name": "t", "seed": 0, "model": "llama-3-8b",
        "hardware": {"gpu": "h100-sxm", "count": 1},
        "kv": {"prefix_caching": True},
        "workload": {"arrivals": {"process": "constant", "rate": 4},
                     "prompt_tokens": {"dist": "fixed", "value": 300},
                     "output_tokens": {"dist": "fixed", "value": 20},
                     "prompt_groups": {"groups": 2, "prompts_per_group": 3,
                                       "system_tokens": 100},
                     "num_requests": 24},
    }
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value}
    return base


def test_a_cycle_repeats_each_prompt_whole_and_groups_share_their_system_prompt() -> None:
    cycle = PromptCycle(PromptGroups(2, 3, 100, unit_tokens=16))
    lap1 = [cycle.prompt(i, 300) for i in range(6)]
    lap2 = [cycle.prompt(i, 999) for i in range(6, 12)]  # a length drawn again is ignored
    full = 300 // 16
    for (t1, ids1), (t2, ids2) in zip(lap1, lap2, strict=True):
        assert t1 == t2 == 300
        assert ids1[:full] == ids2[:full]  # every full block named the same on every lap
    system = 100 // 16
    assert lap1[0][1][:system] == lap1[2][1][:system] != lap1[3][1][:system]
    assert lap1[0][1][system:full] != lap1[1][1][system:full]  # own questions differ


def test_a_prompt_no_longer_than_its_system_prompt_gets_one_token_more() -> None:
    assert PromptCycle(PromptGroups(1, 1, 100)).prompt(0, 50)[0] == 101


@pytest.mark.parametrize("field", ["groups", "prompts_per_group", "system_tokens"])
def test_prompt_groups_refuse_a_non_positive_size(field: str) -> None:
    kw = {"groups": 1, "prompts_per_group": 1, "system_tokens": 1, field: 0}
    with pytest.raises(ValueError, match=field):
        PromptGroups(**kw)


def test_the_workload_sends_the_cycle_and_the_cache_hits_from_the_second_lap() -> None:
    scenario = validate_scenario(_scenario(), "t")
    requests = list(make_requests(scenario.workload, 0))
    assert [r.prefix_block_ids[:18] for r in requests[:6]] == [
        r.prefix_block_ids[:18] for r in requests[6:12]]
    gaps = {round(b.arrival_s - a.arrival_s, 9) for a, b in itertools.pairwise(requests)}
    assert gaps == {0.25}
    summary = run_scenario(scenario, show_progress=False).summary
    # 6 cold prompts; the other 18 hit every full block (the last token is recomputed)
    assert summary["total_prefix_hit_tokens"] >= 18 * (300 // 16 * 16 - 16)


def test_prompt_groups_exclude_the_other_prefix_workloads() -> None:
    raw = _scenario(workload={"shared_prefix": {"fraction": 0.5, "tokens": 50}})
    with pytest.raises(ScenarioError, match="prompt_groups already names"):
        validate_scenario(raw, "t")


@pytest.mark.parametrize(("host", "gpu", "share", "want"), [
    (2.0, 5.0, 1.0, 2.0),  # synchronous: all of it
    (2.0, 5.0, 0.0, 0.0),  # fully overlapped and shorter than the GPU: free
    (8.0, 5.0, 0.0, 3.0),  # fully overlapped but longer: its excess
    (2.0, 5.0, 0.25, 0.5),  # a serial quarter, the rest hidden
    (8.0, 5.0, 0.25, 2.0 + 1.0),  # a serial quarter, the rest 6 over 5
])
def test_host_time_shows_only_where_it_is_serial_or_outlasts_the_gpu(
        host: float, gpu: float, share: float, want: float) -> None:
    assert visible_host_s(host, gpu, share) == pytest.approx(want)


def test_the_frontend_offset_is_its_terms_with_the_prompt_tokenized() -> None:
    f = Frontend(0.004, 1e-6, 8e-6, 7e-6)
    assert f.offset_s(500) == pytest.approx(0.004 + 500e-6 + 15e-6)
    assert NO_FRONTEND.offset_s(10_000) == 0.0
    with pytest.raises(ValueError, match="api_server_s"):
        Frontend(-1.0)


def test_a_frontend_adds_its_offset_to_ttft_and_e2e_and_leaves_tpot() -> None:
    zero = {"api_server_ms": 0, "tokenize_us_per_token": 0, "detokenize_us_per_token": 0,
            "stream_us_per_token": 0}
    some = {"api_server_ms": 5, "tokenize_us_per_token": 2, "detokenize_us_per_token": 10,
            "stream_us_per_token": 10}
    a = run_scenario(validate_scenario(_scenario(frontend=zero), "t"), show_progress=False)
    b = run_scenario(validate_scenario(_scenario(frontend=some), "t"), show_progress=False)
    offset_ms = 5 + 300 * 2e-3 + 20e-3
    for key in ("mean_ttft_ms", "mean_e2el_ms"):
        assert b.summary[key] == pytest.approx(a.summary[key] + offset_ms, rel=1e-9)
    # every request's TTFT and E2E carry the offset (the summary's percentiles come from a
    # sketch over the steady window, whose edges may move with the offset: compare requests)
    fa, fb = (r.recorder.requests_frame().sort_values("request_id") for r in (a, b))
    for column in ("ttft_ms", "e2el_ms"):
        assert fb[column].to_numpy() == pytest.approx(fa[column].to_numpy() + offset_ms,
                                                      rel=1e-9)
    assert b.summary["mean_tpot_ms"] == pytest.approx(a.summary["mean_tpot_ms"], rel=1e-9)


def test_the_roofline_hides_host_time_behind_the_gpu_under_async_scheduling() -> None:
    from sim.config.catalogue import get_hardware, get_model
    from sim.core.plan import StepShape
    from sim.latency.roofline import RooflineLatency

    model, gpu = get_model("llama-3-8b"), get_hardware("h100-sxm")
    decode = StepShape(num_decodes=16, decode_context_sum=16 * 1000, decode_context_max=1000,
                       padded_batch=16)
    prefill = StepShape(prefill_chunk_tokens=(512,), prefill_context_tokens=(0,),
                        num_decodes=4, decode_context_sum=4000, decode_context_max=1000,
                        padded_batch=5)
    for host_ms in (1.0, 40.0):  # under and over the GPU's step
        sync = RooflineLatency(model, gpu, step_overhead_s=host_ms / 1e3)
        overlap = RooflineLatency(model, gpu, step_overhead_s=host_ms / 1e3,
                                  host_serial_share=0.0)
        for shape in (decode, prefill):
            host_s = sync.breakdown(shape)["overhead_s"]
            gpu_s = sync.step_time(shape) - host_s
            assert overlap.step_time(shape) == pytest.approx(max(gpu_s, host_s), rel=1e-12)
            assert overlap.output_lag_s(shape) == pytest.approx(host_s, rel=1e-12)
            assert sync.output_lag_s(shape) == 0.0
    with pytest.raises(ValueError, match="host_serial_share"):
        RooflineLatency(model, gpu, host_serial_share=1.5)


def test_async_scheduling_lengthens_ttft_by_about_a_step_and_leaves_tpot() -> None:
    """An arrival is seen by the plan made as the next step starts, and tokens leave the
    engine after the overlapped host time: TTFT grows, the decode rhythm does not. At 10
    req/s arrivals land while steps run (at 4 req/s each finds the engine idle, and an idle
    engine's first token is the same either way: the host time, serial or lagging)."""
    busy = {"arrivals": {"process": "constant", "rate": 10}}
    runs = {flag: run_scenario(validate_scenario(_scenario(
        scheduler={"async_scheduling": flag}, workload=busy,
        latency={"host_serial_share": 0.0} if flag else {}), "t"), show_progress=False
        ).summary for flag in (False, True)}
    assert runs[True]["mean_ttft_ms"] > runs[False]["mean_ttft_ms"]
    assert runs[True]["mean_tpot_ms"] <= runs[False]["mean_tpot_ms"]
