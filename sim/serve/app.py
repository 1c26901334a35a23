"""The HTTP face: OpenAI's routes over a ServeLoop, on aiohttp.

Why aiohttp: one well-kept package is both this server and the load
generator's client (sim.serve.load), and it cancels a handler whose client
went away (`handler_cancellation`), which is where an abort comes from.
Every fault a request can have becomes OpenAI's error JSON with its status;
an unexpected one is a 500 for that request only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from sim.core.request import RequestState
from sim.serve.api import ApiError, Generation, parse_generation
from sim.serve.loop import Chunk, Ended, ServeLoop, Stream
from sim.serve.simulated import default_output_tokens

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class ServedModel:
    """What the routes need besides the loop: the name, the context, the key."""

    name: str
    max_model_len: int
    api_key: str | None = None


def _error(err: ApiError) -> web.Response:
    return web.json_response(err.body(), status=err.status)


def build_app(loop: ServeLoop, model: ServedModel) -> web.Application:
    """The application; the caller runs `loop.run()` beside it."""

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        if model.api_key is not None and request.path.startswith("/v1/") and \
                request.headers.get("Authorization") != f"Bearer {model.api_key}":
            return _error(ApiError(401, "a valid API key is needed: Authorization: Bearer KEY",
                                   type="AuthenticationError"))
        try:
            return await handler(request)
        except ApiError as err:
            return _error(err)
        except web.HTTPException as err:  # no such route, wrong method: still OpenAI's JSON
            if err.status < 400:
                raise
            return _error(ApiError(err.status, f"{request.method} {request.path}: {err.reason}",
                                   type="NotFoundError" if err.status == 404 else
                                   "invalid_request_error"))
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as err:  # noqa: BLE001 - one request fails, never the server
            return _error(ApiError(500, f"internal error: {type(err).__name__}: {err}",
                                   type="InternalServerError"))

    async def health(_request: web.Request) -> web.Response:
        return web.Response()

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": model.name, "object": "model", "created": int(time.time()),
            "owned_by": "servesim", "root": model.name, "max_model_len": model.max_model_len}]})

    async def metrics(_request: web.Request) -> web.Response:
        sched, usable = loop.stepper.scheduler, loop.stepper.kv.num_usable_blocks
        usage = sched.kv_blocks_used / usable if usable else 0.0
        text = loop.metrics.text(model.name, sched.num_running, sched.num_waiting, usage)
        return web.Response(text=text, content_type="text/plain",
                            headers={"X-Content-Format": "0.0.4"})

    async def completions(request: web.Request) -> web.StreamResponse:
        return await _generate(request, loop, model, chat=False)

    async def chat(request: web.Request) -> web.StreamResponse:
        return await _generate(request, loop, model, chat=True)

    app = web.Application(middlewares=[errors], client_max_size=64 * 2**20)
    app.add_routes([web.get("/health", health), web.get("/v1/models", models),
                    web.get("/metrics", metrics), web.post("/v1/completions", completions),
                    web.post("/v1/chat/completions", chat)])
    return app


async def _generate(request: web.Request, loop: ServeLoop, model: ServedModel, chat: bool
                    ) -> web.StreamResponse:
    arrived_s = loop.now()  # the request's headers are in: the client's wait starts here
    try:
        body = await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ApiError(400, f"the request body is not valid JSON: {err}") from None
    generation = parse_generation(body, chat, loop.tokenizer, model.name, model.max_model_len)
    stream = loop.submit(generation, default_output_tokens(generation, model.max_model_len),
                         arrived_s)
    ended = False
    try:
        first = await stream.queue.get()
        if isinstance(first, Ended) and first.error is not None:
            ended = True
            if first.request.state is RequestState.REJECTED:  # the scheduler can never run it
                raise ApiError(400, f"request refused: {first.error}")
            raise ApiError(503, f"request ended early: {first.error}", type="ServiceUnavailable")
        if generation.stream:
            response = await _sse(request, stream, first, generation, model.name)
        else:
            response = await _whole(stream, first, generation, model.name)
        ended = True
        return response
    finally:
        if not ended:  # the client went away (cancelled) or writing failed: free its KV
            loop.abort(stream.request.request_id)


def _usage(stream: Stream, emitted: int) -> dict[str, int]:
    prompt = stream.request.prompt_tokens
    return {"prompt_tokens": prompt, "completion_tokens": emitted,
            "total_tokens": prompt + emitted}


def _choice(chat: bool, text: str, finish: str | None, first: bool) -> dict[str, Any]:
    if not chat:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    delta: dict[str, Any] = {"content": text}
    if first:
        delta["role"] = "assistant"
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}


async def _sse(request: web.Request, stream: Stream, first: Chunk | Ended,
               generation: Generation, model: str) -> web.StreamResponse:
    """Server-sent events, one per token, OpenAI's chunk format, then `data: [DONE]`."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
    await response.prepare(request)
    chat = generation.chat
    head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{stream.request.request_id}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()), "model": model}

    async def send(payload: dict[str, Any]) -> None:
        await response.write(b"data: " + json.dumps({**head, **payload}).encode() + b"\n\n")

    emitted, item = 0, first
    while True:
        if isinstance(item, Ended):
            if item.error is not None:  # shut down or aborted mid-stream
                await send({"choices": [_choice(chat, "", "abort", emitted == 0)]})
            break
        emitted += 1
        await send({"choices": [_choice(chat, item.text, "length" if item.finished else None,
                                        emitted == 1)]})
        item = await stream.queue.get()
    if generation.include_usage:
        await send({"choices": [], "usage": _usage(stream, emitted)})
    await response.write(b"data: [DONE]\n\n")
    with contextlib.suppress(ConnectionResetError):
        await response.write_eof()
    return response


async def _whole(stream: Stream, first: Chunk | Ended, generation: Generation, model: str
                 ) -> web.Response:
    """The whole completion in one JSON body, when the client did not ask for a stream."""
    pieces, item = [], first
    while isinstance(item, Chunk):
        pieces.append(item.text)
        item = await stream.queue.get()
    if item.error is not None:
        raise ApiError(503, f"request ended early: {item.error}", type="ServiceUnavailable")
    text, chat = "".join(pieces), generation.chat
    choice: dict[str, Any] = ({"index": 0, "message": {"role": "assistant", "content": text},
                               "logprobs": None, "finish_reason": "length"} if chat else
                              {"index": 0, "text": text, "logprobs": None,
                               "finish_reason": "length"})
    return web.json_response({
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{stream.request.request_id}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()), "model": model, "choices": [choice],
        "usage": _usage(stream, len(pieces))})
