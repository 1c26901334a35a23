"""Hostile bodies get a 4xx in OpenAI's error format, never a 500 or a hang (issue 47 item 3).

One server for the module; every request has a client timeout, and the fuzz
test's examples are bounded in number and size, so the file stays a few seconds
long on one core.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.config.scenario import Scenario
from sim.serve.server import BackgroundServer, simulated_served
from sim.text import load_tokenizer

CPU_HW = {"name": "cpu-test", "bf16_flops_per_s": 5e10, "memory_bytes": 2**26,
          "memory_bandwidth_bytes_per_s": 1e10, "interconnect_bandwidth_bytes_per_s": 1e9,
          "host_link_bandwidth_bytes_per_s": 1e9}
GENERATE = [("POST", "/v1/completions"), ("POST", "/v1/chat/completions")]
ROUTES = [*GENERATE, ("GET", "/v1/models"), ("GET", "/health"), ("GET", "/metrics"),
          ("POST", "/v1/models"), ("POST", "/nowhere")]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    sc = Scenario.model_validate({"name": "hostile", "model": "tiny",
                                  "hardware": {"gpu": CPU_HW},
                                  "latency": {"step_overhead_ms": 0.5},
                                  "output": {"plots": False}})
    with BackgroundServer(simulated_served(sc, load_tokenizer("byte"))) as base:
        yield base


def post(url: str, path: str, raw: bytes) -> httpx.Response:
    return httpx.post(url + path, content=raw, headers={"Content-Type": "application/json"},
                      timeout=20)


def assert_openai_error(r: httpx.Response, status: int | None = None) -> dict:
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    if status is not None:
        assert r.status_code == status, r.text[:300]
    error = r.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert error["code"] == r.status_code and "type" in error
    return error


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_deep_nesting_is_a_400(url: str, route: str) -> None:
    for depth in (100, 1_500, 100_000):  # under, at and far past the parser's own recursion
        raw = b'{"prompt": ' + b"[" * depth + b"]" * depth + b"}"
        error = assert_openai_error(post(url, route, raw), 400)
        assert "nested" in error["message"] and "Recursion" not in error["message"]


def test_huge_numbers_are_400s_naming_the_field(url: str) -> None:
    digits = "9" * 5000  # past Python's int-from-string limit
    assert_openai_error(post(url, "/v1/completions",
                             b'{"prompt": "x", "max_tokens": ' + digits.encode() + b"}"), 400)
    for field, value in (("max_tokens", "1" + "0" * 400), ("temperature", "1e999"),
                         ("seed", "1" + "0" * 30), ("n", "1" + "0" * 50),
                         ("top_k", "-" + "9" * 40)):
        r = post(url, "/v1/completions", f'{{"prompt": "x", "{field}": {value}}}'.encode())
        assert assert_openai_error(r, 400)["param"] == field
    for constant in ("NaN", "Infinity", "-Infinity"):
        r = post(url, "/v1/completions", f'{{"prompt": "x", "top_p": {constant}}}'.encode())
        assert_openai_error(r, 400)


def test_invalid_utf8_and_lone_surrogates_are_400s(url: str) -> None:
    assert_openai_error(post(url, "/v1/completions", b'{"prompt": "ab\xff\xfe"}'), 400)
    for body in (r'{"prompt": "\ud800x", "max_tokens": 2}',
                 r'{"messages": [{"role": "user", "content": "\udfff"}], "max_tokens": 2}',
                 r'{"prompt": "x", "max_tokens": 2, "\ud800": 1}'):
        route = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        assert_openai_error(post(url, route, body.encode()), 400)


def test_duplicate_keys_keep_the_last_value_as_vllms_parser_does(url: str) -> None:
    r = post(url, "/v1/completions", b'{"prompt": "x", "max_tokens": 9, "max_tokens": 3}')
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    r = post(url, "/v1/completions", b'{"prompt": "x", "max_tokens": 3, "max_tokens": -3}')
    assert_openai_error(r, 400)


def test_wrong_types_name_their_field(url: str) -> None:
    for field, value in (("stop", 5), ("presence_penalty", "high"), ("logit_bias", [1]),
                         ("stream", "yes"), ("n", 1.5), ("echo", 1), ("user", 7),
                         ("stream_options", [])):
        r = post(url, "/v1/completions", json.dumps({"prompt": "x", field: value}).encode())
        assert assert_openai_error(r, 400)["param"] == field, field


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) |
    st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)
FIELDS = st.sampled_from(["prompt", "messages", "max_tokens", "n", "stream", "stop", "seed",
                          "temperature", "top_p", "top_k", "echo", "logprobs", "best_of",
                          "stream_options", "min_tokens", "logit_bias", "model", "user",
                          "response_format", "tools", "ignore_eos", "max_completion_tokens"])
SMALL = st.one_of(st.integers(-3, 6), st.sampled_from(["x", "hi", [1, 2], [[3]], {}, None,
                                                      True, False, 0.5]))
BODIES = st.one_of(
    JSON,
    st.dictionaries(FIELDS, st.one_of(SMALL, JSON), max_size=6),
    st.fixed_dictionaries({"prompt": st.sampled_from(["ab", [5, 6]])},
                          optional={"max_tokens": st.integers(-1, 4), "n": st.integers(0, 3),
                                    "stream": st.booleans(), "echo": st.booleans(),
                                    "best_of": st.integers(0, 3)}),
    st.fixed_dictionaries({"messages": st.sampled_from([[{"role": "user", "content": "hi"}],
                                                        [], [{"content": 1}]])},
                          optional={"max_tokens": st.integers(0, 3),
                                    "n": st.integers(1, 2), "stream": st.booleans()}),
    st.fixed_dictionaries({"messages": st.just([{"role": "user", "content": "hi"}]),
                           "max_tokens": st.integers(1, 3)},
                          optional={"n": st.integers(1, 2), "stream": st.booleans(),
                                    "echo": st.booleans(), "stop": st.just(["x"])}))


@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=BODIES, route=st.sampled_from(ROUTES) | st.sampled_from(GENERATE),
       raw_tail=st.binary(max_size=3))
def test_fuzzed_bodies_get_a_200_or_an_openai_4xx(url: str, body: object,
                                                  route: tuple[str, str], raw_tail: bytes
                                                  ) -> None:
    method, path = route
    raw = json.dumps(body).encode() + (raw_tail if len(raw_tail) == 3 else b"")
    r = httpx.request(method, url + path, content=raw, timeout=20,
                      headers={"Content-Type": "application/json"})
    assert r.status_code < 500, (r.status_code, r.text[:300], raw[:200])
    if r.status_code != 200:
        assert_openai_error(r)
