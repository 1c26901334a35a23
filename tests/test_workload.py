"""Workload generation: arrival processes are what they name, lengths obey their
bounds, traces read exactly, configs reject nonsense, and streams are lazy and seeded."""

from __future__ import annotations

import csv
import inspect
import itertools
import json
import math
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from scipy import stats

from sim.workload.arrivals import ArrivalProcess, arrival_chunks_s, arrival_times_s, sample_gaps_s
from sim.workload.config import WorkloadConfig, load_trace, make_requests, resolve_trace_path
from sim.workload.lengths import (
    Empirical,
    Fixed,
    LengthSpec,
    Lognormal,
    Normal,
    Uniform,
    sample_lengths,
)
from sim.workload.trace import MOONCAKE_UNIT_TOKENS
from sim.workload.traces import TraceFormatError, read_trace

SHIPPED = Path(__file__).resolve().parents[1] / "sim" / "workload" / "data" / "traces"
FAST = settings(max_examples=25, deadline=None)


def shipped_trace(name: str) -> Path:
    return SHIPPED / name


def first_gaps_s(process: ArrivalProcess, n: int, seed: int = 0, chunk: int = 8192) -> np.ndarray:
    times = np.fromiter(
        itertools.islice(arrival_times_s(process, np.random.default_rng(seed), chunk), n + 1),
        dtype=np.float64,
    )
    return np.diff(times)


def synthetic(**overrides: object) -> WorkloadConfig:
    raw: dict[str, object] = {
        "arrivals": {"process": "poisson", "rate": 4.0},
        "prompt_tokens": {"dist": "lognormal", "mean": 1155, "cv": 1.0, "min": 1, "max": 8000},
        "output_tokens": {"dist": "uniform", "low": 1, "high": 400},
        "num_requests": 500,
    }
    raw.update(overrides)
    return WorkloadConfig.model_validate({k: v for k, v in raw.items() if v is not None})


def as_tuples(requests: Iterator) -> list[tuple]:
    return [
        (r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.prefix_block_ids)
        for r in requests
    ]


# ---------------------------------------------------------------- arrivals


def test_poisson_rate_is_exact_and_gaps_are_exponential_and_uncapped() -> None:
    rate = 2.0
    gaps = first_gaps_s(ArrivalProcess("poisson", rate), 50_000, chunk=1000)
    assert len(gaps) / gaps.sum() == pytest.approx(rate, rel=0.015)
    assert stats.kstest(gaps, "expon", args=(0.0, 1.0 / rate)).pvalue > 0.001
    # A cap at 3x the mean (the peer's bug) would make this fraction zero; e^-3 is ~5%.
    assert np.mean(gaps > 3.0 / rate) == pytest.approx(math.exp(-3.0), abs=0.005)
    assert gaps.min() > 0.0


def test_first_arrival_is_at_zero_and_times_increase_across_chunks() -> None:
    times = list(
        itertools.islice(
            arrival_times_s(
                ArrivalProcess("constant", 4.0), np.random.default_rng(0), chunk_size=7
            ),
            30,
        )
    )
    assert times == pytest.approx([i / 4.0 for i in range(30)], abs=1e-12)
    chunks = arrival_chunks_s(ArrivalProcess("poisson", 1.0), np.random.default_rng(1), 5)
    joined = np.concatenate([next(chunks) for _ in range(20)])
    assert joined[0] == 0.0 and np.all(np.diff(joined) > 0)


@pytest.mark.parametrize("burstiness", [0.25, 0.5, 2.0, 4.0])
def test_gamma_keeps_the_rate_and_sets_cv(burstiness: float) -> None:
    rate = 3.0
    gaps = first_gaps_s(ArrivalProcess("gamma", rate, burstiness), 50_000, seed=7)
    assert gaps.mean() == pytest.approx(1.0 / rate, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0 / math.sqrt(burstiness), rel=0.05)
    scale = 1.0 / (rate * burstiness)
    assert stats.kstest(gaps, "gamma", args=(burstiness, 0.0, scale)).pvalue > 0.001


def test_gamma_with_burstiness_one_is_poisson() -> None:
    poisson = sample_gaps_s(ArrivalProcess("poisson", 5.0), np.random.default_rng(3), 100)
    gamma = sample_gaps_s(ArrivalProcess("gamma", 5.0, 1.0), np.random.default_rng(3), 100)
    np.testing.assert_array_equal(poisson, gamma)


@given(rate=st.floats(max_value=0.0) | st.just(math.inf) | st.just(math.nan))
def test_arrival_process_rejects_bad_rates(rate: float) -> None:
    with pytest.raises(ValueError, match="rate"):
        ArrivalProcess("poisson", rate)


# ---------------------------------------------------------------- lengths

dists = st.one_of(
    st.integers(1, 10_000).map(Fixed),
    st.tuples(st.integers(1, 500), st.integers(0, 500)).map(lambda t: Uniform(t[0], t[0] + t[1])),
    st.tuples(st.floats(1, 5000), st.floats(0, 5000)).map(lambda t: Normal(*t)),
    st.tuples(st.floats(1, 5000), st.floats(0, 5)).map(lambda t: Lognormal(*t)),
    st.lists(st.integers(1, 10_000), min_size=1, max_size=20).map(lambda v: Empirical(tuple(v))),
)


@FAST
@given(
    dist=dists,
    low=st.integers(1, 3000),
    span=st.integers(0, 3000) | st.none(),
    seed=st.integers(0, 2**32),
)
def test_lengths_are_integers_within_bounds(
    dist: Fixed, low: int, span: int | None, seed: int
) -> None:
    high = None if span is None else low + span
    out = sample_lengths(LengthSpec(dist, low, high), np.random.default_rng(seed), 2000)
    assert out.dtype == np.int64 and out.shape == (2000,)
    assert out.min() >= max(1, low)
    if high is not None:
        assert out.max() <= high


@FAST
@given(values=st.lists(st.integers(1, 10**6), min_size=1, max_size=5), seed=st.integers(0, 99))
def test_empirical_samples_only_its_values(values: list[int], seed: int) -> None:
    out = sample_lengths(LengthSpec(Empirical(tuple(values))), np.random.default_rng(seed), 1000)
    assert set(out.tolist()) <= set(values)
    if len(set(values)) > 1:
        assert len(set(out.tolist())) > 1


def test_lognormal_hits_its_mean_and_cv() -> None:
    out = sample_lengths(LengthSpec(Lognormal(1155, 1.0)), np.random.default_rng(0), 400_000)
    assert out.mean() == pytest.approx(1155, rel=0.02)
    assert out.std() / out.mean() == pytest.approx(1.0, rel=0.08)


def test_uniform_is_inclusive_and_normal_floors_at_one() -> None:
    out = sample_lengths(LengthSpec(Uniform(3, 5)), np.random.default_rng(0), 3000)
    assert set(out.tolist()) == {3, 4, 5}
    out = sample_lengths(LengthSpec(Normal(2, 50)), np.random.default_rng(0), 3000)
    assert out.min() == 1 and np.mean(out == 1) > 0.4


def test_length_spec_rejects_nonsense() -> None:
    for bad in (
        lambda: LengthSpec(Fixed(0)),
        lambda: LengthSpec(Fixed(5), 10, 3),
        lambda: LengthSpec(Empirical(())),
        lambda: LengthSpec(Uniform(5, 2)),
    ):
        with pytest.raises(ValueError):
            bad()


# ---------------------------------------------------------------- traces (real)


def test_azure_conversation_trace_reads_every_row() -> None:
    path = shipped_trace("azure_llm_2023_conv.csv")
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    trace = read_trace(path, "azure")
    assert len(trace) == len(rows) == 19_366
    expected_mean = sum(int(r["ContextTokens"]) for r in rows) / len(rows)
    assert trace.prompt_tokens.mean() == pytest.approx(expected_mean)
    assert trace.prompt_tokens.mean() == pytest.approx(1155, rel=0.01)
    assert trace.output_tokens.mean() == pytest.approx(211, rel=0.01)
    assert trace.arrival_s[0] == 0.0 and np.all(np.diff(trace.arrival_s) >= 0)
    assert 3000 < trace.arrival_s[-1] < 4000  # about an hour
    assert trace.arrival_s[1] == pytest.approx(4.314579, abs=1e-9)  # 18:15:46.68059 -> :50.995169


def test_azure_time_scale_halves_arrivals() -> None:
    path = shipped_trace("azure_llm_2023_code.csv")
    plain, fast = read_trace(path), read_trace(path, "azure", time_scale=2.0)
    assert len(plain) == 8_819
    np.testing.assert_allclose(fast.arrival_s, plain.arrival_s / 2.0)
    np.testing.assert_array_equal(fast.prompt_tokens, plain.prompt_tokens)


def test_mooncake_trace_carries_hash_ids() -> None:
    path = shipped_trace("mooncake_conversation.jsonl")
    with path.open() as handle:
        first = [json.loads(next(handle)) for _ in range(3)]
    trace = read_trace(path)
    assert len(trace) == 12_031 and trace.prefix_block_ids is not None
    assert trace.prefix_block_ids[:3] == tuple(tuple(r["hash_ids"]) for r in first)
    assert trace.prompt_tokens.mean() == pytest.approx(12_035, rel=0.01)
    assert trace.arrival_s[-1] == pytest.approx(3536.999)  # ms -> s


# ---------------------------------------------------------------- traces (tmp files)

AZURE_SMALL = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:17:03.9799600,4808,0
2023-11-16 18:17:04.0319600,3180,8
2023-11-16 23:59:59.9999999,10,1
2023-11-17 00:00:00.0000001,10,2
"""


def test_azure_reader_rebases_and_reads_a_zero_length_as_one(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text(AZURE_SMALL)
    with pytest.warns(UserWarning, match=r"a\.csv: 1 rows have GeneratedTokens 0 \(first at "
                      r"line 2\); each is read as 1 token"):
        trace = read_trace(path)  # format detected from the header
    np.testing.assert_allclose(trace.arrival_s[:2], [0.0, 0.052], atol=1e-9)
    assert trace.arrival_s[3] - trace.arrival_s[2] == pytest.approx(2e-7, abs=1e-9)  # midnight
    assert trace.prompt_tokens.tolist() == [4808, 3180, 10, 10]
    assert trace.output_tokens.tolist() == [1, 8, 1, 2]
    with pytest.warns(UserWarning, match="GeneratedTokens 0"):
        scaled = read_trace(path, "azure", time_scale=2.0)
    np.testing.assert_allclose(scaled.arrival_s, trace.arrival_s / 2.0)


def test_mooncake_reader_ms_and_hashes(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    rows = [
        {"timestamp": 500, "input_length": 700, "output_length": 4, "hash_ids": [0, 1]},
        {"timestamp": 1500, "input_length": 600, "output_length": 3, "hash_ids": [0, 2]},
        {"timestamp": 1500, "input_length": 100, "output_length": 3, "hash_ids": [3]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    trace = read_trace(path, "mooncake")
    assert trace.arrival_s.tolist() == [0.0, 1.0, 1.0]  # ties keep file order
    assert trace.prefix_block_ids == ((0, 1), (0, 2), (3,))
    assert trace.prompt_tokens.tolist() == [700, 600, 100]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.lists(
        st.tuples(st.floats(0, 1e6), st.integers(0, 10**6), st.integers(0, 10**4)),
        min_size=1,
        max_size=30,
    )
)
def test_plain_csv_round_trips(tmp_path: Path, rows: list[tuple[float, int, int]]) -> None:
    ordered = sorted(rows, key=lambda r: r[0])
    path = tmp_path / "p.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n"
                    + "".join(f"{a!r},{p},{o}\n" for a, p, o in ordered))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = read_trace(path, "csv")
    assert trace.arrival_s.tolist() == pytest.approx([a - ordered[0][0] for a, _, _ in ordered])
    assert trace.prompt_tokens.tolist() == [max(p, 1) for _, p, _ in ordered]
    assert trace.output_tokens.tolist() == [max(o, 1) for _, _, o in ordered]
    zero_columns = {c for c, i in (("prompt_tokens", 1), ("output_tokens", 2))
                    if any(r[i] == 0 for r in rows)}
    assert {str(w.message).split(" have ")[1].split(" 0 ")[0] for w in caught} == zero_columns


@pytest.mark.parametrize(
    ("fmt", "text", "line", "what"),
    [
        ("azure", AZURE_SMALL + "2023-11-16 18:17:05.1,abc,3\n", 6, "ContextTokens"),
        ("azure", AZURE_SMALL + "16/11/2023 18:17,5,3\n", 6, "TIMESTAMP"),
        ("azure", "when,Context,Generated\n", 1, "header"),
        ("csv", "arrival_s,prompt_tokens,output_tokens\n0,1,1\n1.5,-3,2\n", 3, "prompt_tokens"),
        ("csv", "arrival_s,prompt_tokens,output_tokens\n0,1,1\nnan,3,2\n", 3, "arrival_s"),
        ("csv", "arrival_s,prompt_tokens,output_tokens\n0,1,1\n4,2\n", 3, "3 fields"),
        (
            "mooncake",
            '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"ts": 1}\n',
            2,
            "timestamp",
        ),
        (
            "mooncake",
            '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": "x"}',
            1,
            "hash_ids",
        ),
    ],
)
def test_malformed_rows_name_file_line_and_expectation(
    tmp_path: Path, fmt: str, text: str, line: int, what: str
) -> None:
    path = tmp_path / "bad.txt"
    path.write_text(text)
    with pytest.raises(TraceFormatError, match=rf"bad\.txt:{line}: expected .*{what}"):
        read_trace(path, fmt)  # type: ignore[arg-type]


def test_missing_and_empty_traces(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        read_trace(tmp_path / "nope.csv", "csv")
    empty = tmp_path / "empty.csv"
    empty.write_text("arrival_s,prompt_tokens,output_tokens\n")
    with pytest.raises(TraceFormatError, match="no rows"):
        read_trace(empty)


# ---------------------------------------------------------------- make_requests


def test_num_requests_and_ids_and_order() -> None:
    requests = list(make_requests(synthetic(num_requests=300), seed=1))
    assert [r.request_id for r in requests] == list(range(300))
    arrivals = [r.arrival_s for r in requests]
    assert arrivals[0] == 0.0 and arrivals == sorted(arrivals)
    assert all(1 <= r.prompt_tokens <= 8000 and 1 <= r.output_tokens <= 400 for r in requests)


def test_duration_limit_stops_arrivals() -> None:
    cfg = synthetic(
        arrivals={"process": "constant", "rate": 5.0}, num_requests=None, duration_s=10.0
    )
    requests = list(make_requests(cfg, seed=0))
    assert len(requests) == 50 and requests[-1].arrival_s < 10.0
    poisson = list(make_requests(synthetic(num_requests=None, duration_s=2000.0), seed=0))
    assert max(r.arrival_s for r in poisson) < 2000.0
    assert len(poisson) == pytest.approx(4.0 * 2000.0, rel=0.05)
    both = list(make_requests(synthetic(num_requests=7, duration_s=2000.0), seed=0))
    assert len(both) == 7


@FAST
@given(seed=st.integers(0, 2**63 - 1))
def test_same_seed_same_stream(seed: int) -> None:
    cfg = synthetic(num_requests=50, arrivals={"process": "gamma", "rate": 2.0, "burstiness": 0.5})
    first = as_tuples(make_requests(cfg, seed))
    assert first == as_tuples(make_requests(cfg, seed))
    assert first != as_tuples(make_requests(cfg, seed + 1))


def test_changing_one_distribution_leaves_the_others_alone() -> None:
    base = as_tuples(make_requests(synthetic(), seed=5))
    other = as_tuples(make_requests(synthetic(output_tokens={"dist": "fixed", "value": 9}), 5))
    assert [r[:3] for r in base] == [r[:3] for r in other]  # ids, arrivals, prompts
    assert [r[3] for r in other] == [9] * len(other)
    same = {"dist": "uniform", "low": 1, "high": 1000}
    twins = as_tuples(make_requests(synthetic(prompt_tokens=same, output_tokens=same), seed=5))
    assert [r[2] for r in twins] != [r[3] for r in twins]  # independent child streams
    longer = as_tuples(make_requests(synthetic(num_requests=800), seed=5))
    assert longer[: len(base)] == base  # a larger count extends, never reshuffles


def test_empirical_from_a_short_trace_serves_any_count(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,11,0\n1,22,5\n")
    cfg = synthetic(
        num_requests=5000,
        prompt_tokens={"dist": "empirical", "trace": "t.csv"},
        output_tokens={"dist": "empirical", "trace": "t.csv", "format": "csv"},
    )
    with pytest.warns(UserWarning, match="output_tokens 0"):
        requests = list(make_requests(cfg, seed=0, base_dir=tmp_path))
    assert len(requests) == 5000
    assert {r.prompt_tokens for r in requests} == {11, 22}
    assert {r.output_tokens for r in requests} == {1, 5}  # 0 in the trace is read as 1
    swapped = synthetic(prompt_tokens={"dist": "empirical", "trace": "t.csv", "column": "output"})
    with pytest.warns(UserWarning, match="output_tokens 0"):
        assert {r.prompt_tokens for r in make_requests(swapped, 0, tmp_path)} == {1, 5}


def test_empirical_from_real_trace_with_more_requests_than_rows() -> None:
    path = shipped_trace("azure_llm_2023_code.csv")
    cfg = synthetic(num_requests=20_000, output_tokens={"dist": "empirical", "trace": str(path)})
    outputs = {r.output_tokens for r in make_requests(cfg, seed=0)}
    assert outputs <= set(read_trace(path).output_tokens.tolist())


def test_trace_replay_with_limits_and_builtin() -> None:
    cfg = WorkloadConfig.model_validate({"trace": {"path": "builtin:synthetic_conv"}})
    full = list(make_requests(cfg, seed=0))
    assert len(full) == 2000 and [r.request_id for r in full] == list(range(2000))
    assert full[0].arrival_s == 0.0
    assert np.mean([r.prompt_tokens for r in full]) == pytest.approx(1155, rel=0.1)
    fast = WorkloadConfig.model_validate(
        {"trace": {"path": "builtin:synthetic_conv", "time_scale": 2.0}, "duration_s": 60}
    )
    cut = list(make_requests(fast, seed=0))
    assert cut and all(r.arrival_s < 60 for r in cut)
    assert [r.arrival_s * 2 for r in cut] == pytest.approx([r.arrival_s for r in full[: len(cut)]])
    capped = WorkloadConfig.model_validate(
        {"trace": {"path": "builtin:synthetic_conv"}, "num_requests": 10}
    )
    assert len(list(make_requests(capped, seed=0))) == 10


def test_mooncake_replay_sets_prefix_block_ids(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 1024, "output_length": 2, "hash_ids": [4, 5]}'
    )
    cfg = WorkloadConfig.model_validate({"trace": {"path": "m.jsonl", "format": "mooncake"}})
    (request,) = make_requests(cfg, seed=0, base_dir=tmp_path)
    assert request.prefix_block_ids == (4, 5) and request.prompt_tokens == 1024
    assert request.prefix_unit_tokens == MOONCAKE_UNIT_TOKENS == 512


def test_mooncake_ids_that_disagree_with_the_length_are_kept_and_counted(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 0, "input_length": 1025, "output_length": 2, "hash_ids": [1, 2, 3]},
        {"timestamp": 1, "input_length": 1025, "output_length": 2, "hash_ids": [1, 2]},
        {"timestamp": 2, "input_length": 100, "output_length": 2, "hash_ids": [1, 2, 3]},
        {"timestamp": 3, "input_length": 100, "output_length": 2},
    ]
    (tmp_path / "m.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    assert read_trace(tmp_path / "m.jsonl").num_prefix_mismatched == 3
    cfg = WorkloadConfig.model_validate({"trace": {"path": "m.jsonl"}})
    with pytest.warns(UserWarning, match="3 rows .* hash_ids"):
        requests = list(make_requests(cfg, seed=0, base_dir=tmp_path))
    assert [r.prefix_block_ids for r in requests] == [(1, 2, 3), (1, 2), (1, 2, 3), ()]


def test_real_mooncake_ids_match_prompt_lengths() -> None:
    path = shipped_trace("mooncake_conversation.jsonl")
    assert read_trace(path).num_prefix_mismatched == 0
    cfg = WorkloadConfig.model_validate({"trace": {"path": str(path)}, "num_requests": 2000})
    for r in make_requests(cfg, seed=0):
        assert r.prefix_unit_tokens == 512 and r.prefix_block_ids is not None
        assert len(r.prefix_block_ids) == math.ceil(r.prompt_tokens / 512)


def test_trace_paths_resolve_against_base_dir_then_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "scen").mkdir()
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,1,1\n")
    assert resolve_trace_path("../t.csv", tmp_path / "scen") == tmp_path / "scen" / "../t.csv"
    monkeypatch.chdir(tmp_path)
    assert resolve_trace_path("t.csv", tmp_path / "scen").resolve() == tmp_path / "t.csv"
    with pytest.raises(FileNotFoundError, match="tried"):
        resolve_trace_path("missing.csv", tmp_path / "scen")
    with pytest.raises(FileNotFoundError, match="unknown builtin"):
        load_trace("builtin:nope", None)


def test_make_requests_is_lazy_for_a_million() -> None:
    requests = make_requests(synthetic(num_requests=10**6), seed=0)
    assert isinstance(requests, Iterator) and inspect.isgenerator(requests)
    head = list(itertools.islice(requests, 10))
    assert [r.request_id for r in head] == list(range(10))


# ---------------------------------------------------------------- config validation


def test_yaml_shapes_from_the_docs_validate() -> None:
    doc = yaml.safe_load("""
workload:
  arrivals: {process: gamma, rate: 4.0, burstiness: 0.5}
  prompt_tokens: {dist: lognormal, mean: 1155, cv: 1.0, min: 1, max: 8000}
  output_tokens: {dist: empirical, values: [10, 20, 30]}
  num_requests: 1000
  duration_s: 600
""")
    cfg = WorkloadConfig.model_validate(doc["workload"])
    assert cfg.arrivals is not None and cfg.arrivals.process == "gamma"
    replay = yaml.safe_load("""
workload:
  trace: {path: builtin:synthetic_conv, format: csv, time_scale: 1.0}
  num_requests: 500
""")
    assert WorkloadConfig.model_validate(replay["workload"]).trace is not None


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"arrivals": {"process": "poisson", "rate": -1.0}}, "rate"),
        ({"arrivals": {"process": "gamma", "rate": 1.0, "burstiness": 0}}, "burstiness"),
        ({"arrivals": {"process": "poisson", "rate": 1.0, "burstiness": 2}}, "gamma"),
        ({"arrivals": {"process": "weibull", "rate": 1.0}}, "'poisson', 'gamma', 'constant'"),
        ({"prompt_tokens": {"dist": "zipf", "mean": 3}}, "dist"),
        ({"prompt_tokens": {"dist": "fixed", "value": 3, "colour": 1}}, "colour"),
        ({"prompt_tokens": {"dist": "fixed", "value": 0}}, "value"),
        ({"prompt_tokens": {"dist": "fixed", "value": 5, "min": 9, "max": 3}}, "min"),
        ({"output_tokens": {"dist": "uniform", "low": 9, "high": 3}}, "low"),
        ({"output_tokens": {"dist": "empirical", "values": [3, 0]}}, "values"),
        ({"output_tokens": {"dist": "empirical"}}, "exactly one"),
        ({"num_requests": None}, "num_requests"),
        ({"num_requests": 0}, "num_requests"),
        ({"traffic": 3}, "traffic"),
        ({"trace": {"path": "x.csv"}}, "trace"),
        ({"arrivals": None}, "arrivals"),
    ],
)
def test_config_errors_name_the_field(overrides: dict[str, object], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        synthetic(**overrides)


def test_trace_config_rejects_bad_time_scale_and_format() -> None:
    for trace in ({"path": "x", "time_scale": 0}, {"path": "x", "format": "parquet"}):
        with pytest.raises(ValidationError, match="time_scale|format"):
            WorkloadConfig.model_validate({"trace": trace})
