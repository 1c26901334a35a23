"""`servesim load URL SCENARIO`: a scenario's workload replayed against an OpenAI-compatible server.

Each request of the workload (make_requests: arrivals or a trace's times,
prompt and output lengths) is sent at its arrival time, streaming, with
`max_tokens` = its output length and vLLM's `ignore_eos` (and `min_tokens`)
so output lengths stay scripted. Completions get the prompt as token ids,
exactly `prompt_tokens` of them (the trace's own ids, or a fixed passage in the
given tokenizer), so the server counts what the scenario says; chat gets
their text.

Measured on the client, by vLLM's benchmark formulas: TTFT from sending to the
first content chunk, ITL every gap between chunks, TPOT = (E2EL - TTFT) /
(output - 1), E2EL from sending to the last byte. The output tokens are the
server's usage count (else the chunks seen). The result is a RunRecorder of
the measured requests, so the files are `servesim run`'s.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import aiohttp
import numpy as np

from sim.core.request import Request, RequestState
from sim.results.record.recorder import RunRecorder
from sim.results.stats.percentiles import describe_ms
from sim.serve.simulated import PASSAGE
from sim.text.base import Tokenizer


class LoadError(RuntimeError):
    """The target cannot be used at all (unreachable, no model): one line for the user."""


@dataclass(slots=True, eq=False)
class Measured:
    """One request as the client saw it; times in seconds since the run began."""

    request_id: int
    prompt_tokens: int
    max_tokens: int
    send_s: float = 0.0
    due_s: float = 0.0  # its arrival time; it waits for a slot until send_s (max concurrency)
    chunk_s: list[float] = field(default_factory=list)
    finish_s: float = 0.0
    usage_prompt: int | None = None
    usage_completion: int | None = None
    error: str | None = None

    def as_request(self) -> Request:
        """A finished (or rejected) Request with the client's timestamps."""
        output = self.usage_completion or len(self.chunk_s) or self.max_tokens
        req = Request(self.request_id, self.send_s, self.usage_prompt or self.prompt_tokens,
                      max(1, output))
        if self.error is not None or not self.chunk_s:
            req.reject(self.error or "no tokens received", self.finish_s)
            return req
        req.first_scheduled_s = None
        req.first_token_s = self.chunk_s[0]
        req.num_output_done = req.output_tokens
        req.state = RequestState.FINISHED
        req.finish_s = self.finish_s
        return req


def prompt_ids(request: Request, passage: Sequence[int]) -> list[int]:
    """Exactly `prompt_tokens` ids: the trace's own, else the passage repeated."""
    if request.prompt_token_ids is not None and len(request.prompt_token_ids) == \
            request.prompt_tokens:
        return list(request.prompt_token_ids)
    return [passage[i % len(passage)] for i in range(request.prompt_tokens)]


def request_body(request: Request, model: str, chat: bool, passage: Sequence[int],
                 tokenizer: Tokenizer) -> dict:
    ids = prompt_ids(request, passage)
    body: dict = {"model": model, "max_tokens": request.output_tokens,
                  "min_tokens": request.output_tokens, "ignore_eos": True, "temperature": 0.0,
                  "stream": True, "stream_options": {"include_usage": True}}
    if chat:
        body["messages"] = [{"role": "user", "content": tokenizer.decode(ids)}]
    else:
        body["prompt"] = ids
    return body


async def _one(http: aiohttp.ClientSession, url: str, body: dict, m: Measured, t0: float,
               chat: bool) -> None:
    m.send_s = time.perf_counter() - t0
    try:
        async with http.post(url, json=body) as resp:
            if resp.status != 200:
                text = (await resp.text())[:300]
                m.error = f"HTTP {resp.status}: {text}"
                return
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                event = json.loads(data)
                now_s = time.perf_counter() - t0
                usage = event.get("usage")
                if usage:
                    m.usage_prompt = usage.get("prompt_tokens")
                    m.usage_completion = usage.get("completion_tokens")
                for choice in event.get("choices") or ():
                    piece = (choice.get("delta") or {}).get("content") if chat else \
                        choice.get("text")
                    if piece:  # a role-only or closing chunk carries no token
                        m.chunk_s.append(now_s)
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as err:
        m.error = f"{type(err).__name__}: {err}"
    finally:
        m.finish_s = time.perf_counter() - t0


async def _replay(base_url: str, requests: Iterable[Request], model: str, chat: bool,
                  tokenizer: Tokenizer, api_key: str | None, max_concurrency: int | None,
                  on_done: Callable[[int], None] | None) -> list[Measured]:
    passage = tokenizer.encode(PASSAGE)
    url = base_url.rstrip("/") + ("/v1/chat/completions" if chat else "/v1/completions")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    connector = aiohttp.TCPConnector(limit=max_concurrency or 0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    measured: list[Measured] = []
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    async with aiohttp.ClientSession(headers=headers, connector=connector,
                                     timeout=timeout) as http:
        t0 = time.perf_counter()
        tasks = []

        async def send(req: Request, m: Measured) -> None:
            if gate is None:
                await _one(http, url, request_body(req, model, chat, passage, tokenizer), m, t0,
                           chat)
            else:
                async with gate:
                    await _one(http, url, request_body(req, model, chat, passage, tokenizer),
                               m, t0, chat)
            if on_done is not None:
                on_done(1)

        for req in requests:
            wait_s = req.arrival_s - (time.perf_counter() - t0)
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            m = Measured(req.request_id, req.prompt_tokens, req.output_tokens,
                         due_s=time.perf_counter() - t0)
            measured.append(m)
            tasks.append(asyncio.create_task(send(req, m)))
        await asyncio.gather(*tasks)
    return measured


async def served_model(base_url: str, api_key: str | None) -> str:
    """The first model the server lists at /v1/models."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with aiohttp.ClientSession(headers=headers) as http, \
                http.get(base_url.rstrip("/") + "/v1/models",
                         timeout=aiohttp.ClientTimeout(total=30)) as resp:
            body = await resp.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as err:
        raise LoadError(f"{base_url}: cannot list models: {err}") from None
    data = body.get("data") if isinstance(body, dict) else None
    if not data:
        raise LoadError(f"{base_url}/v1/models: no model listed ({str(body)[:200]})")
    return str(data[0]["id"])


def run_load(base_url: str, requests: Iterable[Request], tokenizer: Tokenizer,
             model: str | None = None, chat: bool = False, api_key: str | None = None,
             max_concurrency: int | None = None,
             on_done: Callable[[int], None] | None = None) -> tuple[RunRecorder, list[Measured]]:
    """Replay `requests` (arrival order) against `base_url`; the measured requests recorded."""

    async def main() -> list[Measured]:
        name = model or await served_model(base_url, api_key)
        return await _replay(base_url, requests, name, chat, tokenizer, api_key,
                             max_concurrency, on_done)

    measured = asyncio.run(main())
    recorder = RunRecorder()
    for m in measured:
        req = m.as_request()
        if req.state is RequestState.FINISHED:
            recorder.record_finished(req)
        else:
            recorder.record_rejected(req)
    return recorder, measured


def client_itl_ms(measured: Sequence[Measured]) -> dict[str, float]:
    """ITL statistics (mean, median, p90...) over every gap between chunks, in ms."""
    gaps = [b - a for m in measured if m.error is None
            for a, b in zip(m.chunk_s, m.chunk_s[1:], strict=False)]
    return describe_ms(np.asarray(gaps, dtype=np.float64))


def load_summary(recorder: RunRecorder, measured: Sequence[Measured], url: str
                 ) -> dict:
    """The client's summary: the recorder's vLLM figures with ITL from the chunk gaps."""
    summary = recorder.summary()
    for stat, value in client_itl_ms(measured).items():
        summary[f"{stat}_itl_ms"] = value
    summary["target"] = url
    summary["measured_on"] = "client"
    return summary
