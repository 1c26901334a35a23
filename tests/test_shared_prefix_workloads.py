"""Shared-prefix workloads: a system prompt shared by a fraction of requests, and
multi-turn conversations whose turns extend their history; content ids make the
sharing visible to a prefix cache, and an independent ideal-reuse count checks it."""

from __future__ import annotations

import inspect
import itertools
import math
import tracemalloc
from collections import Counter, defaultdict
from collections.abc import Iterable

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from sim.core.request import Request
from sim.workload import WorkloadConfig, conversation_turns, make_requests
from sim.workload.build import arrival_process, conversation_spec
from sim.workload.conversations import Turn
from sim.workload.prefixes import IdSource, SharedPrefix, shared_prompt

BASE: dict[str, object] = {
    "arrivals": {"process": "poisson", "rate": 4.0},
    "prompt_tokens": {"dist": "lognormal", "mean": 1000, "cv": 1.0},
    "output_tokens": {"dist": "lognormal", "mean": 200, "cv": 1.0},
    "num_requests": 2000,
}


def config(**overrides: object) -> WorkloadConfig:
    raw = {**BASE, **overrides}
    return WorkloadConfig.model_validate({k: v for k, v in raw.items() if v is not None})


def shared(
    fraction: float = 0.8, tokens: int = 1000, num_requests: int = 2000, **more: object
) -> WorkloadConfig:
    prefix = {"fraction": fraction, "tokens": tokens, **more}
    return config(shared_prefix=prefix, num_requests=num_requests)


def chats(turns: object = 4, user: object = None, **more: object) -> dict[str, object]:
    return {
        "turns": turns,
        "user_tokens": user or {"dist": "lognormal", "mean": 200, "cv": 1.0},
        "think_time_s": {"dist": "exponential", "mean_s": 10.0},
        **more,
    }


def turns_of(cfg: WorkloadConfig, seed: int = 0) -> list[Turn]:
    assert cfg.arrivals is not None
    limit = cfg.num_requests or math.inf
    end_s = cfg.duration_s or math.inf
    spec = conversation_spec(cfg)
    return list(conversation_turns(spec, arrival_process(cfg.arrivals), seed, limit, end_s))


def ideal_hit_tokens(requests: Iterable[Request]) -> int:
    """Tokens an infinite id-keyed cache serves: a full unit's id counts after its first sight.

    Written independently of the generators: only ids and lengths are read.
    """
    seen: set[int] = set()
    hits = 0
    for r in requests:
        full = r.prompt_tokens // r.prefix_unit_tokens
        assert r.prefix_block_ids is not None
        for unit_id in r.prefix_block_ids[:full]:
            hits += r.prefix_unit_tokens if unit_id in seen else 0
            seen.add(unit_id)
    return hits


def streams_equal(a: Iterable[Request], b: Iterable[Request]) -> bool:
    def key(r: Request) -> tuple:
        return (r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.prefix_block_ids)

    return [key(r) for r in a] == [key(r) for r in b]


# ---------------------------------------------------------------- shared system prompt


@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.8, 1.0])
def test_shared_fraction_is_honoured(fraction: float) -> None:
    n, tokens, unit = 20_000, 1000, 16
    requests = list(make_requests(shared(fraction, tokens, num_requests=n), seed=3))
    reserved = tokens // unit
    opened = sum(
        r.prefix_block_ids is not None and r.prefix_block_ids[0] < reserved for r in requests
    )
    sigma = math.sqrt(n * fraction * (1 - fraction))
    assert abs(opened - fraction * n) <= 4 * sigma + 1e-9


def test_shared_ids_are_identical_and_everything_else_unique() -> None:
    cfg = shared(0.5, 1000, num_prompts=3, unit_tokens=16, num_requests=3000)
    requests = list(make_requests(cfg, seed=1))
    full = 1000 // 16
    system = {k: tuple(range(k * full, (k + 1) * full)) for k in range(3)}
    rest: Counter[int] = Counter()
    opened: Counter[int] = Counter()
    for r in requests:
        ids = r.prefix_block_ids
        assert ids is not None and r.prefix_unit_tokens == 16
        assert len(ids) == math.ceil(r.prompt_tokens / 16)
        which = ids[0] // full if ids[0] < 3 * full else None
        if which is not None:
            assert ids[:full] == system[which] and r.prompt_tokens >= 1001
            opened[which] += 1
            rest.update(ids[full:])
        else:
            rest.update(ids)
    assert all(count == 1 for count in rest.values())  # private units, the straddler included
    assert min(rest) == 3 * full  # fresh ids start after the reserved ones
    n_shared = sum(opened.values())
    for k in range(3):  # uniform choice among the prompts, within 4 sigma
        assert abs(opened[k] - n_shared / 3) <= 4 * math.sqrt(n_shared * 2 / 9)


def test_shared_prefix_only_lengthens_the_prompts_that_open_with_it() -> None:
    plain = list(make_requests(config(), seed=7))
    with_prefix = list(make_requests(shared(0.6, 1000), seed=7))
    assert [(r.arrival_s, r.output_tokens) for r in plain] == [
        (r.arrival_s, r.output_tokens) for r in with_prefix
    ]
    for p, s in zip(plain, with_prefix, strict=True):
        assert s.prefix_block_ids is not None
        if s.prefix_block_ids[0] < 1000 // 16:
            assert s.prompt_tokens == max(p.prompt_tokens, 1001)
        else:
            assert s.prompt_tokens == p.prompt_tokens


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.integers(1, 3000),
    unit=st.integers(1, 600),
    drawn=st.integers(1, 5000),
    choice=st.integers(-1, 2),
)
def test_shared_prompt_ids_cover_the_prompt(
    tokens: int, unit: int, drawn: int, choice: int
) -> None:
    prefix = SharedPrefix(1.0, tokens, 3, unit)
    ids = IdSource(prefix.num_reserved_ids)
    prompt, block_ids, _ = shared_prompt(prefix, choice, drawn, ids)
    assert len(block_ids) == math.ceil(prompt / unit)
    if choice >= 0:
        assert prompt == max(drawn, tokens + 1)
        assert list(block_ids[: tokens // unit]) == prefix.system_ids(choice)
        assert all(i >= prefix.num_reserved_ids for i in block_ids[tokens // unit :])
    else:
        assert prompt == drawn and all(i >= prefix.num_reserved_ids for i in block_ids)


def test_ideal_reuse_of_a_shared_prompt_is_p_n_s() -> None:
    n, p, s, unit = 5000, 0.8, 1024, 16
    requests = list(make_requests(shared(p, s, num_requests=n, unit_tokens=unit), seed=2))
    opened = sum(
        r.prefix_block_ids is not None and r.prefix_block_ids[0] < s // unit for r in requests
    )
    assert ideal_hit_tokens(requests) == (opened - 1) * s  # all but the first sight
    assert ideal_hit_tokens(requests) == pytest.approx(p * n * s, rel=0.05)


# ---------------------------------------------------------------- conversations


def test_each_turn_extends_the_previous_prompt_and_answer() -> None:
    cfg = config(
        conversations=chats(turns={"dist": "uniform", "low": 2, "high": 6}, unit_tokens=16),
        num_requests=3000,
    )
    turns = turns_of(cfg, seed=4)
    assert [t.request.request_id for t in turns] == list(range(len(turns)))
    arrivals = [t.request.arrival_s for t in turns]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0
    by_chat: dict[int, list[Turn]] = defaultdict(list)
    for t in turns:
        by_chat[t.conversation].append(t)
    unit_id: dict[tuple[int, int], int] = {}
    for chat, history in by_chat.items():
        assert [t.turn for t in history] == list(range(len(history)))
        for prev, nxt in itertools.pairwise(history):
            a, b = prev.request, nxt.request
            assert b.prompt_tokens > a.prompt_tokens + a.output_tokens  # + a user message
            assert b.arrival_s > a.arrival_s
            assert a.prefix_block_ids is not None and b.prefix_block_ids is not None
            full = a.prompt_tokens // 16
            assert b.prefix_block_ids[:full] == a.prefix_block_ids[:full]
        for t in history:  # a full unit keeps one id in every turn where it is full
            ids = t.request.prefix_block_ids
            assert ids is not None and len(ids) == math.ceil(t.request.prompt_tokens / 16)
            for j in range(t.request.prompt_tokens // 16):
                assert unit_id.setdefault((chat, j), ids[j]) == ids[j]
    owners: dict[int, int] = {}
    for (chat, _), i in unit_id.items():
        assert owners.setdefault(i, chat) == chat  # conversations never share ids


def test_fixed_lengths_give_exact_growth_gaps_and_turn_counts() -> None:
    cfg = config(
        output_tokens={"dist": "fixed", "value": 50},
        conversations={
            "turns": 3,
            "user_tokens": {"dist": "fixed", "value": 30},
            "think_time_s": 5.0,
            "assumed_tpot_s": 0.02,
            "num_conversations": 40,
        },
        num_requests=None,
        duration_s=10**6,
    )
    turns = turns_of(cfg)
    assert len(turns) == 40 * 3
    by_chat: dict[int, list[Request]] = defaultdict(list)
    for t in turns:
        by_chat[t.conversation].append(t.request)
    for history in by_chat.values():
        for a, b in itertools.pairwise(history):
            assert b.prompt_tokens == a.prompt_tokens + 50 + 30
            assert b.arrival_s - a.arrival_s == pytest.approx(50 * 0.02 + 5.0)


def test_max_prompt_tokens_ends_conversations_early() -> None:
    cfg = config(conversations=chats(turns=50, max_prompt_tokens=4000), num_requests=2000)
    turns = turns_of(cfg)
    assert max(t.turn for t in turns) < 49
    assert all(t.request.prompt_tokens <= 4000 for t in turns if t.turn > 0)


def test_ideal_reuse_of_conversations_is_the_previous_prompts() -> None:
    cfg = config(conversations=chats(turns={"dist": "uniform", "low": 1, "high": 8}))
    turns = turns_of(cfg, seed=9)
    previous: dict[int, Request] = {}
    expected = 0
    for t in turns:
        if t.conversation in previous:
            expected += previous[t.conversation].prompt_tokens // 16 * 16
        previous[t.conversation] = t.request
    hits = ideal_hit_tokens(t.request for t in turns)
    assert hits == expected
    prompt_total = sum(t.request.prompt_tokens for t in turns)
    assert 0.3 * prompt_total < hits < prompt_total  # history dominates long chats


def test_conversations_can_open_with_a_shared_system_prompt() -> None:
    cfg = config(
        conversations=chats(turns=3),
        shared_prefix={"fraction": 0.5, "tokens": 512, "num_prompts": 2},
        num_requests=600,
    )
    turns = turns_of(cfg)
    opening: dict[int, tuple[int, ...]] = {}
    for t in turns:
        ids = t.request.prefix_block_ids
        assert ids is not None
        head = ids[:32] if ids[0] < 64 else ()
        assert opening.setdefault(t.conversation, head) == head  # every turn keeps it
    assert {h for h in opening.values() if h} == {tuple(range(32)), tuple(range(32, 64))}
    n_open = sum(bool(h) for h in opening.values())
    assert abs(n_open - len(opening) / 2) <= 4 * math.sqrt(len(opening) / 4)


def test_make_requests_streams_conversation_turns() -> None:
    cfg = config(conversations=chats(), num_requests=500)
    assert streams_equal(make_requests(cfg, 5), (t.request for t in turns_of(cfg, 5)))


# ---------------------------------------------------------------- determinism and laziness


@pytest.mark.parametrize(
    "cfg",
    [
        shared(0.5, 700, num_prompts=4, num_requests=300),
        config(conversations=chats(), num_requests=300),
    ],
    ids=["shared_prefix", "conversations"],
)
def test_same_seed_same_stream(cfg: WorkloadConfig) -> None:
    assert streams_equal(make_requests(cfg, 11), make_requests(cfg, 11))
    assert not streams_equal(make_requests(cfg, 11), make_requests(cfg, 12))
    small = list(make_requests(cfg, 11, chunk_size=7))
    assert [r.request_id for r in small] == list(range(300))


@pytest.mark.parametrize(
    "extra",
    [
        {"shared_prefix": {"fraction": 0.5, "tokens": 100}},
        {"conversations": chats(turns={"dist": "uniform", "low": 1, "high": 10**6})},
    ],
    ids=["shared_prefix", "conversations"],
)
def test_a_million_requests_are_generated_lazily(extra: dict[str, object]) -> None:
    requests = make_requests(config(num_requests=10**6, **extra), seed=0)
    assert inspect.isgenerator(requests)
    head = list(itertools.islice(requests, 10))
    assert [r.request_id for r in head] == list(range(10))


def peak_bytes(requests: Iterable[Request]) -> int:
    tracemalloc.start()
    try:
        for _ in requests:
            pass
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_conversation_memory_is_bounded_by_what_is_in_flight() -> None:
    """Finished conversations are dropped: six times the requests, about the same peak."""
    cfg = config(conversations=chats(turns={"dist": "uniform", "low": 1, "high": 6}))
    small = peak_bytes(make_requests(cfg.model_copy(update={"num_requests": 3_000}), 0))
    large = peak_bytes(make_requests(cfg.model_copy(update={"num_requests": 18_000}), 0))
    assert large < 1.5 * small


# ---------------------------------------------------------------- config


def test_yaml_shapes_validate() -> None:
    doc = yaml.safe_load("""
shared:
  arrivals: {process: poisson, rate: 4}
  prompt_tokens: {dist: lognormal, mean: 1000, cv: 1}
  output_tokens: {dist: lognormal, mean: 200, cv: 1}
  shared_prefix: {fraction: 0.8, tokens: 1024, num_prompts: 1, unit_tokens: 16}
  num_requests: 1000
chat:
  arrivals: {process: poisson, rate: 0.5}
  prompt_tokens: {dist: lognormal, mean: 1000, cv: 1}
  output_tokens: {dist: lognormal, mean: 200, cv: 1}
  conversations:
    turns: {dist: uniform, low: 2, high: 6}
    user_tokens: {dist: lognormal, mean: 200, cv: 1}
    think_time_s: {dist: lognormal, mean_s: 10, cv: 1}
    assumed_tpot_s: 0.03
    max_prompt_tokens: 32000
    unit_tokens: 16
  num_requests: 1000
""")
    assert WorkloadConfig.model_validate(doc["shared"]).unit_tokens == 16
    chat = WorkloadConfig.model_validate(doc["chat"])
    assert chat.conversations is not None and len(list(make_requests(chat, 0))) == 1000


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"shared_prefix": {"fraction": 1.5, "tokens": 10}}, "shared_prefix.fraction"),
        ({"shared_prefix": {"fraction": -0.1, "tokens": 10}}, "shared_prefix.fraction"),
        ({"shared_prefix": {"fraction": 0.5, "tokens": -10}}, "shared_prefix.tokens"),
        ({"shared_prefix": {"fraction": 0.5, "tokens": 10, "colour": 1}}, "colour"),
        ({"shared_prefix": {"fraction": 0.5, "tokens": 10, "num_prompts": 0}}, "num_prompts"),
        ({"shared_prefix": {"fraction": 0.5, "tokens": 10, "unit_tokens": 0}}, "unit_tokens"),
        ({"conversations": chats(turns=0)}, "turns"),
        ({"conversations": chats(user={"dist": "fixed", "value": -3})}, "user_tokens"),
        ({"conversations": {**chats(), "think_time_s": -1}}, "think_time_s"),
        ({"conversations": {**chats(), "think_time_s": {"dist": "gauss"}}}, "think_time_s"),
        ({"conversations": {**chats(), "assumed_tpot_s": -1}}, "assumed_tpot_s"),
        ({"conversations": {**chats(), "turn": 3}}, "turn"),
        ({"conversations": {"turns": 3, "think_time_s": 1}}, "user_tokens"),
        (
            {
                "conversations": chats(unit_tokens=32),
                "shared_prefix": {"fraction": 0.5, "tokens": 10, "unit_tokens": 16},
            },
            "unit_tokens",
        ),
    ],
)
def test_config_errors_name_the_field(overrides: dict[str, object], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        config(**overrides)


def test_prefix_sections_refuse_a_trace() -> None:
    with pytest.raises(ValidationError, match="shared_prefix"):
        WorkloadConfig.model_validate(
            {"trace": {"path": "x.csv"}, "shared_prefix": {"fraction": 0.5, "tokens": 10}}
        )


def test_unit_tokens_default_and_agreement() -> None:
    assert shared().unit_tokens == 16
    both = config(
        conversations=chats(unit_tokens=64),
        shared_prefix={"fraction": 0.5, "tokens": 10},
        num_requests=50,
    )
    assert both.unit_tokens == 64
    assert {r.prefix_unit_tokens for r in make_requests(both, 0)} == {64}
