"""`servesim serve`'s simulated backend, driven by real clients (openai, httpx, curl) on localhost.

Nothing here asserts wall-clock speed: plans are compared with a simulation of
the served arrivals, and streaming is checked for order, count and spacing
against the server's own schedule with generous bounds.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from sim.assemble import build_latency, build_replica, kv_budget, synchronous
from sim.config.scenario import Scenario
from sim.core.drive import run_steps
from sim.core.request import ABORTED_REASON, Request
from sim.serve.server import BackgroundServer, Served, simulated_served
from sim.serve.simulated import PASSAGE
from sim.serve.stepper import StepDone
from sim.text import load_tokenizer

openai = pytest.importorskip("openai")

CPU_HW = {"name": "cpu-test", "bf16_flops_per_s": 5e10, "memory_bytes": 2**26,
          "memory_bandwidth_bytes_per_s": 1e10, "interconnect_bandwidth_bytes_per_s": 1e9,
          "host_link_bandwidth_bytes_per_s": 1e9}
MODEL = "tiny"


def scenario(**sections: object) -> Scenario:
    raw: dict = {"name": "serve-test", "model": "tiny", "hardware": {"gpu": CPU_HW},
                 "latency": {"step_overhead_ms": 10.0}, "output": {"plots": False}}
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    return Scenario.model_validate(raw)


def passage_text(seed: int, n: int) -> str:
    """What the byte tokenizer's simulated model says: the passage from `seed`, n tokens."""
    ids = list(PASSAGE.encode())
    return bytes(ids[(seed % len(ids) + i) % len(ids)] for i in range(n)).decode()


@pytest.fixture
def served() -> Iterator[tuple[str, Served]]:
    s = simulated_served(scenario(), load_tokenizer("byte"), api_key=None)
    with BackgroundServer(s) as url:
        yield url, s


def client(url: str, **kw: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=kw.pop("api_key", "none"), max_retries=0,
                         timeout=30.0, **kw)


# -- the official client: completions and chat, streaming and not ----------------

def test_openai_completions_and_chat(served: tuple[str, Served]) -> None:
    url, _ = served
    c = client(url)
    assert [m.id for m in c.models.list()] == [MODEL]

    done = c.completions.create(model=MODEL, prompt="Hello, world", max_tokens=7, seed=3)
    assert done.choices[0].text == passage_text(3, 7)
    assert done.choices[0].finish_reason == "length"
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (12, 7)

    pieces, usage = [], None
    for chunk in c.completions.create(model=MODEL, prompt=[72, 105], max_tokens=9, stream=True,
                                      stream_options={"include_usage": True}):
        if chunk.choices:
            pieces.append(chunk.choices[0].text)
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(pieces) == passage_text(0, 9) and len(pieces) == 9
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (2, 9)

    chat = c.chat.completions.create(model=MODEL, max_tokens=5, seed=10,
                                     messages=[{"role": "user", "content": "hi"}])
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == passage_text(10, 5)
    assert chat.usage.completion_tokens == 5
    assert chat.usage.prompt_tokens == len("user: hi\nassistant:")

    deltas = [ch.choices[0].delta for ch in c.chat.completions.create(
        model=MODEL, max_tokens=6, stream=True, messages=[{"role": "user", "content": "yo"}],
        temperature=0.7, top_p=0.9, extra_body={"top_k": 5, "ignore_eos": True,
                                                "min_tokens": 2})]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == passage_text(0, 6)


def test_bad_requests_get_openai_errors_and_the_server_lives_on(served: tuple[str, Served]
                                                                 ) -> None:
    url, _ = served
    c = client(url)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        c.completions.create(model="gpt-9", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        c.completions.create(model=MODEL, prompt="x", max_tokens=10**6)
    with pytest.raises(openai.BadRequestError, match="context"):
        c.completions.create(model=MODEL, prompt=[1] * 2048, max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        c.completions.create(model=MODEL, prompt="x", max_tokens=2, temperature=-1)
    raw = httpx.post(url + "/v1/completions", content=b"{not json",
                     headers={"Content-Type": "application/json"})
    assert raw.status_code == 400
    assert raw.json()["error"]["type"] == "invalid_request_error"
    assert "not valid JSON" in raw.json()["error"]["message"]
    assert httpx.post(url + "/v1/completions", json=[1, 2]).status_code == 400
    missing = httpx.get(url + "/v1/nothing-here")
    assert missing.status_code == 404 and "error" in missing.json()
    assert httpx.get(url + "/health").status_code == 200
    assert c.completions.create(model=MODEL, prompt="x", max_tokens=2).usage.completion_tokens \
        == 2


def test_api_key_is_required_when_set() -> None:
    s = simulated_served(scenario(), load_tokenizer("byte"), api_key="sekrit")
    with BackgroundServer(s) as url:
        with pytest.raises(openai.AuthenticationError):
            client(url, api_key="wrong").models.list()
        assert [m.id for m in client(url, api_key="sekrit").models.list()] == [MODEL]
        assert httpx.get(url + "/health").status_code == 200  # not under /v1


def test_curl_sees_server_sent_events(served: tuple[str, Served]) -> None:
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("no curl on this machine")
    url, _ = served
    body = json.dumps({"model": MODEL, "prompt": "abc", "max_tokens": 4, "stream": True,
                       "stream_options": {"include_usage": True}})
    out = subprocess.run([curl, "-sN", "--max-time", "20", url + "/v1/completions",
                          "-H", "Content-Type: application/json", "-d", body],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    events = [line for line in out.split("\n") if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert [c["object"] for c in chunks] == ["text_completion"] * 5
    assert "".join(c["choices"][0]["text"] for c in chunks[:4]) == passage_text(0, 4)
    assert [c["choices"][0]["finish_reason"] for c in chunks[:4]] == [None] * 3 + ["length"]
    assert chunks[4]["choices"] == [] and chunks[4]["usage"]["completion_tokens"] == 4
    models = subprocess.run([curl, "-s", url + "/v1/models"], capture_output=True, text=True,
                            timeout=30, check=True).stdout
    assert json.loads(models)["data"][0]["id"] == MODEL


# -- determinism: the served plans are the simulation's -------------------------------

@pytest.mark.parametrize("sections", [
    {"scheduler": {"max_num_seqs": 6, "max_num_batched_tokens": 48},
     "kv": {"num_blocks": 30, "block_size": 8, "prefix_caching": True}},
    {"scheduler": {"policy": "dynamic", "batch_size": 4, "max_wait_ms": 30,
                   "max_model_len": 256}, "kv": {"num_blocks": 200, "block_size": 8}},
], ids=["continuous-tight-kv", "dynamic"])
def test_served_plans_equal_a_simulation_of_the_served_arrivals(sections: dict) -> None:
    sc = scenario(**sections)
    steps: list[StepDone] = []
    s = simulated_served(sc, load_tokenizer("byte"), on_step=steps.append)
    added: list[Request] = []
    scheduler = s.loop.stepper.scheduler
    add = scheduler.add

    def spy(request: Request, now: float) -> bool:
        added.append(Request(request.request_id, request.arrival_s, request.prompt_tokens,
                             request.output_tokens, request.prompt_token_ids))
        return add(request, now)

    scheduler.add = spy  # type: ignore[method-assign]
    with BackgroundServer(s) as url:
        c = client(url)

        def one(i: int) -> None:
            time.sleep(0.013 * i + (0.5 if i >= 12 else 0.0))  # mid-step, and after a lull
            c.completions.create(model=MODEL, prompt="shared prefix! " * (1 + i % 3) + str(i),
                                 max_tokens=3 + (7 * i) % 11)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert len(added) == 16
    sc = synchronous(sc)  # the served loop steps its scheduler one step at a time
    kv = build_replica(sc, kv_budget(sc))
    latency = build_latency(sc)
    sim_starts: list[float] = []
    _, plans = run_steps(kv.scheduler, added, step_s=latency.step_time,
                         check=lambda _plan, start_s: sim_starts.append(start_s))
    assert [d.plan for d in steps] == plans
    assert [d.start_s for d in steps] == sim_starts  # float for float
    served_frame = s.loop.recorder.requests_frame().sort_values("request_id")
    assert (served_frame["status"] == "finished").all()
    assert len(plans) > 20
    if sc.scheduler.policy == "continuous":  # arrivals joined running batches
        assert any(p.shape.num_prefills and p.shape.num_decodes for p in plans)
    # idle waits happened (the lull, and dynamic batching's max wait)
    starts = [d.start_s for d in steps]
    ends = [d.start_s + d.duration_s for d in steps]
    assert any(b > a for a, b in zip(ends, starts[1:], strict=False))


# -- streaming: separate chunks, spaced as scheduled -----------------------------------

def test_tokens_stream_as_their_steps_end() -> None:
    k = 10
    sc = scenario(latency={"step_overhead_ms": 40.0})
    steps: list[StepDone] = []
    s = simulated_served(sc, load_tokenizer("byte"), on_step=steps.append)
    with BackgroundServer(s) as url:
        body = {"model": MODEL, "prompt": "x", "max_tokens": k, "stream": True}
        arrivals: list[float] = []
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    arrivals.append(time.perf_counter())
    assert len(arrivals) == k
    scheduled = [d.start_s + d.duration_s for d in steps]
    assert len(scheduled) == k
    span_s = scheduled[-1] - scheduled[0]
    assert span_s > 0.3  # 9 steps of >= 40 ms
    # no burst: the client saw the chunks spread over at least half the scheduled span,
    # and never two scheduled 40 ms apart within a millisecond of each other on average
    assert arrivals[-1] - arrivals[0] >= 0.5 * span_s
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    assert sum(g > 0.01 for g in gaps) >= (k - 1) // 2


# -- 200 concurrent streams ---------------------------------------------------------------

def test_200_concurrent_streams_lose_and_duplicate_nothing() -> None:
    n = 200
    s = simulated_served(scenario(), load_tokenizer("byte"))

    async def one(http: httpx.AsyncClient, url: str, i: int) -> tuple[str, int, int]:
        body = {"model": MODEL, "prompt": f"request {i}", "max_tokens": 4 + i % 13, "seed": i,
                "stream": True, "stream_options": {"include_usage": True}}
        text, chunks, usage = [], 0, -1
        async with http.stream("POST", url + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                if event["choices"]:
                    text.append(event["choices"][0]["text"])
                    chunks += 1
                else:
                    usage = event["usage"]["completion_tokens"]
        return "".join(text), chunks, usage

    async def main(url: str) -> list[tuple[str, int, int]]:
        limits = httpx.Limits(max_connections=n)
        async with httpx.AsyncClient(timeout=60, limits=limits) as http:
            return await asyncio.wait_for(
                asyncio.gather(*(one(http, url, i) for i in range(n))), 120)

    with BackgroundServer(s) as url:
        results = asyncio.run(main(url))
    for i, (text, chunks, usage) in enumerate(results):
        want = 4 + i % 13
        assert (chunks, usage) == (want, want), i
        assert text == passage_text(i, want), i
    frame = s.loop.recorder.requests_frame()
    assert len(frame) == n and (frame["status"] == "finished").all()
    assert (frame["output_tokens"].sort_values().to_numpy() ==
            sorted(4 + i % 13 for i in range(n))).all()
    assert s.loop.stepper.kv.num_used_blocks == 0


# -- a client that goes away ---------------------------------------------------------------

def test_a_disconnected_client_aborts_its_request_and_frees_its_blocks() -> None:
    s = simulated_served(scenario(latency={"step_overhead_ms": 20.0}), load_tokenizer("byte"))
    with BackgroundServer(s) as url:
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 1000, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
            seen = 0
            for line in r.iter_lines():
                seen += line.startswith("data: {")
                if seen == 3:
                    break  # leaving the block closes the connection
        deadline = time.monotonic() + 10
        frame = s.loop.recorder.requests_frame()
        while len(frame) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
            frame = s.loop.recorder.requests_frame()
        metrics = httpx.get(url + "/metrics").text
    assert len(frame) == 1 and frame["rejection_reason"][0] == ABORTED_REASON
    assert s.loop.stepper.kv.num_used_blocks == 0
    assert s.loop.stepper.scheduler.num_running == 0
    # as vLLM 0.32's frontend: an aborted request's state is dropped unrecorded, so it
    # counts in no request_success series and no per-request histogram, but its tokens
    # (TTFT, the gaps between them) were counted as they came out
    label = 'model_name="tiny",engine="0"'
    assert f'vllm:request_success_total{{{label},finished_reason="abort"}} 0.0' in metrics
    assert f'vllm:e2e_request_latency_seconds_count{{{label}}} 0' in metrics
    assert f'vllm:time_to_first_token_seconds_count{{{label}}} 1' in metrics


def test_metrics_use_vllms_names_and_count_what_was_served(served: tuple[str, Served]) -> None:
    url, _ = served
    c = client(url)
    for i in range(3):
        c.completions.create(model=MODEL, prompt="abcd", max_tokens=5 + i)
    text = httpx.get(url + "/metrics").text
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
              for line in text.splitlines() if line and not line.startswith("#")}
    label = '{model_name="tiny",engine="0"}'
    assert values[f"vllm:generation_tokens_total{label}"] == 5 + 6 + 7
    assert values[f"vllm:prompt_tokens_total{label}"] == 12
    assert values[f"vllm:num_requests_running{label}"] == 0
    assert values[f"vllm:num_requests_waiting{label}"] == 0
    assert values[f"vllm:time_to_first_token_seconds_count{label}"] == 3
    assert values[f"vllm:inter_token_latency_seconds_count{label}"] == 4 + 5 + 6
    assert values[f"vllm:e2e_request_latency_seconds_count{label}"] == 3
    assert values[f"vllm:request_time_per_output_token_seconds_count{label}"] == 3
    assert values[f"vllm:request_generation_tokens_sum{label}"] == 5 + 6 + 7
    reasons = '{model_name="tiny",engine="0",finished_reason="length"}'
    assert values[f"vllm:request_success_total{reasons}"] == 3
    for name in ("vllm:kv_cache_usage_perc", "vllm:num_preemptions_total",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
        assert f"{name}{label}" in values
