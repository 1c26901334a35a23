"""The HTTP face: OpenAI's routes over a ServeLoop, on aiohttp.

Why aiohttp: one well-kept package is both this server and the load
generator's client (sim.serve.load), and it cancels a handler whose client
went away (`handler_cancellation`), which is where an abort comes from.
Every fault a request can have becomes OpenAI's error JSON with its status;
an unexpected one is a 500 for that request only. The response bodies are
sim.serve.responses', the API-key rule sim.serve.auth's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from aiohttp import web

from sim.core.request import RequestState
from sim.serve.api import parse_generation
from sim.serve.auth import key_matches, needs_key
from sim.serve.body import ApiError, parse_body
from sim.serve.loop import ServeLoop
from sim.serve.metrics import Gauges
from sim.serve.responses import stream_response, whole_response
from sim.serve.simulated import default_output_tokens
from sim.serve.streams import Ended

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class ServedModel:
    """What the routes need besides the loop: the name, the context, the key, the backend."""

    name: str
    max_model_len: int
    api_key: str | None = None
    backend: str = "simulated"  # or "engine": which column of sim.serve.fields answers


def _error(err: ApiError) -> web.Response:
    return web.json_response(err.body(), status=err.status)


def build_app(loop: ServeLoop, model: ServedModel) -> web.Application:
    """The application; the caller runs `loop.run()` beside it."""

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        if model.api_key is not None and needs_key(request.method, request.path) and \
                not key_matches(request.headers.get("Authorization"), model.api_key):
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
            return _error(ApiError(500, f"internal error: {type(err).__name__}",
                                   type="InternalServerError"))

    async def health(_request: web.Request) -> web.Response:
        return web.Response()

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": model.name, "object": "model", "created": int(time.time()),
            "owned_by": "servesim", "root": model.name, "max_model_len": model.max_model_len}]})

    async def metrics(_request: web.Request) -> web.Response:
        text = loop.metrics.text(model.name, scrape(loop))
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


def scrape(loop: ServeLoop) -> Gauges:
    """The gauges of this instant: the scheduler's queues and the pool's use."""
    stepper = loop.stepper
    sched, kv = stepper.scheduler, stepper.kv
    usable = kv.num_usable_blocks
    return Gauges(sched.num_running, sched.num_waiting,
                  sched.kv_blocks_used / usable if usable else 0.0,
                  {"block_size": str(kv.block_size), "num_gpu_blocks": str(usable),
                   "enable_prefix_caching": str(bool(kv.enable_prefix_cache)),
                   "num_cpu_blocks": "None"})


async def _generate(request: web.Request, loop: ServeLoop, model: ServedModel, chat: bool
                    ) -> web.StreamResponse:
    arrived_s = loop.now()  # the request's headers are in: the client's wait starts here
    body = parse_body(await request.read())
    generation = parse_generation(body, chat, loop.tokenizer, model.name, model.max_model_len,
                                  model.backend)
    header_id = request.headers.get("X-Request-Id")  # vLLM's id: the header, else the body's
    if header_id:
        generation = replace(generation, request_id=header_id)
    refuses = getattr(loop.stepper, "refuses", None)  # a backend's own limits
    field = refuses(generation) if refuses is not None else None
    if field is not None:
        raise ApiError(400, f"{field}: not honoured by the engine backend with speculative "
                            "decoding (its verification samples without it)", param=field)
    group = loop.submit(generation, default_output_tokens(generation, model.max_model_len),
                        arrived_s)
    headers = {"servesim-ignored": ",".join(generation.ignored)} if generation.ignored else {}
    ended = False
    try:
        first = await group.queue.get()
        if isinstance(first, Ended) and first.error is not None:
            ended = True
            loop.abort(group.request_ids)  # its siblings, if any
            if first.request.state is RequestState.REJECTED:  # the scheduler can never run it
                raise ApiError(400, f"request refused: {first.error}")
            raise ApiError(503, f"request ended early: {first.error}", type="ServiceUnavailable")
        if generation.stream:
            response = await stream_response(request, group, first, generation, model.name, headers,
                                  loop.tokenizer)
        else:
            response = await whole_response(group, first, generation, model.name, headers,
                                    loop.tokenizer)
        ended = True
        return response
    finally:
        if not ended:  # the client went away (cancelled) or writing failed: free its KV
            loop.abort(group.request_ids)
