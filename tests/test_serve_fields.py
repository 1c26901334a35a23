"""Every request field gets one of four answers, n > 1, echo and the API key (issue 47
items 1, 2 and 5), with the official client and httpx on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sim.cli.serve import api_key_of
from sim.config.scenario import Scenario
from sim.serve.auth import key_matches, needs_key
from sim.serve.fields import BY_NAME, RULES, Answer, markdown_table
from sim.serve.server import BackgroundServer, simulated_served
from sim.serve.simulated import PASSAGE
from sim.text import load_tokenizer

openai = pytest.importorskip("openai")

ROOT = Path(__file__).parent.parent
CPU_HW = {"name": "cpu-test", "bf16_flops_per_s": 5e10, "memory_bytes": 2**26,
          "memory_bandwidth_bytes_per_s": 1e10, "interconnect_bandwidth_bytes_per_s": 1e9,
          "host_link_bandwidth_bytes_per_s": 1e9}


def scenario() -> Scenario:
    return Scenario.model_validate({"name": "fields", "model": "tiny",
                                    "hardware": {"gpu": CPU_HW},
                                    "latency": {"step_overhead_ms": 1.0},
                                    "kv": {"prefix_caching": True, "block_size": 4},
                                    "output": {"plots": False}})


def passage(seed: int, n: int) -> str:
    ids = PASSAGE.encode()
    return bytes(ids[(seed + i) % len(ids)] for i in range(n)).decode()


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with BackgroundServer(simulated_served(scenario(), load_tokenizer("byte"))) as base:
        yield base


def test_every_vllm_field_has_an_answer_and_the_docs_print_the_table() -> None:
    fields = json.loads((ROOT / "tests/fixtures/vllm_request_fields_0.32.0.json").read_text())
    vllm = set(fields["completions"]) | set(fields["chat"])
    assert vllm - set(BY_NAME) == set()
    assert BY_NAME["best_of"].simulated is Answer.NO_OP  # not a field of vLLM 0.32's models
    assert "best_of" not in vllm
    assert all(r.engine is not Answer.SCRIPTED for r in RULES)  # scripted: simulated only
    assert markdown_table() in (ROOT / "docs/serve.md").read_text()


def test_ignored_fields_are_named_in_a_header(url: str) -> None:
    body = {"prompt": "hi", "max_tokens": 3, "stop": ["\n"], "best_of": 2,
            "presence_penalty": 0.5, "frequency_penalty": 0, "my_own_field": 1,
            "tools": [{"type": "function", "function": {"name": "f"}}], "temperature": 0.3}
    r = httpx.post(url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 200
    assert set(r.headers["servesim-ignored"].split(",")) == {
        "stop", "best_of", "presence_penalty", "my_own_field", "tools", "temperature"}
    assert r.json()["choices"][0]["text"] == passage(0, 3)  # stop is scripted here
    plain = httpx.post(url + "/v1/completions", timeout=30, json={
        "prompt": "hi", "max_tokens": 2, "frequency_penalty": 0, "logprobs": None,
        "stop": [], "n": 1, "top_k": -1, "user": None})
    assert plain.status_code == 200 and "servesim-ignored" not in plain.headers
    streamed = httpx.post(url + "/v1/completions", timeout=30, json={
        "prompt": "hi", "max_tokens": 2, "stream": True, "user": "me"})
    assert streamed.headers["servesim-ignored"] == "user"


def test_refused_fields_are_400s_naming_them(url: str) -> None:
    c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)
    with pytest.raises(openai.BadRequestError, match="--engine") as err:
        c.completions.create(model="tiny", prompt="x", max_tokens=2, logprobs=2)
    assert err.value.body["param"] == "logprobs"
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        c.chat.completions.create(model="tiny", max_tokens=2, top_logprobs=2,
                                  messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="stream_options"):
        c.completions.create(model="tiny", prompt="x", max_tokens=2,
                             stream_options={"include_usage": True})
    for field, value in (("priority", 3), ("use_beam_search", True), ("cache_salt", "s")):
        r = httpx.post(url + "/v1/completions", timeout=30,
                       json={"prompt": "x", "max_tokens": 2, field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field


def test_n_choices_are_children_admitted_together(url: str) -> None:
    c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)
    done = c.completions.create(model="tiny", prompt="abcdefghij", max_tokens=5, n=3, seed=7)
    assert [ch.index for ch in done.choices] == [0, 1, 2]
    assert [ch.text for ch in done.choices] == [passage(7 + i, 5) for i in range(3)]
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (10, 15)

    async def stream() -> dict[int, str]:
        ac = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                                timeout=30)
        texts: dict[int, str] = {}
        async for chunk in await ac.chat.completions.create(
                model="tiny", max_tokens=4, n=2, stream=True,
                messages=[{"role": "user", "content": "yo"}]):
            for ch in chunk.choices:
                texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
        return texts

    assert asyncio.run(stream()) == {0: passage(0, 4), 1: passage(1, 4)}


def test_stream_options_are_vllms(url: str) -> None:
    body = {"prompt": "hi", "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True,
                               "whatever": 1}}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
        assert r.headers["servesim-ignored"] == "stream_options.whatever"
        events = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: {")]
    assert [e["usage"]["completion_tokens"] for e in events] == [1, 2, 3, 3]
    assert events[-1]["choices"] == []


def test_request_ids_are_vllms(url: str) -> None:
    body = {"prompt": "x", "max_tokens": 1, "request_id": "mine"}
    assert httpx.post(url + "/v1/completions", json=body, timeout=30).json()["id"] == \
        "cmpl-mine"
    r = httpx.post(url + "/v1/chat/completions", timeout=30, headers={"X-Request-Id": "hdr"},
                   json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
                         "request_id": "mine"})
    assert r.json()["id"] == "chatcmpl-hdr"


def test_echo_puts_the_prompt_first(url: str) -> None:
    c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)
    assert c.completions.create(model="tiny", prompt="Hi! ", max_tokens=3,
                                echo=True).choices[0].text == "Hi! " + passage(0, 3)
    pieces = [ch.choices[0].text for ch in c.completions.create(
        model="tiny", prompt=[72, 105], max_tokens=2, echo=True, stream=True)]
    assert "".join(pieces) == "Hi" + passage(0, 2) and len(pieces) == 2


def test_the_api_key_from_flag_or_environment() -> None:
    assert api_key_of("a", {"VLLM_API_KEY": "b", "SERVESIM_API_KEY": "c"}) == "a"
    assert api_key_of(None, {"VLLM_API_KEY": "b", "SERVESIM_API_KEY": "c"}) == "b"
    assert api_key_of(None, {"SERVESIM_API_KEY": "c"}) == "c"
    assert api_key_of(None, {"VLLM_API_KEY": ""}) is None
    assert key_matches("bearer k3y", "k3y") and key_matches("BEARER k3y", "k3y")
    assert not key_matches("Bearer  k3y", "k3y")  # as vLLM: the rest of the header is the key
    assert not key_matches("Basic k3y", "k3y") and not key_matches("Bearer k3", "k3y")
    assert not key_matches(None, "k3y") and not key_matches("Bearer \udcff", "k3y")
    assert needs_key("GET", "/v1/models") and not needs_key("OPTIONS", "/v1/models")
    assert not needs_key("GET", "/metrics") and not needs_key("GET", "/health")
    s = simulated_served(scenario(), load_tokenizer("byte"), api_key="k3y")
    with BackgroundServer(s) as base:
        for headers, status in (({}, 401), ({"Authorization": "bearer k3y"}, 200),
                                ({"Authorization": "Bearer nope"}, 401)):
            r = httpx.get(base + "/v1/models", headers=headers, timeout=30)
            assert r.status_code == status
            if status == 401:
                assert r.json()["error"]["code"] == 401
        assert httpx.get(base + "/metrics", timeout=30).status_code == 200
        assert httpx.options(base + "/v1/models", timeout=30).status_code != 401
        assert httpx.get(base + "/health", timeout=30).status_code == 200
        assert httpx.post(base + "/v1/completions", json={"prompt": "x"},
                          timeout=30).status_code == 401


def test_the_engine_honours_stop_strings_and_token_ids() -> None:
    pytest.importorskip("torch")
    from test_engine_loop import scenario as engine_scenario

    from sim.cli.serve_engine import build_engine_stepper
    from sim.serve.app import ServedModel
    from sim.serve.loop import ServeLoop
    from sim.serve.server import Served

    sc = engine_scenario()
    tok = load_tokenizer("byte")
    stepper, budget, max_len = build_engine_stepper(sc, tok)
    loop = ServeLoop(stepper, tok, max_model_len=max_len)
    served = Served(loop, ServedModel("tiny", max_len, None, "engine"), sc, budget, "engine")
    with BackgroundServer(served) as base:
        def complete(**extra: object) -> dict:
            r = httpx.post(base + "/v1/completions", timeout=60, json={
                "prompt": "abc", "max_tokens": 12, "temperature": 0, **extra})
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]

        free = complete()["text"]  # greedy: the same text every time
        # a character the model says after its first one, in one byte token (ASCII)
        at = next(i for i, ch in enumerate(free) if i > 0 and ord(ch) < 128)
        stop = free[at]
        first = free.index(stop)
        stopped = complete(stop=[stop])
        assert stopped == {"index": 0, "text": free[:first], "logprobs": None,
                           "finish_reason": "stop"}
        kept = complete(stop=stop, include_stop_str_in_output=True)
        assert kept["text"] == free[:first + 1] and kept["finish_reason"] == "stop"
        by_id = complete(stop_token_ids=[ord(stop)])
        assert by_id["text"] == free[:first] and by_id["finish_reason"] == "stop"
        late = complete(stop=[stop], min_tokens=first + 2)  # not checked before min_tokens
        assert late["text"].startswith(free[:first + 1])
        forced = complete(logit_bias={"120": 100})  # the bias outweighs any logit
        assert forced["text"] == "x" * 12
        fresh = complete(frequency_penalty=2.0, logit_bias={"120": 3})
        assert fresh["text"] != forced["text"]
        scored = complete(logprobs=3)
        lp = scored["logprobs"]
        assert scored["text"] == free and len(lp["token_logprobs"]) == 12
        for chosen, top in zip(lp["token_logprobs"], lp["top_logprobs"], strict=True):
            assert chosen <= 0 and 1 <= len(top) <= 3  # (byte tokens may share a string)
            assert all(v <= chosen + 1e-6 for v in top.values())  # greedy took the best
        c = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=60)
        contents = [ch.choices[0].logprobs.content for ch in c.chat.completions.create(
            model="tiny", max_tokens=4, temperature=0, stream=True, logprobs=True,
            top_logprobs=2, messages=[{"role": "user", "content": "hi"}])]
        assert len(contents) == 4 and all(len(x) == 1 and len(x[0].top_logprobs) == 2
                                          for x in contents)
        assert all(x[0].logprob == pytest.approx(x[0].top_logprobs[0].logprob)
                   and x[0].top_logprobs[0].logprob >= x[0].top_logprobs[1].logprob
                   for x in contents)
        assert httpx.post(base + "/v1/completions", timeout=60, json={
            "prompt": "abc", "max_tokens": 3, "logprobs": 2, "echo": True}).status_code == 400
        refused = httpx.post(base + "/v1/completions", timeout=60, json={
            "prompt": "abc", "max_tokens": 3, "min_p": 0.5})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "min_p"
        assert "not served by the engine backend" in refused.json()["error"]["message"]
        assert "servesim-ignored" not in httpx.post(base + "/v1/completions", timeout=60, json={
            "prompt": "abc", "max_tokens": 3, "stop": ["zz"], "temperature": 0.5,
            "seed": 1}).headers
    assert stepper.kv.num_used_blocks == 0  # the stopped requests were freed
