"""`servesim serve --replicas N`: N servers on consecutive ports, and an optional front port.

Why: a router or gateway under test needs a fleet to route across. Each
replica is a whole server of its own, as N vLLM processes would be: its own
scheduler, KV pool and clock, its own /metrics, its own KV-event endpoint (the
port offset by the replica's index, as vLLM offsets it by the data-parallel
rank). They share one event loop, and a step only ever waits on its own
replica's clock, so one replica's load never delays another's tokens.

For users who have no router of their own, `--router-port` adds a front that
picks a replica for each request with the scenario's router policy (the
simulator's own policies, sim.world.router, reading each replica's queue, KV
use and cached prefix at the arrival) and relays the request and its stream.
"""

from __future__ import annotations

import asyncio
import re
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import aiohttp
import numpy as np
from aiohttp import web

from sim.core.request import Request
from sim.serve.body import ApiError, parse_body
from sim.serve.kv_events import KVEventsConfig
from sim.serve.loop import ServeLoop
from sim.serve.request_fields import chat_prompt
from sim.serve.server import Served, Server
from sim.world.router import Router


def offset_endpoint(endpoint: str, index: int) -> str:
    """A tcp endpoint's port plus `index` (vLLM's rule for data-parallel ranks); other
    transports get `-index` appended to their path."""
    if index == 0:
        return endpoint
    match = re.match(r"^(tcp://.*:)(\d+)$", endpoint)
    if match:
        return f"{match.group(1)}{int(match.group(2)) + index}"
    return f"{endpoint}-{index}"


def replica_events(config: KVEventsConfig | None, index: int) -> KVEventsConfig | None:
    return None if config is None else replace(config,
                                               endpoint=offset_endpoint(config.endpoint, index))


@dataclass(frozen=True, slots=True)
class LoopView:
    """A replica as a router sees it (sim.world.router.ReplicaView), read live."""

    loop: ServeLoop

    @property
    def num_outstanding(self) -> int:
        sched = self.loop.stepper.scheduler
        return sched.num_running + sched.num_waiting + self.loop.num_arrived

    @property
    def kv_load(self) -> float:
        stepper = self.loop.stepper
        usable = stepper.kv.num_usable_blocks
        return stepper.scheduler.kv_blocks_used / usable if usable else 0.0

    def cached_prefix_tokens(self, request: Request) -> int:
        return self.loop.stepper.kv.cached_prefix_tokens(request)


def routing_request(body: object, chat: bool, loop: ServeLoop) -> Request:
    """The request a router reads: its prompt's token ids (for prefix-aware routing)."""
    ids: list[int] = []
    if isinstance(body, dict):
        try:
            if chat:
                ids = loop.tokenizer.encode(chat_prompt(body.get("messages")))
            elif isinstance(body.get("prompt"), str):
                ids = loop.tokenizer.encode(body["prompt"])
            elif isinstance(body.get("prompt"), list) and all(
                    isinstance(t, int) and not isinstance(t, bool) for t in body["prompt"]):
                ids = list(body["prompt"])
        except (ApiError, UnicodeEncodeError):
            ids = []
    return Request(-1, 0.0, max(1, len(ids)), 1, prompt_token_ids=tuple(ids) or None)


def build_front(replicas: Sequence[tuple[Served, str]], router: Router, seed: int
                ) -> web.Application:
    """The front port's app: /v1 requests go to the replica the router picks; /health is
    the front's own; anything else (models, metrics) is replica 0's."""
    views = [LoopView(served.loop) for served, _ in replicas]
    rng = np.random.default_rng([seed, 0x46524F4E54])  # "FRONT"
    session: list[aiohttp.ClientSession] = []

    async def relay(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        chat = request.path.endswith("/chat/completions")
        target = 0
        if request.method == "POST" and request.path.startswith("/v1/"):
            try:
                body = parse_body(raw)
            except ApiError as err:
                return web.json_response(err.body(), status=err.status)
            target = router.choose(routing_request(body, chat, replicas[0][0].loop), views, rng)
        if not session:
            session.append(aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)))
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() in ("authorization", "content-type", "accept")}
        async with session[0].request(request.method, replicas[target][1] + request.path_qs,
                                      data=raw, headers=headers) as upstream:
            response = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items()
                if k.lower() in ("content-type", "servesim-ignored", "cache-control")})
            response.headers["servesim-replica"] = str(target)
            await response.prepare(request)
            async for piece in upstream.content.iter_any():
                await response.write(piece)
            await response.write_eof()
            return response

    async def health(_request: web.Request) -> web.Response:
        return web.Response()

    async def close(_app: web.Application) -> None:
        if session:
            await session[0].close()

    app = web.Application(client_max_size=64 * 2**20)
    app.on_cleanup.append(close)
    app.add_routes([web.get("/health", health), web.route("*", "/{tail:.*}", relay)])
    return app


class Fleet:
    """N Servers (and a front) on one event loop: `start()` binds them all."""

    def __init__(self, served: Sequence[Served], host: str, port: int,
                 router: Router | None = None, front_port: int | None = None,
                 seed: int = 0) -> None:
        self.servers = [Server(s, host, port + i if port else 0) for i, s in enumerate(served)]
        self.host, self.router, self.front_port, self.seed = host, router, front_port, seed
        self._front: web.AppRunner | None = None

    async def start(self) -> list[int]:
        """Bind every replica (then the front); returns their ports, the front's last."""
        ports = [await server.start() for server in self.servers]
        if self.router is not None and self.front_port is not None:
            urls = [(s.served, f"http://{self.host}:{p}") for s, p in zip(self.servers, ports,
                                                                        strict=True)]
            self._front = web.AppRunner(build_front(urls, self.router, self.seed),
                                        access_log=None, handler_cancellation=True)
            await self._front.setup()
            site = web.TCPSite(self._front, self.host, self.front_port)
            await site.start()
            sockets = site._server.sockets if site._server is not None else []  # noqa: SLF001
            ports.append(sockets[0].getsockname()[1] if sockets else self.front_port)
        return ports

    async def stop(self) -> None:
        if self._front is not None:
            await self._front.cleanup()
        await asyncio.gather(*(server.stop() for server in self.servers))


def serve_fleet_forever(fleet: Fleet, on_ready: Callable[[list[int]], None] | None = None
                        ) -> Fleet:
    """Serve until Ctrl-C (SIGINT) or SIGTERM, as sim.serve.server.serve_forever does for
    one server; returns the stopped fleet."""

    async def main() -> None:
        ports = await fleet.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if on_ready is not None:
            on_ready(ports)
        try:
            await stop.wait()
        finally:
            await fleet.stop()

    asyncio.run(main())
    return fleet


class BackgroundFleet:
    """A Fleet on its own thread and event loop: `with BackgroundFleet(fleet) as urls:`
    (the replicas' base URLs, the front's last when it has one)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> list[str]:
        self._thread.start()
        ports = asyncio.run_coroutine_threadsafe(self.fleet.start(), self._loop).result(30)
        return [f"http://{self.fleet.host}:{p}" for p in ports]

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.fleet.stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()
