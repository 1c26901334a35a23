"""Roofline latency: the prefill/decode regimes must emerge from FLOPs and bytes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.config.catalogue import get_hardware, get_model
from sim.config.costs import weights_bytes
from sim.core.plan import StepShape
from sim.latency import LatencyModel, RooflineLatency

LLAMA_8B = get_model("llama-3-8b")
H100 = get_hardware("h100-sxm")
ROOF = RooflineLatency(LLAMA_8B, H100)


def prefill(*chunks: tuple[int, int]) -> StepShape:
    """Chunks as (new tokens, tokens already in KV)."""
    return StepShape(tuple(c for c, _ in chunks), tuple(p for _, p in chunks))


def decode(batch: int, context: int, padded: int = 0) -> StepShape:
    return StepShape(num_decodes=batch, decode_context_sum=batch * context,
                     decode_context_max=context, padded_batch=max(padded, batch))


def test_is_a_latency_model() -> None:
    assert isinstance(ROOF, LatencyModel)
    assert ROOF.name == "roofline"


def test_prefill_is_compute_bound_and_decode_memory_bound() -> None:
    long_prefill = ROOF.breakdown(prefill((2048, 0)))
    assert long_prefill["compute_s"] > long_prefill["memory_s"]
    one_decode = ROOF.breakdown(decode(1, 1024))
    assert one_decode["memory_s"] > 10 * one_decode["compute_s"]


def test_decode_batch_is_nearly_free_but_prefill_scales_with_tokens() -> None:
    one, eight = ROOF.step_time(decode(1, 1024)), ROOF.step_time(decode(8, 1024))
    assert one < eight < 1.2 * one
    short, long = ROOF.step_time(prefill((1024, 0))), ROOF.step_time(prefill((4096, 0)))
    assert 3.2 < long / short < 4.5  # below 4: the host and launch costs do not grow


def test_longer_context_costs_more() -> None:
    assert ROOF.step_time(decode(32, 4096)) > ROOF.step_time(decode(32, 1024))
    assert ROOF.step_time(prefill((512, 8192))) > ROOF.step_time(prefill((512, 0)))


def test_decode_floor_and_overhead_are_plausible_for_llama_8b_on_h100() -> None:
    # Datasheet floor: ~15 GB of weights over 3.35 TB/s is ~4.5 ms; plus efficiency and overhead.
    floor_s = weights_bytes(LLAMA_8B) / H100.memory_bandwidth_bytes_per_s
    step = ROOF.breakdown(decode(1, 1024))
    read_s = step["bytes"] / H100.memory_bandwidth_bytes_per_s  # at datasheet speed
    assert read_s < step["memory_s"] < read_s / 0.7
    assert floor_s < step["gemm_s"] + step["lm_head_s"] < floor_s / 0.7
    # the fitted host time (calibrate.fit_serving): per step plus one sequence's, a few ms
    assert 0.5e-3 < step["overhead_s"] < 6e-3


def test_empty_step_costs_nothing() -> None:
    assert ROOF.step_time(StepShape()) == 0.0
    assert ROOF.breakdown(StepShape())["total_s"] == 0.0


def test_padded_slots_cost_compute() -> None:
    real, padded = ROOF.breakdown(decode(8, 512)), ROOF.breakdown(decode(8, 512, padded=256))
    assert padded["flops"] > 20 * real["flops"]


def test_chunking_a_prefill_preserves_attention_work() -> None:
    whole = ROOF.breakdown(prefill((2048, 0)))
    halves = ROOF.breakdown(prefill((1024, 0), (1024, 1024)))
    lm_head_flops = 2 * LLAMA_8B.vocab_size * LLAMA_8B.hidden_size
    assert halves["flops"] - whole["flops"] == pytest.approx(lm_head_flops)


def test_tensor_parallel_splits_work_and_adds_allreduce() -> None:
    model = get_model("llama-3-70b")
    tp2, tp8 = RooflineLatency(model, H100, tp=2), RooflineLatency(model, H100, tp=8)
    shape = decode(16, 2048)
    b2, b8 = tp2.breakdown(shape), tp8.breakdown(shape)
    assert b8["memory_s"] < b2["memory_s"] / 3
    assert b8["allreduce_s"] > b2["allreduce_s"] > 0
    assert ROOF.breakdown(shape)["allreduce_s"] == 0.0
    assert tp8.step_time(shape) < tp2.step_time(shape)


def test_moe_decode_reads_more_experts_as_batch_grows() -> None:
    moe = RooflineLatency(get_model("mixtral-8x7b"), H100, tp=2)
    one, many = moe.breakdown(decode(1, 256)), moe.breakdown(decode(64, 256))
    assert many["bytes"] > 2.5 * one["bytes"]
    assert one["memory_s"] > one["compute_s"]


def test_efficiencies_and_overhead_scale_their_terms() -> None:
    slow = RooflineLatency(LLAMA_8B, H100, compute_efficiency=0.3, bandwidth_efficiency=0.4,
                           step_overhead_s=0.0)
    fast = RooflineLatency(LLAMA_8B, H100, compute_efficiency=0.6, bandwidth_efficiency=0.8,
                           step_overhead_s=0.0)
    shape = prefill((4096, 0))
    assert slow.breakdown(shape)["compute_s"] == pytest.approx(
        2 * fast.breakdown(shape)["compute_s"])
    assert slow.breakdown(decode(4, 100))["memory_s"] == pytest.approx(
        2 * fast.breakdown(decode(4, 100))["memory_s"])
    assert slow.step_time(decode(4, 100)) > 1.5 * fast.step_time(decode(4, 100))
    assert fast.breakdown(decode(4, 100))["overhead_s"] == pytest.approx(
        4 * fast.fitted.cpu_seq_s)  # step_overhead_s=0 leaves the per-sequence term


@pytest.mark.parametrize("kwargs", [
    {"compute_efficiency": 0.0}, {"bandwidth_efficiency": 1.5}, {"step_overhead_s": -1.0},
    {"seq_overhead_s": float("inf")}, {"tp": 3}, {"ep": 2},
])
def test_bad_parameters_are_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RooflineLatency(LLAMA_8B, H100, **kwargs)  # type: ignore[arg-type]


chunk = st.tuples(st.integers(1, 4096), st.integers(0, 32768))
shapes = st.builds(
    lambda chunks, batch, context, pad: StepShape(
        tuple(c for c, _ in chunks), tuple(p for _, p in chunks), batch, batch * context,
        context if batch else 0, len(chunks) + batch + pad),
    st.lists(chunk, max_size=4), st.integers(0, 512), st.integers(0, 32768), st.integers(0, 64))


@given(shapes)
def test_breakdown_adds_up_to_step_time(shape: StepShape) -> None:
    parts = ROOF.breakdown(shape)
    assert parts["total_s"] == pytest.approx(ROOF.step_time(shape))
    expected = sum(parts[k] for k in ("gemm_s", "small_s", "attention_s", "lm_head_s",
                                      "overhead_s", "allreduce_s"))
    assert parts["total_s"] == pytest.approx(expected)


@given(shapes, st.integers(1, 64), st.integers(0, 8192))
def test_more_work_never_takes_less_time(shape: StepShape, extra: int, context: int) -> None:
    bigger = StepShape(shape.prefill_chunk_tokens + (extra,),
                       shape.prefill_context_tokens + (context,), shape.num_decodes,
                       shape.decode_context_sum, shape.decode_context_max,
                       shape.padded_batch + 1)
    assert ROOF.step_time(bigger) >= ROOF.step_time(shape)


@given(st.lists(shapes, min_size=2, max_size=6))
def test_remembered_parts_price_as_a_fresh_model(steps: list[StepShape]) -> None:
    """The memo of context-free parts hands back the very floats a cold model computes,
    whatever was priced before (shapes sharing rows but not contexts included)."""
    warm = RooflineLatency(LLAMA_8B, H100)
    seen = [warm.step_time(s) for s in steps + steps[::-1]]
    cold = [RooflineLatency(LLAMA_8B, H100).step_time(s) for s in steps + steps[::-1]]
    assert seen == cold
    assert [warm.step_time(s) for s in steps] == cold[:len(steps)]


def test_remembered_parts_stay_bounded() -> None:
    from sim.latency.roofline_parts import MEMO_SHAPES

    model = RooflineLatency(LLAMA_8B, H100)
    for batch in range(1, MEMO_SHAPES + 50):
        model.step_time(decode(batch, 100))
    assert 0 < len(model._memo) <= MEMO_SHAPES  # noqa: SLF001 - the bound is the point


@given(st.integers(1, 300), st.integers(0, 10**6), st.integers(0, 64),
       st.sampled_from(["llama-3-8b", "mixtral-8x7b", "gpt-oss-20b"]), st.sampled_from([1, 2]))
def test_a_plain_decode_prices_as_the_sum_of_its_parts(n, context_sum, pad, model, tp) -> None:
    """step_time's plain-decode path (remembered parts, attention inlined) adds the very
    floats breakdown lists, in its order: exactly, sliding-window models included."""
    from sim.config.hf_config import read_hf_config

    spec = read_hf_config("builtin:gpt-oss-20b").spec if model == "gpt-oss-20b" \
        else get_model(model)
    roof = RooflineLatency(spec, H100, tp=tp)
    shape = StepShape(num_decodes=n, decode_context_sum=context_sum,
                      decode_context_max=context_sum // n, padded_batch=n + pad)
    parts = roof.breakdown(shape)
    total = 0
    for key in ("gemm_s", "small_s", "attention_s", "lm_head_s", "overhead_s", "allreduce_s"):
        total += parts[key]
    assert roof.step_time(shape) == total + 0.0
    assert roof.step_time(shape) == RooflineLatency(spec, H100, tp=tp).step_time(shape)


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("steps", [1, 5, 31, 32, 200])
@pytest.mark.parametrize("context", [100, 6_000, 6_800, 20_000])
def test_decode_run_equals_step_time_around_the_attention_minimum(context: int, steps: int,
                                                                  tp: int) -> None:
    """decode_run_s prices a run whose attention kernels all sit at attention_min_s as one
    float, skips the minimum where none does, and applies it where the run crosses it:
    each of these runs (contexts under, crossing and over ~6.9k tokens on an 8B H100) is
    step_time's, float for float, in plain floats (short runs) and numpy (long ones)."""
    roof = RooflineLatency(LLAMA_8B, H100, tp=tp)
    shape = decode(4, context // 4)
    steps_s = [roof.step_time(StepShape(num_decodes=4, decode_context_sum=context + 4 * s,
                                        decode_context_max=context // 4 + s, padded_batch=4))
               for s in range(steps)]
    assert roof.decode_run_s(shape, steps).tolist() == steps_s
